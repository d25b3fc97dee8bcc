//! The sender loop: takes alerts from a bounded channel, writes them to the outbox, and delivers
//! them to every channel that wants them.
//!
//! One intake task persists alerts (and the full report on the host); one worker task per
//! channel delivers, so a receiver that is down delays only itself. Workers honour the
//! per-channel rate limit (alerts over it wait, they are not dropped), retry temporary failures
//! with backoff, and give up on permanent ones loudly. Every wait also watches the shutdown
//! signal, so the dispatcher never holds up shutdown: an interrupted send stays in the outbox
//! and goes out after the restart.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;

use super::channel::{build_all, Channel};
use super::config::{AlertConfig, ChannelCommon, ChannelKind, RateLimit, RetryConfig};
use super::document::AlertDocument;
use super::outbox::{self, Limits, Outbox, Outcome};
use super::report;
use super::retry::Backoff;
use super::{Alert, AlertError};

/// Subdirectory of the state directory holding the outbox.
pub const OUTBOX_DIR: &str = "alert-outbox";
/// Subdirectory of the state directory holding the full readable reports.
pub const REPORTS_DIR: &str = "alert-reports";
/// File in the state directory holding the latest [`AlertStatus`].
pub const STATUS_FILE: &str = "alert-status.json";

/// Reads the status the running daemon keeps in `<state_dir>/alert-status.json`, for
/// `xidwatch status` in another process. `updated_ms` tells how fresh it is.
pub fn read_status(state_dir: &Path) -> Result<AlertStatus, String> {
    let path = state_dir.join(STATUS_FILE);
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// Why an alert could not be handed over.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("the alert queue is full")]
    Full(Box<Alert>),
    #[error("the alert dispatcher has stopped")]
    Closed(Box<Alert>),
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

struct Shared {
    outbox: Mutex<Outbox>,
    stats: Mutex<BTreeMap<String, ChannelStatus>>,
    accepted_total: Mutex<u64>,
    /// Where the status snapshot is written; the lock keeps writers from racing.
    status_path: Mutex<PathBuf>,
}

impl Shared {
    fn status(&self) -> AlertStatus {
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

    /// Writes the status snapshot (blocking; call from `spawn_blocking`). Best effort: the
    /// snapshot is informational, so a failure is logged and alerting goes on.
    fn write_status(&self) {
        let st = self.status();
        let path = lock(&self.status_path);
        let bytes = serde_json::to_vec_pretty(&st).unwrap_or_default();
        if let Err(e) = crate::state::write_atomic(&path, &bytes, crate::state::STATE_FILE_MODE) {
            tracing::debug!("cannot write {}: {e}", path.display());
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not stop alerting: the data is still consistent enough to send.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The daemon's handle: hands alerts to the dispatcher and reads its status. Cheap to clone.
#[derive(Clone)]
pub struct AlertSender {
    tx: mpsc::Sender<Alert>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for AlertSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlertSender").finish_non_exhaustive()
    }
}

impl AlertSender {
    /// Hands an alert over, waiting while the queue is full.
    pub async fn send(&self, alert: Alert) -> Result<(), SendError> {
        self.tx
            .send(alert)
            .await
            .map_err(|e| SendError::Closed(Box::new(e.0)))
    }

    /// Hands an alert over without waiting.
    pub fn try_send(&self, alert: Alert) -> Result<(), SendError> {
        self.tx.try_send(alert).map_err(|e| match e {
            mpsc::error::TrySendError::Full(a) => SendError::Full(Box::new(a)),
            mpsc::error::TrySendError::Closed(a) => SendError::Closed(Box::new(a)),
        })
    }

    /// A snapshot of every channel and of the outbox.
    pub fn status(&self) -> AlertStatus {
        self.shared.status()
    }
}

/// Starts and owns the alert tasks.
pub struct Dispatcher;

impl Dispatcher {
    /// Validates the config, builds every channel (resolving secrets), opens the outbox under
    /// `state_dir` and starts the tasks on the current tokio runtime. Alerts left in the outbox
    /// by an earlier run are delivered first. The tasks end when `shutdown` becomes `true` (or
    /// its sender is dropped); the returned handle completes then.
    pub fn start(
        cfg: &AlertConfig,
        state_dir: &Path,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(AlertSender, JoinHandle<()>), AlertError> {
        cfg.validate().map_err(AlertError::Config)?;
        for w in cfg.secret_warnings(None) {
            tracing::warn!("{w}");
        }
        let channels = build_all(cfg, None)?;
        let commons: BTreeMap<String, ChannelCommon> = cfg
            .channels()
            .into_iter()
            .map(|c| (c.name.clone(), c))
            .collect();

        let dir = state_dir.join(OUTBOX_DIR);
        let (mut ob, warnings) = Outbox::open(
            &dir,
            Limits {
                max_count: cfg.outbox.max_count,
                max_bytes: cfg.outbox.max_bytes,
            },
        )
        .map_err(|e| AlertError::Outbox {
            path: dir.display().to_string(),
            message: e.to_string(),
        })?;
        for w in warnings {
            tracing::error!("alert outbox: {w}");
        }
        let names: Vec<String> = channels.iter().map(|c| c.name().to_string()).collect();
        for (id, ch) in ob.retire_channels(&names) {
            tracing::error!(incident = %id, channel = %ch, "alert left in the outbox for a channel that is no longer configured; not sent there");
        }
        if !ob.is_empty() {
            tracing::info!(
                count = ob.len(),
                "alerts left in the outbox by an earlier run will be sent"
            );
        }

        let stats = channels
            .iter()
            .map(|c| {
                (
                    c.name().to_string(),
                    ChannelStatus {
                        name: c.name().to_string(),
                        kind: c.kind(),
                        queued: 0,
                        delivered_total: 0,
                        failed_total: 0,
                        retries_total: 0,
                        last_success_ms: None,
                        last_failure_ms: None,
                        last_error: None,
                    },
                )
            })
            .collect();
        let shared = Arc::new(Shared {
            outbox: Mutex::new(ob),
            stats: Mutex::new(stats),
            accepted_total: Mutex::new(0),
            status_path: Mutex::new(state_dir.join(STATUS_FILE)),
        });
        shared.write_status();
        let (tx, rx) = mpsc::channel(cfg.queue_capacity.max(1));

        let mut workers = Vec::new();
        let mut wakers = Vec::new();
        for ch in channels {
            let notify = Arc::new(Notify::new());
            wakers.push((ch.name().to_string(), notify.clone()));
            let common = commons.get(ch.name()).cloned();
            let w = Worker {
                rate: RateLimiter::new(common.and_then(|c| c.rate_limit)),
                channel: ch,
                shared: shared.clone(),
                notify,
                retry: cfg.retry.clone(),
                backoff: Backoff::new(&cfg.retry),
                shutdown: shutdown.clone(),
            };
            workers.push(tokio::spawn(w.run()));
        }
        let intake = Intake {
            rx,
            shared: shared.clone(),
            commons: commons.into_values().collect(),
            wakers,
            reports_dir: state_dir.join(REPORTS_DIR),
            keep_reports: cfg.outbox.keep_reports,
            shutdown,
        };
        let intake = tokio::spawn(intake.run());
        let handle = tokio::spawn(async move {
            let _ = intake.await;
            for w in workers {
                let _ = w.await;
            }
        });
        Ok((AlertSender { tx, shared }, handle))
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Resolves when shutdown is asked for (or its sender is gone).
async fn shutdown_requested(rx: &mut watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

struct Intake {
    rx: mpsc::Receiver<Alert>,
    shared: Arc<Shared>,
    commons: Vec<ChannelCommon>,
    wakers: Vec<(String, Arc<Notify>)>,
    reports_dir: PathBuf,
    keep_reports: usize,
    shutdown: watch::Receiver<bool>,
}

impl Intake {
    async fn run(mut self) {
        loop {
            let mut sd = self.shutdown.clone();
            tokio::select! {
                biased;
                _ = shutdown_requested(&mut sd) => break,
                msg = self.rx.recv() => match msg {
                    Some(alert) => self.accept(alert).await,
                    None => {
                        // Every sender is gone; the workers go on until shutdown.
                        return;
                    }
                },
            }
        }
        // Persist what was handed over before shutdown; it is sent after the restart.
        self.rx.close();
        while let Ok(alert) = self.rx.try_recv() {
            self.accept(alert).await;
        }
    }

    async fn accept(&mut self, alert: Alert) {
        let mut doc = AlertDocument::build(&alert);
        let targets: Vec<String> = self
            .commons
            .iter()
            .filter(|c| doc.severity >= c.min_severity)
            .map(|c| c.name.clone())
            .collect();
        if targets.is_empty() {
            tracing::debug!(incident = %doc.id, severity = %doc.severity, "alert below every channel's minimum severity; not sent");
            return;
        }
        let shared = self.shared.clone();
        let reports_dir = self.reports_dir.clone();
        let keep = self.keep_reports;
        let now = now_ms();
        let result = tokio::task::spawn_blocking(move || {
            if keep > 0 {
                let name = format!("{}.txt", doc.file_stem());
                let path = reports_dir.join(&name);
                doc.report_path = Some(path.display().to_string());
                if let Err(e) = write_report(&reports_dir, &name, &doc, keep) {
                    doc.report_path = None;
                    tracing::warn!(incident = %doc.id, "cannot keep the full report on the host: {e}");
                }
            }
            let id = doc.id.clone();
            let pushed = lock(&shared.outbox).push(doc, &targets, now);
            shared.write_status();
            (id, pushed)
        })
        .await;
        let (id, pushed) = match result {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("alert intake failed: {e}");
                return;
            }
        };
        for d in &pushed.dropped {
            tracing::error!(incident = %d.id, severity = %d.severity, "alert outbox full: dropped alert \"{}\"; the next alert reports the count", d.headline);
        }
        if let Some(e) = &pushed.write_error {
            tracing::error!(incident = %id, "cannot write the alert outbox ({e}); sending from memory, a crash now would lose it");
        }
        if pushed.seq.is_some() {
            *lock(&self.shared.accepted_total) += 1;
            for (_, n) in &self.wakers {
                n.notify_one();
            }
        }
    }
}

/// Writes the full report under `dir` and keeps only the newest `keep` reports.
fn write_report(dir: &Path, name: &str, doc: &AlertDocument, keep: usize) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)?;
    outbox::write_atomic(dir, name, report::render(doc).as_bytes())?;
    let mut files: Vec<(SystemTime, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".txt"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if files.len() > keep {
        files.sort();
        let excess = files.len() - keep;
        for (_, p) in files.into_iter().take(excess) {
            let _ = std::fs::remove_file(p);
        }
    }
    Ok(())
}

/// Sliding-window rate limit: at most `count` sends in any `window`.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    limit: Option<RateLimit>,
    sent: VecDeque<u64>,
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

struct Worker {
    channel: Channel,
    shared: Arc<Shared>,
    notify: Arc<Notify>,
    rate: RateLimiter,
    retry: RetryConfig,
    backoff: Backoff,
    shutdown: watch::Receiver<bool>,
}

enum Next {
    Send(u64, Arc<AlertDocument>, u32, u64),
    Wait(Option<u64>),
}

impl Worker {
    async fn run(mut self) {
        let name = self.channel.name().to_string();
        let mut sd = self.shutdown.clone();
        loop {
            if *sd.borrow() {
                return;
            }
            let now = now_ms();
            let next = {
                let ob = lock(&self.shared.outbox);
                match ob.due(&name, now).and_then(|seq| ob.get(seq)) {
                    Some(slot) => {
                        let attempts = slot.channels.get(&name).map_or(0, |c| c.attempts);
                        Next::Send(slot.seq, slot.doc.clone(), attempts, slot.enqueued_ms)
                    }
                    None => Next::Wait(ob.next_due_ms(&name)),
                }
            };
            match next {
                Next::Wait(at) => {
                    let sleep = at.map(|t| Duration::from_millis(t.saturating_sub(now)));
                    tokio::select! {
                        biased;
                        _ = shutdown_requested(&mut sd) => return,
                        _ = self.notify.notified() => {}
                        _ = sleep_or_forever(sleep) => {}
                    }
                }
                Next::Send(seq, doc, attempts, enqueued_ms) => {
                    if let Some(at) = self.rate.check(now) {
                        tracing::debug!(channel = %name, "rate limit reached; alert waits");
                        let sleep = Duration::from_millis(at.saturating_sub(now));
                        tokio::select! {
                            biased;
                            _ = shutdown_requested(&mut sd) => return,
                            _ = tokio::time::sleep(sleep) => {}
                        }
                        continue;
                    }
                    self.rate.note(now);
                    let result = tokio::select! {
                        biased;
                        _ = shutdown_requested(&mut sd) => {
                            tracing::info!(channel = %name, incident = %doc.id, "shutdown during delivery; the alert stays in the outbox");
                            return;
                        }
                        r = self.channel.deliver(&doc) => r,
                    };
                    let outcome = self.outcome(&name, &doc, result, attempts, enqueued_ms);
                    let shared = self.shared.clone();
                    let ch = name.clone();
                    let recorded = tokio::task::spawn_blocking(move || {
                        let r = lock(&shared.outbox).record(seq, &ch, outcome);
                        shared.write_status();
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
            }
        }
    }

    /// Turns one attempt's result into what the outbox records, and logs it.
    fn outcome(
        &self,
        name: &str,
        doc: &AlertDocument,
        result: Result<(), super::DeliveryError>,
        attempts: u32,
        enqueued_ms: u64,
    ) -> Outcome {
        let now = now_ms();
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
                let too_many = self.retry.max_attempts > 0 && attempts >= self.retry.max_attempts;
                let too_old = self.retry.max_age_secs > 0
                    && now.saturating_sub(enqueued_ms)
                        > self.retry.max_age_secs.saturating_mul(1000);
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
                        format!("gave up after {} s", self.retry.max_age_secs)
                    };
                    tracing::error!(channel = %name, incident = %doc.id, error = %e, "ALERT NOT DELIVERED: {why}");
                    Outcome::Failed {
                        error: format!("{why}: {}", e.message),
                    }
                } else {
                    let delay = self.backoff.delay(attempts, e.retry_after);
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

async fn sleep_or_forever(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limiter_slides() {
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
