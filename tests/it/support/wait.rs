//! Waiting on progress instead of sleeping: poll a condition until it holds.

use std::time::{Duration, Instant};

/// How long a test waits for something the daemon does in well under a second.
pub const LIMIT: Duration = Duration::from_secs(30);

/// How often a condition is polled.
const POLL: Duration = Duration::from_millis(10);

/// Polls `cond` until it holds; fails the test, naming `what`, after `limit`.
#[track_caller]
pub fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    wait_for(limit, what, || cond().then_some(()))
}

/// Polls `f` until it gives a value; fails the test, naming `what`, after `limit`.
#[track_caller]
pub fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(POLL);
    }
}
