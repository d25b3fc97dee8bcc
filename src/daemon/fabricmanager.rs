//! The daemon's side of the Fabric Manager log follower ([`crate::source::fabricmanager`]):
//! starts it with the position saved in the state directory, feeds its findings to the engine
//! as kernel-log findings are fed (they are log records too), and saves the position once what
//! was read has been handed over, so a restart neither repeats nor skips a record.

use tokio::sync::mpsc;

use crate::clock::Now;
use crate::config::Config;
use crate::incident::Origin;
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

/// One event into the pipeline. The position it read up to is saved by the flush, once the
/// findings are handed over and durable.
pub(super) fn apply(p: &mut super::pipeline::Pipeline, ev: FmLogEvent) {
    match ev {
        FmLogEvent::Read { findings, pos } => {
            let now = Now::read();
            for f in findings {
                p.feed(f, Origin::Kmsg, now, false);
            }
            p.fm_position = Some(pos);
        }
        FmLogEvent::Note { warn: true, text } => tracing::warn!("{text}"),
        FmLogEvent::Note { warn: false, text } => tracing::info!("{text}"),
    }
}

/// Saves the position (atomically, through the state directory's checked helpers) when it moved.
pub(super) fn save(state: &StateDir, last: &mut Option<LogPosition>, pos: LogPosition) {
    if *last == Some(pos) {
        return;
    }
    match state.save_json(POSITION_FILE, &pos) {
        Ok(()) => *last = Some(pos),
        Err(e) => {
            crate::state::log_write_error(
                "fabricmanager position",
                &format!("saving the Fabric Manager log position: {e:#}"),
            );
        }
    }
}
