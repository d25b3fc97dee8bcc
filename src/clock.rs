//! Time, read two ways on purpose.
//!
//! Decisions (incident windows, rate limits, deadlines) use a monotonic clock, so a wall-clock
//! step (NTP, an operator's `date -s`, a VM resumed from a snapshot) neither closes every open
//! incident at once nor freezes them. The wall clock is only for what people read and for
//! times written to disk. The monotonic clock is `CLOCK_BOOTTIME`: it keeps counting through
//! suspend, and it is shared by every process of the boot, so a deadline saved by one run of the
//! daemon still means the same instant to the next run in the same boot.

use std::time::{SystemTime, UNIX_EPOCH};

/// One reading of both clocks, taken together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Milliseconds since boot (`CLOCK_BOOTTIME`): for decisions.
    pub mono_ms: u64,
    /// Milliseconds since the Unix epoch: for display and for what is written to disk.
    pub wall_ms: u64,
}

impl Now {
    /// Both clocks, now.
    pub fn read() -> Now {
        Now {
            mono_ms: mono_ms(),
            wall_ms: wall_ms(),
        }
    }
}

/// Where both readings are the same number: scan (which replays a log's own timestamps) and
/// tests that do not care about clock steps.
impl From<u64> for Now {
    fn from(ms: u64) -> Now {
        Now {
            mono_ms: ms,
            wall_ms: ms,
        }
    }
}

/// Milliseconds since the Unix epoch; 0 if the clock reads before 1970.
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Milliseconds since boot, counting suspend.
pub fn mono_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_BOOTTIME exists on every kernel this
    // program supports (2.6.39+).
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        // Cannot happen with a valid clock id; fall back to the process-local monotonic clock.
        return fallback_mono_ms();
    }
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1000)
        .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000_000)
}

fn fallback_mono_ms() -> u64 {
    use std::sync::OnceLock;
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    let start = *START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// "42 s", "5 min", "3 h".
pub fn duration_words(ms: u64) -> String {
    let s = ms / 1000;
    if s < 120 {
        format!("{s} s")
    } else if s < 2 * 3600 {
        format!("{} min", s / 60)
    } else {
        format!("{} h", s / 3600)
    }
}

/// Milliseconds since the Unix epoch as RFC 3339 UTC with milliseconds.
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let millis = ms % 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_never_goes_back() {
        let a = mono_ms();
        let b = mono_ms();
        assert!(b >= a);
        assert!(a > 0, "time since boot is positive");
    }
}
