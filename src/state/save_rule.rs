//! When a checkpoint may be written, on plain values: never while an alert exists only in
//! memory; promptly after an alert (a crash then re-sends little), but at most every
//! [`SAVE_GAP`], since the snapshot grows with the open incidents; otherwise every
//! [`POSITION_EVERY`] while records flow.

use std::time::Duration;

/// How often the position is written while records flow and no alert was raised.
pub const POSITION_EVERY: Duration = Duration::from_millis(250);

/// The shortest time between two checkpoints, however many alerts arrive.
pub const SAVE_GAP: Duration = Duration::from_millis(100);

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
}
