//! The daemon's side of the Fabric Manager log follower ([`crate::source::fabricmanager`]):
//! starts it with the position saved in the state directory. The pipeline feeds its findings to
//! the engine as kernel-log findings are fed (they are log records too, `Pipeline::apply_fabric_log`)
//! and saves the position once what was read has been handed over, so a restart neither repeats
//! nor skips a record.

use tokio::sync::mpsc;

use crate::config::Config;
use crate::source::fabricmanager::{spawn, FmLogEvent, LogPosition, POSITION_FILE};
use crate::state::StateDir;

/// Starts the follower when `[fabricmanager] enabled`; without it the receiver never yields
/// (its sender is kept in the returned pair).
pub(super) fn start(
    cfg: &Config,
    state: &StateDir,
) -> (mpsc::Receiver<FmLogEvent>, Option<mpsc::Sender<FmLogEvent>>) {
    let (tx, rx) = mpsc::channel(64);
    let fm = &cfg.fabricmanager;
    if !fm.enabled {
        tracing::info!("Fabric Manager log: not followed ([fabricmanager] enabled = false)");
        return (rx, Some(tx));
    }
    // A corrupt or refused position file is said and read as none: the follower then starts at
    // the file's end, as on a first start.
    let saved = state
        .load_json::<LogPosition>(POSITION_FILE)
        .unwrap_or_else(|e| {
            tracing::warn!("Fabric Manager log: {e:#}; starting at the end of the file");
            None
        });
    if let Err(e) = spawn(fm, saved, tx.clone()) {
        tracing::warn!("Fabric Manager log: cannot start its reader: {e}");
        return (rx, Some(tx));
    }
    (rx, None)
}
