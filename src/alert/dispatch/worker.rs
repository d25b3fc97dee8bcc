//! One worker per channel: sends what is due, at most a few at a time, within the rate limit,
//! retries temporary failures with backoff and records every outcome in the outbox.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;

use super::shared::{lock, mono_ms, now_ms, shutdown_requested, Shared};
use crate::alert::channel::Channel;
use crate::alert::document::AlertDocument;
use crate::alert::outbox::Outcome;
use crate::alert::retry::{Backoff, DeliveryError, RetryConfig};
use crate::alert::sink::RateLimit;

/// Sliding-window rate limit: at most `count` sends in any `window`.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    pub(super) limit: Option<RateLimit>,
    pub(super) sent: VecDeque<u64>,
}

impl RateLimiter {
    pub(crate) fn new(limit: Option<RateLimit>) -> Self {
        RateLimiter {
            limit,
            sent: VecDeque::new(),
        }
    }

    /// `None` when a send may go now; otherwise the time it may.
    pub(crate) fn check(&mut self, now_ms: u64) -> Option<u64> {
        let l = self.limit?;
        let window = l.window_secs.saturating_mul(1000);
        while self.sent.front().is_some_and(|t| t + window <= now_ms) {
            self.sent.pop_front();
        }
        if self.sent.len() < l.count as usize {
            None
        } else {
            self.sent.front().map(|t| t + window)
        }
    }

    pub(crate) fn note(&mut self, now_ms: u64) {
        if self.limit.is_some() {
            self.sent.push_back(now_ms);
        }
    }
}

pub(super) struct Worker {
    pub(super) channel: Arc<Channel>,
    pub(super) shared: Arc<Shared>,
    pub(super) notify: Arc<Notify>,
    pub(super) rate: RateLimiter,
    pub(super) retry: watch::Receiver<RetryConfig>,
    pub(super) shutdown: watch::Receiver<bool>,
    /// This worker alone stops (its channel was removed or rebuilt by a reload).
    pub(super) stop: watch::Receiver<bool>,
}

/// Sends to one channel at the same time, at most: a receiver that accepts a request and never
/// answers holds one of these until the request times out, not the whole queue.
pub(super) const MAX_IN_FLIGHT: usize = 4;

/// One finished attempt.
pub(super) struct Attempt {
    pub(super) seq: u64,
    pub(super) doc: Arc<AlertDocument>,
    pub(super) attempts: u32,
    pub(super) enqueued_ms: u64,
    pub(super) result: Result<(), DeliveryError>,
}

impl Worker {
    pub(super) async fn run(mut self) {
        let name = self.channel.name().to_string();
        let mut sd = self.shutdown.clone();
        let mut stop = self.stop.clone();
        let mut inflight: JoinSet<Attempt> = JoinSet::new();
        let mut busy: HashSet<u64> = HashSet::new();
        let mut tasks: std::collections::HashMap<tokio::task::Id, u64> = Default::default();
        loop {
            if *sd.borrow() || *stop.borrow() {
                // Dropping the JoinSet aborts what is in flight; those alerts stay pending in
                // the outbox and go out after the restart (or from the rebuilt channel).
                return;
            }
            // Start what is due, up to the in-flight limit and the rate limit.
            let mut rate_wait = None;
            while inflight.len() < MAX_IN_FLIGHT {
                let (now, mono) = (now_ms(), mono_ms());
                let next = {
                    let ob = lock(&self.shared.outbox);
                    ob.due_except(&name, now, mono, &busy)
                        .and_then(|seq| ob.get(seq))
                        .map(|slot| {
                            let attempts = slot.channels.get(&name).map_or(0, |c| c.attempts);
                            (slot.seq, slot.doc.clone(), attempts, slot.enqueued_ms)
                        })
                };
                let Some((seq, doc, attempts, enqueued_ms)) = next else {
                    break;
                };
                if let Some(at) = self.rate.check(mono) {
                    tracing::debug!(channel = %name, "rate limit reached; alert waits");
                    rate_wait = Some(Duration::from_millis(at.saturating_sub(mono)));
                    break;
                }
                self.rate.note(mono);
                busy.insert(seq);
                let ch = self.channel.clone();
                let handle = inflight.spawn(async move {
                    let result = ch.deliver(&doc).await;
                    Attempt {
                        seq,
                        doc,
                        attempts,
                        enqueued_ms,
                        result,
                    }
                });
                tasks.insert(handle.id(), seq);
            }
            let wait = rate_wait
                .or_else(|| lock(&self.shared.outbox).next_wait(&name, now_ms(), mono_ms(), &busy));
            tokio::select! {
                biased;
                _ = shutdown_requested(&mut sd) => return,
                _ = shutdown_requested(&mut stop) => return,
                Some(done) = inflight.join_next_with_id(), if !inflight.is_empty() => {
                    match done {
                        Ok((id, a)) => {
                            tasks.remove(&id);
                            busy.remove(&a.seq);
                            self.finish(&name, a).await;
                        }
                        Err(e) => {
                            // A panicking channel: the alert stays pending and is tried again.
                            tracing::error!(channel = %name, "alert delivery task failed: {e}");
                            if let Some(seq) = tasks.remove(&e.id()) {
                                busy.remove(&seq);
                            }
                        }
                    }
                }
                _ = self.notify.notified() => {}
                _ = sleep_or_forever(wait) => {}
            }
        }
    }

    pub(super) async fn finish(&self, name: &str, a: Attempt) {
        let outcome = self.outcome(name, &a.doc, a.result, a.attempts, a.enqueued_ms);
        let shared = self.shared.clone();
        let ch = name.to_string();
        let seq = a.seq;
        let recorded = tokio::task::spawn_blocking(move || {
            let r = lock(&shared.outbox).record(seq, &ch, outcome);
            shared.write_status_soon();
            r
        })
        .await;
        match recorded {
            Ok((finished, err)) => {
                if let Some(e) = err {
                    tracing::error!(channel = %name, "cannot update the alert outbox: {e}");
                }
                if let Some(f) = finished {
                    tracing::debug!(incident = %f.id, "alert finished on every channel; removed from the outbox");
                }
            }
            Err(e) => {
                tracing::error!(channel = %name, "alert outbox update failed: {e}")
            }
        }
    }

    /// Turns one attempt's result into what the outbox records, and logs it.
    pub(super) fn outcome(
        &self,
        name: &str,
        doc: &AlertDocument,
        result: Result<(), DeliveryError>,
        attempts: u32,
        enqueued_ms: u64,
    ) -> Outcome {
        let now = now_ms();
        let retry = self.retry.borrow().clone();
        let mut stats = lock(&self.shared.stats);
        let st = stats.get_mut(name);
        match result {
            Ok(()) => {
                tracing::info!(channel = %name, incident = %doc.id, "alert delivered");
                if let Some(st) = st {
                    st.delivered_total += 1;
                    st.last_success_ms = Some(now);
                }
                Outcome::Delivered
            }
            Err(e) => {
                let attempts = attempts + 1;
                let too_many = retry.max_attempts > 0 && attempts >= retry.max_attempts;
                let too_old = retry.max_age_secs > 0
                    && now.saturating_sub(enqueued_ms) > retry.max_age_secs.saturating_mul(1000);
                let give_up = e.is_permanent() || too_many || too_old;
                if let Some(st) = st {
                    st.last_failure_ms = Some(now);
                    st.last_error = Some(e.message.clone());
                    if give_up {
                        st.failed_total += 1;
                    } else {
                        st.retries_total += 1;
                    }
                }
                if e.is_permanent() {
                    tracing::error!(channel = %name, incident = %doc.id, error = %e, "ALERT NOT DELIVERED: the channel refused it permanently; fix the channel's configuration");
                    Outcome::Failed { error: e.message }
                } else if give_up {
                    let why = if too_many {
                        format!("gave up after {attempts} attempts")
                    } else {
                        format!("gave up after {} s", retry.max_age_secs)
                    };
                    tracing::error!(channel = %name, incident = %doc.id, error = %e, "ALERT NOT DELIVERED: {why}");
                    Outcome::Failed {
                        error: format!("{why}: {}", e.message),
                    }
                } else {
                    let delay = Backoff::new(&retry).delay(attempts, e.retry_after);
                    tracing::warn!(channel = %name, incident = %doc.id, error = %e, attempt = attempts, retry_in_ms = delay.as_millis() as u64, "alert delivery failed; will retry");
                    Outcome::Retry {
                        next_attempt_ms: now + delay.as_millis() as u64,
                        error: e.message,
                    }
                }
            }
        }
    }
}

pub(super) async fn sleep_or_forever(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn rate_limiter_slides() {
        let mut r = RateLimiter::new(Some(RateLimit {
            count: 2,
            window_secs: 10,
        }));
        assert_eq!(r.check(0), None);
        r.note(0);
        assert_eq!(r.check(1000), None);
        r.note(1000);
        assert_eq!(r.check(2000), Some(10_000));
        assert_eq!(r.check(10_000), None);
        r.note(10_000);
        assert_eq!(r.check(10_500), Some(11_000));
        let mut none = RateLimiter::new(None);
        for t in 0..100 {
            assert_eq!(none.check(t), None);
            none.note(t);
        }
    }
}
