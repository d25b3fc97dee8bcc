//! When the kernel logged a record, on the wall clock.
//!
//! A kmsg record carries microseconds since boot, not a date. Read at start-up, a record may be
//! hours old: dating it at the daemon's start would page an old fault as new and skew the
//! history's repeat window. The date is the boot's wall-clock time (`btime` of `/proc/stat`)
//! plus the record's timestamp.
//!
//! `btime` is read once, at start. A later wall-clock step (NTP, `date -s`) moves the boot's
//! wall-clock time with it, so the step since start is added, measured against
//! `CLOCK_BOOTTIME`. The kernel's timestamp does not count suspend while `btime` does, so on a
//! machine that suspended, older records are dated somewhat early; servers rarely suspend, and a
//! date is never put after the present.

use std::path::Path;

use crate::clock::Now;

/// Where the boot's wall-clock time is read by default.
pub const PROC_STAT: &str = "/proc/stat";

/// The boot's wall-clock time, and the clocks when it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelClock {
    /// Milliseconds since the Unix epoch at boot.
    boot_wall_ms: u64,
    /// Both clocks when `boot_wall_ms` was read: a wall-clock step since is followed.
    read_at: Now,
}

impl KernelClock {
    /// A clock whose boot was at `boot_wall_ms`, read at `read_at`.
    pub fn new(boot_wall_ms: u64, read_at: Now) -> KernelClock {
        KernelClock {
            boot_wall_ms,
            read_at,
        }
    }

    /// Reads `btime` from `path` (`/proc/stat`, or a test's file in the same format). When it
    /// cannot be read, the boot is now minus the time since boot (`CLOCK_BOOTTIME`): the same
    /// number to within the clocks' drift, and never a reason not to start.
    pub fn read(path: &Path) -> KernelClock {
        let now = Now::read();
        let btime = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|text| parse_btime(&text).ok_or_else(|| "no btime line".to_string()));
        match btime {
            Ok(secs) => KernelClock::new(secs.saturating_mul(1000), now),
            Err(e) => {
                tracing::warn!(
                    "{}: {e}; the kernel log's times are counted from now minus the time since boot",
                    path.display()
                );
                KernelClock::new(now.wall_ms.saturating_sub(now.mono_ms), now)
            }
        }
    }

    /// The wall-clock time (ms since the epoch) of a record logged `ts_usec` after boot, as of
    /// `now`: never later than `now`, since a date in the future is always wrong.
    pub fn wall_ms(&self, ts_usec: u64, now: Now) -> u64 {
        // How far the wall clock stepped, relative to the time since boot, since `btime` was read.
        let offset_then = i128::from(self.read_at.wall_ms) - i128::from(self.read_at.mono_ms);
        let offset_now = i128::from(now.wall_ms) - i128::from(now.mono_ms);
        let boot = i128::from(self.boot_wall_ms) + (offset_now - offset_then);
        let at = boot + i128::from(ts_usec / 1000);
        let at = at.clamp(0, i128::from(now.wall_ms));
        u64::try_from(at).unwrap_or(0)
    }
}

/// The `btime N` line of `/proc/stat`: seconds since the epoch at boot.
fn parse_btime(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// A record's time as the kernel prints it (`[   12.345678]`, seconds padded to five places).
/// Written digit by digit: the formatting machinery cost a fortieth of the daemon's time in a
/// storm, where every record gets one.
pub fn kernel_stamp(ts_usec: u64) -> String {
    let (buf, n) = kernel_stamp_bytes(ts_usec);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// [`kernel_stamp`] as a [`Stamp`], without the heap.
pub fn kernel_stamp_inline(ts_usec: u64) -> crate::model::Stamp {
    let (buf, n) = kernel_stamp_bytes(ts_usec);
    crate::model::Stamp::new(std::str::from_utf8(&buf[..n]).unwrap_or(""))
}

/// The stamp's ASCII bytes and their count (at most 1 + 20 + 1 + 6 + 1). Written right to left
/// into a buffer of spaces, two digits at a time ([`crate::decimal`]): every Xid of a storm gets
/// a stamp, and the digit-at-a-time loops with their bounds checks cost some 330 instructions a
/// stamp (a thirtieth of the daemon's on a GPU host's mix); this, about a quarter of that.
fn kernel_stamp_bytes(ts_usec: u64) -> ([u8; 32], usize) {
    let mut s = [b' '; 32];
    s[31] = b']';
    crate::decimal::write_six(&mut s[25..31], (ts_usec % 1_000_000) as u32);
    s[24] = b'.';
    // The seconds, padded with the buffer's spaces to five places, as the kernel prints them.
    let first = crate::decimal::write_left_of(&mut s, 24, ts_usec / 1_000_000);
    let k = first.min(24 - 5) - 1;
    s[k] = b'[';
    s.copy_within(k.., 0);
    (s, 32 - k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn btime_is_read_from_a_proc_stat_shaped_text() {
        let text = "cpu  1 2 3\nintr 5\nctxt 9\nbtime 1764600000\nprocesses 7\n";
        assert_eq!(parse_btime(text), Some(1_764_600_000));
        assert_eq!(parse_btime("cpu 1\n"), None);
        assert_eq!(parse_btime("btime x\n"), None);
    }

    #[test]
    fn a_record_is_dated_boot_plus_its_timestamp_never_in_the_future() {
        let start = Now {
            mono_ms: 3_600_000,
            wall_ms: 1_000_000_000,
        };
        let boot = start.wall_ms - start.mono_ms;
        let c = KernelClock::new(boot, start);
        // Logged 50 minutes after boot: 10 minutes before start.
        assert_eq!(c.wall_ms(3_000_000_000, start), start.wall_ms - 600_000);
        // Ahead of the present (drift): the present.
        assert_eq!(c.wall_ms(4_000_000_000, start), start.wall_ms);
        // The wall clock stepped forward an hour since: the boot's date moves with it.
        let later = Now {
            mono_ms: start.mono_ms + 1000,
            wall_ms: start.wall_ms + 1000 + 3_600_000,
        };
        assert_eq!(
            c.wall_ms(3_600_500_000, later),
            boot + 3_600_000 + 3_600_500
        );
    }

    #[test]
    fn kernel_stamps_read_as_the_kernel_prints_them() {
        for ts in [
            0,
            7,
            999_999,
            1_000_000,
            12_345_678,
            99_999_999_999,
            100_000_000_000,
            100_000_000_001,
            123_456_789_012_345,
            u64::MAX,
        ] {
            assert_eq!(
                kernel_stamp(ts),
                format!("[{:>5}.{:06}]", ts / 1_000_000, ts % 1_000_000)
            );
        }
    }
}
