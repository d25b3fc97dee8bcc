//! The daemon's checkpoint: what survives a crash, and when it may be written.
//!
//! The promise it keeps: the kernel log position (and the open incidents saved with it) never
//! moves past an alert that exists only in memory. Every alert handed to the alert stage comes
//! back with an acknowledgement once it is fsynced in the outbox ([`Acks`]); while one is
//! missing, nothing is written, so a crash re-reads the records behind it and raises the same
//! incident (same id) again. Once all are in, the checkpoint is written promptly after an alert
//! (a crash then re-sends little) but at most every [`SAVE_GAP`], since the snapshot grows with
//! the open incidents. [`decide`] is that rule on plain values.

use crate::alert::dispatch::Acks;
use crate::incident::Engine;
use crate::state::save_rule::{decide, SaveState, Verdict, POSITION_EVERY, SAVE_GAP};
use crate::state::{self, Position, StateDir};

use crate::source::probe;
use crate::status::telemetry::Telemetry;

pub use crate::incident::{SavedIncidents, CHECKPOINT};

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
        if !acks.settle(crate::alert::dispatch::ACK_WAIT).await {
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
