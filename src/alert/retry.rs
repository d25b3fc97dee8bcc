//! Retry policy: which failures are worth another try, and when.
//!
//! 5xx, 429, timeouts, connection failures and SMTP 4xx are temporary; other 4xx, SMTP 5xx
//! (authentication included) and bad configuration are permanent. Delays grow exponentially with
//! "equal jitter" (half fixed, half random) so many hosts that failed together do not retry
//! together, and a receiver's `Retry-After` is honoured up to a ceiling.
//!
//! The lowest room of the alert stage: every channel reports its failures as a [`DeliveryError`].

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::runbook::Redactor;

/// `[alerts.retry]`: the retry policy, shared by every channel. Kept with the code that applies
/// it, so the backoff reads its own settings and nothing else.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// First delay after a temporary failure; doubled each attempt, with jitter.
    pub initial_backoff_ms: u64,
    /// Ceiling of the computed delay.
    pub max_backoff_secs: u64,
    /// Attempts per channel before the alert is given up for that channel (0: no limit by count).
    pub max_attempts: u32,
    /// Age after which an alert that still failed is given up (0: no limit by age).
    pub max_age_secs: u64,
    /// A receiver's `Retry-After` is honoured up to this many seconds.
    pub max_retry_after_secs: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            initial_backoff_ms: 2000,
            max_backoff_secs: 300,
            max_attempts: 50,
            max_age_secs: 2 * 24 * 3600,
            max_retry_after_secs: 3600,
        }
    }
}

/// Whether a failed delivery is worth retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// Try again later (after `retry_after` when the receiver said so).
    Transient,
    /// Retrying cannot help (bad request, rejected credentials, bad address).
    Permanent,
}

/// A failed delivery. The message never holds a secret: URLs are left out of it, and what came
/// from the receiver is cut by [`DeliveryError::redacted`] before anyone sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryError {
    pub kind: FailureKind,
    pub message: String,
    /// The receiver's `Retry-After`, when it sent one.
    pub retry_after: Option<Duration>,
}

impl DeliveryError {
    pub fn transient(message: impl Into<String>) -> Self {
        DeliveryError {
            kind: FailureKind::Transient,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn permanent(message: impl Into<String>) -> Self {
        DeliveryError {
            kind: FailureKind::Permanent,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn is_permanent(&self) -> bool {
        self.kind == FailureKind::Permanent
    }

    /// The error as it may be logged, stored and shown: its message made from the receiver's
    /// answer (which may echo the URL and the `Authorization` header) with every secret cut out
    /// and capped ([`Redactor::error_text`]).
    pub fn redacted(self, secrets: &Redactor) -> DeliveryError {
        DeliveryError {
            message: secrets.error_text(&self.message),
            ..self
        }
    }
}

impl fmt::Display for DeliveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DeliveryError {}

/// Classifies an HTTP status that is not a success.
pub fn classify_http_status(status: u16) -> FailureKind {
    match status {
        // Request Timeout, Too Early, Too Many Requests and every server error are temporary.
        408 | 425 | 429 => FailureKind::Transient,
        500..=599 => FailureKind::Transient,
        _ => FailureKind::Permanent,
    }
}

/// Parses `Retry-After`: delta-seconds or an HTTP date.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = httpdate::parse_http_date(v).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The backoff schedule.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    max_retry_after: Duration,
}

impl Backoff {
    pub fn new(cfg: &RetryConfig) -> Self {
        Backoff {
            initial: Duration::from_millis(cfg.initial_backoff_ms.max(1)),
            max: Duration::from_secs(cfg.max_backoff_secs.max(1)),
            max_retry_after: Duration::from_secs(cfg.max_retry_after_secs),
        }
    }

    /// The fixed part of the delay after `attempts` failed attempts (1 = after the first).
    pub fn base(&self, attempts: u32) -> Duration {
        let shift = attempts.saturating_sub(1).min(30);
        self.initial.saturating_mul(1u32 << shift).min(self.max)
    }

    /// The delay before the next attempt: `base/2 + random(0..=base/2)`, or the receiver's
    /// `Retry-After` (capped) when that is longer.
    pub fn delay(&self, attempts: u32, retry_after: Option<Duration>) -> Duration {
        let base = self.base(attempts);
        let half = base / 2;
        let jitter_ms = fastrand::u64(0..=half.as_millis() as u64);
        let computed = half + Duration::from_millis(jitter_ms);
        match retry_after {
            Some(ra) => computed.max(ra.min(self.max_retry_after)),
            None => computed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff() -> Backoff {
        Backoff::new(&RetryConfig {
            initial_backoff_ms: 1000,
            max_backoff_secs: 60,
            max_attempts: 10,
            max_age_secs: 0,
            max_retry_after_secs: 120,
        })
    }

    #[test]
    fn grows_exponentially_up_to_the_ceiling() {
        let b = backoff();
        assert_eq!(b.base(1), Duration::from_secs(1));
        assert_eq!(b.base(2), Duration::from_secs(2));
        assert_eq!(b.base(4), Duration::from_secs(8));
        assert_eq!(b.base(10), Duration::from_secs(60));
        assert_eq!(b.base(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn jitter_stays_within_half_and_full() {
        let b = backoff();
        for attempt in 1..12 {
            for _ in 0..50 {
                let d = b.delay(attempt, None);
                let base = b.base(attempt);
                assert!(d >= base / 2 && d <= base, "{d:?} vs {base:?}");
            }
        }
    }

    #[test]
    fn retry_after_is_honoured_and_capped() {
        let b = backoff();
        assert!(b.delay(1, Some(Duration::from_secs(30))) >= Duration::from_secs(30));
        assert_eq!(
            b.delay(1, Some(Duration::from_secs(100_000))),
            Duration::from_secs(120)
        );
        // A short Retry-After does not shorten the backoff.
        assert!(b.delay(5, Some(Duration::ZERO)) >= Duration::from_secs(8));
    }

    #[test]
    fn parses_retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(parse_retry_after(" 7 ", now), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn classifies_statuses() {
        for s in [408, 425, 429, 500, 502, 503, 504] {
            assert_eq!(classify_http_status(s), FailureKind::Transient, "{s}");
        }
        for s in [400, 401, 403, 404, 410, 413, 422] {
            assert_eq!(classify_http_status(s), FailureKind::Permanent, "{s}");
        }
    }
}
