//! What the dispatcher's tasks share: the outbox, the per-channel counters and the status file,
//! and the messages from the daemon's handle to the intake.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, watch};

use crate::alert::channel::BuiltChannels;
use crate::alert::config::AlertConfig;
use crate::alert::document::HostGroup;
use crate::alert::error::AlertError;
use crate::alert::input::Alert;
use crate::alert::outbox::Outbox;
use crate::alert::sink::ChannelKind;

/// Subdirectory of the state directory holding the outbox.
pub const OUTBOX_DIR: &str = "alert-outbox";
/// Subdirectory of the state directory holding the full readable reports.
pub const REPORTS_DIR: &str = "alert-reports";
/// File in the state directory holding the latest [`AlertStatus`].
pub use crate::state::ALERT_STATUS_FILE as STATUS_FILE;

/// Reads the status the running daemon keeps in `<state_dir>/alert-status.json`, for
/// `xidwatch status` in another process. `updated_ms` tells how fresh it is.
pub fn read_status(state_dir: &Path) -> Result<AlertStatus, String> {
    let path = state_dir.join(STATUS_FILE);
    // Not a plain read: a FIFO planted here must not hang `xidwatch status`.
    let bytes = crate::state::file::read_bounded(
        &path,
        crate::state::MAX_STATE_FILE,
        crate::state::file::Reader::Visitor,
    )
    .map_err(|e| e.to_string())?
    .ok_or_else(|| format!("{}: No such file or directory", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// One channel's state, for `xidwatch status`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChannelStatus {
    pub name: String,
    pub kind: ChannelKind,
    /// Alerts in the outbox still waiting for this channel.
    pub queued: usize,
    pub delivered_total: u64,
    /// Alerts given up for this channel (permanent failure, too many attempts, too old).
    pub failed_total: u64,
    /// Temporary failures that were retried.
    pub retries_total: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_success_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_failure_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The alert stage's state, for `xidwatch status`. The daemon also keeps it in
/// `<state_dir>/alert-status.json` (see [`read_status`]) for commands run beside it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AlertStatus {
    /// When this snapshot was taken (ms since the epoch).
    pub updated_ms: u64,
    pub channels: Vec<ChannelStatus>,
    /// Alerts in the outbox (waiting for at least one channel).
    pub outbox_count: usize,
    pub outbox_bytes: u64,
    /// Alerts dropped from a full outbox since it was created.
    pub dropped_total: u64,
    /// Alerts accepted into the outbox since start.
    pub accepted_total: u64,
}

pub(super) struct Shared {
    /// When the status file was last written, for [`Shared::write_status_soon`].
    pub(super) status_written: Mutex<Option<std::time::Instant>>,
    /// A write was skipped since: the intake's timer catches up.
    pub(super) status_stale: std::sync::atomic::AtomicBool,
    pub(super) outbox: Mutex<Outbox>,
    pub(super) stats: Mutex<BTreeMap<String, ChannelStatus>>,
    pub(super) accepted_total: Mutex<u64>,
    /// Where the status snapshot is written; the lock keeps writers from racing.
    pub(super) status_path: Mutex<PathBuf>,
}

impl Shared {
    pub(super) fn status(&self) -> AlertStatus {
        let ob = lock(&self.outbox);
        let mut channels: Vec<ChannelStatus> = lock(&self.stats).values().cloned().collect();
        for c in &mut channels {
            c.queued = ob.pending_for(&c.name);
        }
        AlertStatus {
            updated_ms: now_ms(),
            channels,
            outbox_count: ob.len(),
            outbox_bytes: ob.bytes(),
            dropped_total: ob.dropped_total(),
            accepted_total: *lock(&self.accepted_total),
        }
    }

    /// [`Shared::write_status`], at most a few times a second: in a burst the status file is
    /// informational and must not cost a write per alert. The intake writes it again at the end.
    pub(super) fn write_status_soon(&self) {
        {
            let mut last = lock(&self.status_written);
            if last.is_some_and(|t| t.elapsed() < Duration::from_millis(250)) {
                self.status_stale
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                return;
            }
            *last = Some(std::time::Instant::now());
        }
        self.write_status();
    }

    /// Writes the status snapshot (blocking; call from `spawn_blocking`). Best effort: the
    /// snapshot is informational, so a failure is logged and alerting goes on.
    pub(super) fn write_status(&self) {
        let st = self.status();
        let path = lock(&self.status_path);
        let bytes = serde_json::to_vec_pretty(&st).unwrap_or_default();
        if let Err(e) = crate::state::write_atomic(&path, &bytes, crate::state::STATE_FILE_MODE) {
            tracing::debug!("cannot write {}: {e}", path.display());
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not stop alerting: the data is still consistent enough to send.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the dispatcher answers once it holds an alert safely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// Fsynced in the outbox, or wanted by no channel, or dropped by the outbox's policy (and
    /// counted): a crash can no longer lose it.
    Durable,
}

/// What travels from the daemon to the dispatcher, in order.
pub(super) enum Envelope {
    Alert {
        alert: Alert,
        /// Held this long for its runbook's evidence.
        hold: Option<Duration>,
        /// Why it carries no evidence, when it was decided up front.
        note: Option<String>,
        /// Set when this opening page stands for several GPUs (a host page).
        host: Option<Box<HostGroup>>,
        ack: Option<oneshot::Sender<Ack>>,
    },
    /// The evidence of an alert handed over earlier with a hold.
    Evidence(Alert),
    /// A runbook that will not report (it was stopped): send the held alert as it is.
    Release { id: String, note: String },
    Reconfigure {
        cfg: Box<AlertConfig>,
        built: BuiltChannels,
        reply: oneshot::Sender<Result<Vec<String>, AlertError>>,
    },
}

/// The wall clock the dispatcher stamps and schedules retries by ([`crate::clock::wall_ms`]).
pub(crate) fn now_ms() -> u64 {
    crate::clock::wall_ms().saturating_add(test_clock::advanced_ms())
}

/// The monotonic clock the dispatcher decides holds and rate limits by
/// ([`crate::clock::mono_ms`]).
pub(super) fn mono_ms() -> u64 {
    crate::clock::mono_ms().saturating_add(test_clock::advanced_ms())
}

/// Resolves when shutdown is asked for (or its sender is gone).
pub(super) async fn shutdown_requested(rx: &mut watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// In this crate's unit tests, both clocks also move with tokio's paused clock, so a test of
/// backoffs, holds and rate limits sees minutes pass without waiting for them. Elsewhere
/// nothing is added: the daemon and the integration tests read the real clocks.
#[cfg(not(test))]
mod test_clock {
    pub(super) fn advanced_ms() -> u64 {
        0
    }
}

#[cfg(test)]
mod test_clock {
    thread_local! {
        /// Per test thread (each `#[tokio::test]` has its own): tokio's clock and the real one
        /// at the first reading, and how far tokio's ran ahead of the real one since.
        static BASE: std::cell::Cell<Option<(tokio::time::Instant, std::time::Instant)>> =
            const { std::cell::Cell::new(None) };
    }

    pub(super) fn advanced_ms() -> u64 {
        let (tokio_now, real_now) = (tokio::time::Instant::now(), std::time::Instant::now());
        let (tokio_base, real_base) = BASE.with(|b| match b.get() {
            Some(base) => base,
            None => {
                b.set(Some((tokio_now, real_now)));
                (tokio_now, real_now)
            }
        });
        let virtual_elapsed = tokio_now.saturating_duration_since(tokio_base);
        let real_elapsed = real_now.saturating_duration_since(real_base);
        u64::try_from(virtual_elapsed.saturating_sub(real_elapsed).as_millis()).unwrap_or(u64::MAX)
    }
}
