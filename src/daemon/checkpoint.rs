//! The daemon's checkpoint: what survives a crash, and when it may be written.
//!
//! The promise it keeps: the kernel log position (and the open incidents saved with it) never
//! moves past an alert that exists only in memory. Every alert handed to the alert stage comes
//! back with an acknowledgement once it is fsynced in the outbox ([`Acks`]); while one is
//! missing, nothing is written, so a crash re-reads the records behind it and raises the same
//! incident (same id) again. Once all are in, the checkpoint is written promptly after an alert
//! (a crash then re-sends little) but at most every [`SAVE_GAP`], since the snapshot grows with
//! the open incidents. [`decide`] is that rule on plain values.

use std::time::Duration;

use crate::incident::Engine;
use crate::state::{self, Position, StateDir};

use crate::source::probe;
use crate::status::telemetry::Telemetry;

/// How often the position is written while records flow and no alert was raised.
pub const POSITION_EVERY: Duration = Duration::from_millis(250);

pub use crate::incident::{SavedIncidents, CHECKPOINT};

/// What the writer knows when asked to save.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveState {
    /// Every alert handed over is durable.
    pub all_acked: bool,
    /// An alert was handed over since the last save.
    pub alert_since_save: bool,
    /// The position, the incidents or the probe's memory moved since the last save.
    pub changed: bool,
    /// Time since the last save (or the start).
    pub since_last: Duration,
    /// Shutdown, or the probe's memory moved: save now if allowed at all.
    pub force: bool,
}

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// An alert is only in memory: nothing may be written.
    Hold,
    Save,
    /// Allowed, but not due yet (or nothing to save).
    NotYet,
}

/// The rule, on plain values.
pub fn decide(s: &SaveState) -> Verdict {
    if !s.all_acked {
        return Verdict::Hold;
    }
    if s.force {
        return Verdict::Save;
    }
    if !s.changed {
        return Verdict::NotYet;
    }
    let gap = if s.alert_since_save {
        SAVE_GAP
    } else {
        POSITION_EVERY
    };
    if s.since_last >= gap {
        Verdict::Save
    } else {
        Verdict::NotYet
    }
}

/// Writes the checkpoint (open incidents, probe memory, the record they account for) and the
/// kernel log position, only once every alert handed over is durable.
pub struct Checkpointer {
    pub(super) state: StateDir,
    pub(super) boot: [u8; 16],
    pub(super) boot_hex: String,
    pub(super) saved_seq: Option<u64>,
    pub(super) saved_changes: u64,
    pub(super) saved_probe: probe::Memory,
    /// The engine state last shown to `status`.
    pub(super) shown_changes: u64,
    pub(super) last_save: tokio::time::Instant,
    pub(super) errors: u64,
}

/// The shortest time between two checkpoints, however many alerts arrive.
const SAVE_GAP: Duration = Duration::from_millis(100);

impl Checkpointer {
    /// When the loop must call [`Checkpointer::save`] even if nothing else happens.
    pub fn due_at(
        &self,
        acks: &Acks,
        last_seq: Option<u64>,
        engine: &Engine,
    ) -> Option<tokio::time::Instant> {
        let changed = last_seq != self.saved_seq || engine.changes() != self.saved_changes;
        if acks.since_save {
            Some(self.last_save + SAVE_GAP)
        } else if changed {
            Some(self.last_save + POSITION_EVERY)
        } else {
            None
        }
    }

    /// Saves when something changed and either an alert was handed over since the last save,
    /// `force`, or [`POSITION_EVERY`] has passed. Returns false when alerts are still not
    /// durable (nothing is saved then: the position must not pass them).
    pub async fn save(
        &mut self,
        acks: &mut Acks,
        last_seq: Option<u64>,
        engine: &Engine,
        probe: &probe::Memory,
        tel: &Telemetry,
        force: bool,
    ) -> bool {
        if engine.changes() != self.shown_changes {
            // `status` shows open incidents as soon as the engine has them, not at the next
            // status tick.
            tel.set_open_incidents_from(engine.open_incidents());
            self.shown_changes = engine.changes();
        }
        if !acks.settle(ACK_WAIT).await {
            // Verdict::Hold: nothing is written while an alert is only in memory.
            return false;
        }
        let changed = last_seq != self.saved_seq
            || engine.changes() != self.saved_changes
            || *probe != self.saved_probe;
        let verdict = decide(&SaveState {
            all_acked: true,
            alert_since_save: acks.since_save,
            changed,
            since_last: self.last_save.elapsed(),
            force,
        });
        if verdict != Verdict::Save {
            return true;
        }
        let started = std::time::Instant::now();
        let snapshot = SavedIncidents {
            boot_id: self.boot_hex.clone(),
            open: engine.snapshot(),
            last_seq,
            probe: Some(probe.clone()),
        };
        // The snapshot first: it names the record it accounts for, and a start after a crash
        // between the two writes goes on from the snapshot.
        let result = self
            .state
            .save_json(CHECKPOINT, &snapshot)
            .and_then(|()| match last_seq {
                Some(seq) => self.state.save_position(&Position {
                    boot_id: self.boot,
                    last_seq: seq,
                }),
                None => Ok(()),
            });
        self.last_save = tokio::time::Instant::now();
        tracing::debug!(
            incidents = snapshot.open.len(),
            ms = started.elapsed().as_millis() as u64,
            "checkpoint saved"
        );
        match result {
            Ok(()) => {
                if let Some(seq) = last_seq {
                    tel.set_kmsg_position(&self.boot_hex, seq);
                }
                self.saved_seq = last_seq;
                self.saved_changes = engine.changes();
                self.saved_probe = probe.clone();
                acks.since_save = false;
                if self.errors > 0 {
                    tracing::info!("state saved again after {} failed attempts", self.errors);
                    self.errors = 0;
                }
            }
            Err(e) => {
                // A full disk: rate-limited, as this fails at every save.
                self.errors += 1;
                state::log_write_error("checkpoint", &format!("{e:#}"));
            }
        }
        true
    }
}

/// Acknowledgements of alerts handed to the alert stage and not yet durable. The kernel log
/// position (and the incident snapshot saved with it) is written only when none is missing, so
/// the saved state never runs ahead of an alert that exists only in memory.
#[derive(Default)]
pub struct Acks {
    waiting: Vec<tokio::sync::oneshot::Receiver<crate::alert::dispatch::Ack>>,
    /// An alert was handed over since the last save: save promptly.
    pub(super) since_save: bool,
}

/// How long the loop waits for the alert stage to make a batch's alerts durable before it goes
/// on reading (the position then simply stays where it is until they are).
const ACK_WAIT: Duration = Duration::from_secs(2);

impl Acks {
    pub fn submitted(
        &mut self,
        r: Result<
            tokio::sync::oneshot::Receiver<crate::alert::dispatch::Ack>,
            crate::alert::SendError,
        >,
    ) {
        match r {
            Ok(rx) => {
                self.waiting.push(rx);
                self.since_save = true;
            }
            // Only at shutdown: the alert stage is gone, so the position must not move.
            Err(e) => {
                tracing::error!("alert stage: {e}");
                self.waiting.push(tokio::sync::oneshot::channel().1);
            }
        }
    }

    /// Waits (bounded) for the outstanding acknowledgements; true when none is missing.
    pub async fn settle(&mut self, limit: Duration) -> bool {
        if self.waiting.is_empty() {
            return true;
        }
        let deadline = tokio::time::Instant::now() + limit;
        let mut left = Vec::new();
        for mut rx in std::mem::take(&mut self.waiting) {
            match tokio::time::timeout_at(deadline, &mut rx).await {
                Ok(Ok(_)) => {}
                // The stage dropped it without an answer: never durable.
                Ok(Err(_)) => left.push(tokio::sync::oneshot::channel().1),
                Err(_) => left.push(rx),
            }
        }
        self.waiting = left;
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> SaveState {
        SaveState {
            all_acked: true,
            alert_since_save: false,
            changed: true,
            since_last: Duration::ZERO,
            force: false,
        }
    }

    #[test]
    fn nothing_is_written_while_an_alert_is_only_in_memory() {
        for force in [false, true] {
            for since in [Duration::ZERO, Duration::from_secs(3600)] {
                let s = SaveState {
                    all_acked: false,
                    alert_since_save: true,
                    force,
                    since_last: since,
                    ..state()
                };
                assert_eq!(decide(&s), Verdict::Hold, "{s:?}");
            }
        }
    }

    #[test]
    fn promptly_after_an_alert_but_not_for_every_batch_of_a_burst() {
        let after_alert = SaveState {
            alert_since_save: true,
            ..state()
        };
        assert_eq!(decide(&after_alert), Verdict::NotYet);
        let s = SaveState {
            since_last: SAVE_GAP,
            ..after_alert
        };
        assert_eq!(decide(&s), Verdict::Save);
        // Records without alerts: at a steady pace.
        let quiet = SaveState {
            since_last: SAVE_GAP,
            ..state()
        };
        assert_eq!(decide(&quiet), Verdict::NotYet);
        let quiet = SaveState {
            since_last: POSITION_EVERY,
            ..state()
        };
        assert_eq!(decide(&quiet), Verdict::Save);
        // Nothing moved: nothing to write, however long ago.
        let idle = SaveState {
            changed: false,
            since_last: Duration::from_secs(3600),
            ..state()
        };
        assert_eq!(decide(&idle), Verdict::NotYet);
        assert_eq!(
            decide(&SaveState {
                force: true,
                changed: false,
                ..state()
            }),
            Verdict::Save
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn acknowledgements_gate_the_save() {
        use crate::alert::dispatch::Ack;
        let mut acks = Acks::default();
        assert!(acks.settle(Duration::ZERO).await, "nothing handed over");
        let (tx, rx) = tokio::sync::oneshot::channel();
        acks.submitted(Ok(rx));
        assert!(acks.since_save);
        assert!(
            !acks.settle(Duration::from_millis(10)).await,
            "not durable yet"
        );
        tx.send(Ack::Durable).unwrap();
        assert!(acks.settle(Duration::from_millis(10)).await);
        // An acknowledgement dropped unanswered never counts as durable.
        let (tx, rx) = tokio::sync::oneshot::channel::<Ack>();
        acks.submitted(Ok(rx));
        drop(tx);
        assert!(!acks.settle(Duration::from_millis(10)).await);
        assert!(
            !acks.settle(Duration::from_millis(10)).await,
            "and stays so"
        );
    }
}
