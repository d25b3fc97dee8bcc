//! The sender loop: takes alerts from a bounded channel, writes them to the outbox, and delivers
//! them to every channel that wants them.
//!
//! One intake task persists alerts (and the full report on the host); one worker task per
//! channel delivers, so a receiver that is down delays only itself. Workers honour the
//! per-channel rate limit (alerts over it wait, they are not dropped), retry temporary failures
//! with backoff, and give up on permanent ones loudly. Every wait also watches the shutdown
//! signal, so the dispatcher never holds up shutdown: an interrupted send stays in the outbox
//! and goes out after the restart.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::{JoinHandle, JoinSet};

use super::channel::{BuiltChannels, Channel};
use super::config::{AlertConfig, ChannelCommon, ChannelKind, RateLimit, RetryConfig};
use super::document::{AlertDocument, HostGroup, Phase};
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

/// Why an alert could not be handed over.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("the alert queue is full")]
    Full(Box<Alert>),
    #[error("the alert dispatcher has stopped")]
    Closed(Box<Alert>),
    #[error("the alert dispatcher has stopped")]
    Stopped,
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
    /// When the status file was last written, for [`Shared::write_status_soon`].
    status_written: Mutex<Option<std::time::Instant>>,
    /// A write was skipped since: the intake's timer catches up.
    status_stale: std::sync::atomic::AtomicBool,
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

    /// [`Shared::write_status`], at most a few times a second: in a burst the status file is
    /// informational and must not cost a write per alert. The intake writes it again at the end.
    fn write_status_soon(&self) {
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

/// What the dispatcher answers once it holds an alert safely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// Fsynced in the outbox, or wanted by no channel, or dropped by the outbox's policy (and
    /// counted): a crash can no longer lose it.
    Durable,
}

/// What travels from the daemon to the dispatcher, in order.
enum Envelope {
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

/// The daemon's handle: hands alerts to the dispatcher and reads its status. Cheap to clone.
/// It stays valid for the whole run: a reload reconfigures the dispatcher in place.
#[derive(Clone)]
pub struct AlertSender {
    tx: mpsc::Sender<Envelope>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for AlertSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlertSender").finish_non_exhaustive()
    }
}

fn closed(e: mpsc::error::SendError<Envelope>) -> SendError {
    match e.0 {
        Envelope::Alert { alert, .. } | Envelope::Evidence(alert) => {
            SendError::Closed(Box::new(alert))
        }
        _ => SendError::Stopped,
    }
}

impl AlertSender {
    /// Hands an alert over, waiting while the queue is full.
    pub async fn send(&self, alert: Alert) -> Result<(), SendError> {
        self.tx
            .send(Envelope::Alert {
                alert,
                hold: None,
                note: None,
                host: None,
                ack: None,
            })
            .await
            .map_err(closed)
    }

    /// Hands an alert over, waiting while the queue is full (back-pressure), and returns what
    /// resolves once the alert is durable. With `hold`, the alert is written at once but not
    /// sent until [`AlertSender::attach_evidence`] brings its evidence or the hold ends.
    pub async fn submit(
        &self,
        alert: Alert,
        hold: Option<Duration>,
        note: Option<String>,
    ) -> Result<oneshot::Receiver<Ack>, SendError> {
        self.submit_host(alert, hold, note, None).await
    }

    /// [`AlertSender::submit`] for an opening page that may stand for several GPUs: with
    /// `host`, the page becomes the host page ([`HostGroup`]) and keeps being one when its
    /// evidence comes. The other GPUs of the group are not handed over.
    pub async fn submit_host(
        &self,
        alert: Alert,
        hold: Option<Duration>,
        note: Option<String>,
        host: Option<HostGroup>,
    ) -> Result<oneshot::Receiver<Ack>, SendError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Envelope::Alert {
                alert,
                hold,
                note,
                host: host.map(Box::new),
                ack: Some(tx),
            })
            .await
            .map_err(closed)?;
        Ok(rx)
    }

    /// The evidence of an alert submitted with a hold (same incident id and phase).
    pub async fn attach_evidence(&self, alert: Alert) -> Result<(), SendError> {
        self.tx
            .send(Envelope::Evidence(alert))
            .await
            .map_err(closed)
    }

    /// Ends the hold of an alert whose runbook will not report, with a note saying why.
    pub async fn release(&self, id: String, note: String) -> Result<(), SendError> {
        self.tx
            .send(Envelope::Release { id, note })
            .await
            .map_err(closed)
    }

    /// Applies a new `[alerts]` config in place: channels whose own settings did not change
    /// keep their worker (and what it is sending); changed ones are rebuilt; removed ones stop.
    /// On error nothing changes. Returns warnings for the log.
    pub async fn reconfigure(
        &self,
        cfg: &AlertConfig,
        built: &BuiltChannels,
    ) -> Result<Vec<String>, AlertError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Envelope::Reconfigure {
                cfg: Box::new(cfg.clone()),
                built: built.clone(),
                reply,
            })
            .await
            .map_err(|_| AlertError::Config(vec!["the alert dispatcher has stopped".into()]))?;
        rx.await
            .map_err(|_| AlertError::Config(vec!["the alert dispatcher has stopped".into()]))?
    }

    /// Hands an alert over without waiting.
    pub fn try_send(&self, alert: Alert) -> Result<(), SendError> {
        self.tx
            .try_send(Envelope::Alert {
                alert,
                hold: None,
                note: None,
                host: None,
                ack: None,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(Envelope::Alert { alert, .. }) => {
                    SendError::Full(Box::new(alert))
                }
                mpsc::error::TrySendError::Closed(env) => closed(mpsc::error::SendError(env)),
                mpsc::error::TrySendError::Full(_) => SendError::Stopped,
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
        for w in cfg.secret_warnings(None) {
            tracing::warn!("{w}");
        }
        let built = BuiltChannels::build(cfg)?;
        Self::start_built(cfg, &built, state_dir, shutdown)
    }

    /// [`Dispatcher::start`] with the channels the config was loaded with (the daemon's way:
    /// the config is checked and its channels built once, when it is loaded).
    pub fn start_built(
        cfg: &AlertConfig,
        built: &BuiltChannels,
        state_dir: &Path,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(AlertSender, JoinHandle<()>), AlertError> {
        let channels: Vec<Arc<Channel>> = built.0.iter().cloned().collect();

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
        let shared = Arc::new(Shared {
            status_written: Mutex::new(None),
            status_stale: Default::default(),
            outbox: Mutex::new(ob),
            stats: Mutex::new(BTreeMap::new()),
            accepted_total: Mutex::new(0),
            status_path: Mutex::new(state_dir.join(STATUS_FILE)),
        });
        let (tx, rx) = mpsc::channel(cfg.queue_capacity.max(1));
        let (retry_tx, _) = watch::channel(cfg.retry.clone());
        let mut intake = Intake {
            rx,
            shared: shared.clone(),
            commons: cfg.channels(),
            handoff: cfg.handoff.clone(),
            workers: BTreeMap::new(),
            retry: retry_tx,
            reports_dir: state_dir.join(REPORTS_DIR),
            keep_reports: cfg.outbox.keep_reports,
            shutdown,
            unpersisted: Vec::new(),
            host_pages: Default::default(),
        };
        for ch in channels {
            intake.spawn_worker(cfg, ch);
        }
        shared.write_status();
        let handle = tokio::spawn(intake.run());
        Ok((AlertSender { tx, shared }, handle))
    }
}

pub(crate) fn now_ms() -> u64 {
    crate::clock::wall_ms()
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

/// One channel's settings as configured: a reload rebuilds the channel only when these change.
#[derive(Clone, PartialEq)]
enum ChannelSpec {
    Stdout(super::config::StdoutConfig),
    Webhook(super::config::WebhookConfig),
    Email(super::config::EmailConfig),
    Alertmanager(super::config::AlertmanagerConfig),
}

fn spec_of(cfg: &AlertConfig, name: &str) -> Option<(ChannelSpec, Option<ChannelCommon>)> {
    let common = cfg.channels().into_iter().find(|c| c.name == name);
    let spec = if name == super::config::STDOUT_CHANNEL {
        ChannelSpec::Stdout(cfg.stdout.clone())
    } else if let Some(w) = cfg.webhook.iter().find(|w| w.name == name) {
        ChannelSpec::Webhook(w.clone())
    } else if let Some(e) = cfg.email.iter().find(|e| e.name == name) {
        ChannelSpec::Email(e.clone())
    } else {
        ChannelSpec::Alertmanager(cfg.alertmanager.iter().find(|a| a.name == name)?.clone())
    };
    Some((spec, common))
}

struct WorkerHandle {
    spec: Option<(ChannelSpec, Option<ChannelCommon>)>,
    notify: Arc<Notify>,
    stop: watch::Sender<bool>,
    join: JoinHandle<()>,
}

struct Intake {
    rx: mpsc::Receiver<Envelope>,
    shared: Arc<Shared>,
    commons: Vec<ChannelCommon>,
    /// `[handoff]`: the drain command put in pages whose guide says to drain.
    handoff: super::handoff::HandoffConfig,
    workers: BTreeMap<String, WorkerHandle>,
    retry: watch::Sender<RetryConfig>,
    reports_dir: PathBuf,
    keep_reports: usize,
    shutdown: watch::Receiver<bool>,
    /// Alerts in memory whose outbox file could not be written yet, with their acks: they are
    /// written again every second, and acknowledged only then.
    unpersisted: Vec<(u64, oneshot::Sender<Ack>)>,
    /// Host pages held for their evidence, by incident id: the evidence rebuilds the document
    /// from the lead's alert alone, and must not turn it back into a one-GPU page. Memory only:
    /// after a restart the evidence never comes (the held page is sent as it was written).
    host_pages: std::collections::HashMap<String, HostGroup>,
}

/// One alert as the intake takes it: the alert, its hold, its note, its acknowledgement.
type Incoming = (
    Alert,
    Option<Duration>,
    Option<String>,
    Option<Box<HostGroup>>,
    Option<oneshot::Sender<Ack>>,
);

/// Alerts written to the outbox together, at most.
const MAX_BATCH: usize = 256;

/// How often alerts that could not be written are tried again.
const PERSIST_RETRY: Duration = Duration::from_millis(500);

impl Intake {
    fn spawn_worker(&mut self, cfg: &AlertConfig, ch: Arc<Channel>) {
        let name = ch.name().to_string();
        let spec = spec_of(cfg, &name);
        let common = spec.as_ref().and_then(|(_, c)| c.clone());
        let notify = Arc::new(Notify::new());
        let (stop, stop_rx) = watch::channel(false);
        lock(&self.shared.stats).insert(
            name.clone(),
            ChannelStatus {
                name: name.clone(),
                kind: ch.kind(),
                queued: 0,
                delivered_total: 0,
                failed_total: 0,
                retries_total: 0,
                last_success_ms: None,
                last_failure_ms: None,
                last_error: None,
            },
        );
        let w = Worker {
            rate: RateLimiter::new(common.and_then(|c| c.rate_limit)),
            channel: ch,
            shared: self.shared.clone(),
            notify: notify.clone(),
            retry: self.retry.subscribe(),
            shutdown: self.shutdown.clone(),
            stop: stop_rx,
        };
        let join = tokio::spawn(w.run());
        self.workers.insert(
            name,
            WorkerHandle {
                spec,
                notify,
                stop,
                join,
            },
        );
    }

    async fn run(mut self) {
        let mut persist_timer = tokio::time::interval(PERSIST_RETRY);
        persist_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let mut sd = self.shutdown.clone();
            tokio::select! {
                biased;
                _ = shutdown_requested(&mut sd) => break,
                msg = self.rx.recv() => match msg {
                    Some(Envelope::Alert { alert, hold, note, host, ack }) => {
                        // A burst: take every alert already waiting and write them together.
                        let mut batch = vec![(alert, hold, note, host, ack)];
                        let mut after = None;
                        while batch.len() < MAX_BATCH {
                            match self.rx.try_recv() {
                                Ok(Envelope::Alert { alert, hold, note, host, ack }) => {
                                    batch.push((alert, hold, note, host, ack))
                                }
                                Ok(other) => {
                                    after = Some(other);
                                    break;
                                }
                                Err(_) => break,
                            }
                        }
                        self.accept_many(batch).await;
                        if let Some(env) = after {
                            self.handle(env).await;
                        }
                    }
                    Some(env) => self.handle(env).await,
                    // Every sender is gone: keep delivering until shutdown.
                    None => {
                        shutdown_requested(&mut sd).await;
                        break;
                    }
                },
                _ = persist_timer.tick() => {
                    self.persist_again().await;
                    if self.shared.status_stale.swap(false, std::sync::atomic::Ordering::Relaxed) {
                        let shared = self.shared.clone();
                        let _ = tokio::task::spawn_blocking(move || shared.write_status()).await;
                    }
                }
            }
        }
        // Persist what was handed over before shutdown; it is sent after the restart.
        self.rx.close();
        while let Ok(env) = self.rx.try_recv() {
            self.handle(env).await;
        }
        self.persist_again().await;
        for (_, w) in std::mem::take(&mut self.workers) {
            let _ = w.stop.send(true);
            let _ = w.join.await;
        }
    }

    async fn handle(&mut self, env: Envelope) {
        match env {
            Envelope::Alert {
                alert,
                hold,
                note,
                host,
                ack,
            } => self.accept_many(vec![(alert, hold, note, host, ack)]).await,
            Envelope::Evidence(alert) => self.attach(alert).await,
            Envelope::Release { id, note } => {
                self.host_pages.remove(&id);
                if lock(&self.shared.outbox).release(&id, &note) {
                    self.wake_all();
                }
            }
            Envelope::Reconfigure { cfg, built, reply } => {
                let _ = reply.send(self.reconfigure(&cfg, &built));
            }
        }
    }

    fn wake_all(&self) {
        for w in self.workers.values() {
            w.notify.notify_one();
        }
    }

    fn reconfigure(
        &mut self,
        cfg: &AlertConfig,
        built: &BuiltChannels,
    ) -> Result<Vec<String>, AlertError> {
        let warnings = cfg.secret_warnings(None);
        // The new config's channels were built when it was loaded; take the new or changed
        // ones, keep the workers of the others.
        let mut rebuilt = Vec::new();
        for c in cfg.channels() {
            let unchanged = self
                .workers
                .get(&c.name)
                .is_some_and(|w| w.spec == spec_of(cfg, &c.name));
            if !unchanged {
                if let Some(ch) = built.get(&c.name) {
                    rebuilt.push(ch);
                }
            }
        }
        let keep: Vec<String> = cfg.channels().into_iter().map(|c| c.name).collect();
        let gone: Vec<String> = self
            .workers
            .keys()
            .filter(|n| !keep.contains(n) || rebuilt.iter().any(|c| c.name() == n.as_str()))
            .cloned()
            .collect();
        for name in gone {
            if let Some(w) = self.workers.remove(&name) {
                // Its in-flight sends stay pending in the outbox; the new worker (if any)
                // sends them again under the same Idempotency-Key.
                let _ = w.stop.send(true);
                w.join.abort();
            }
            if !keep.contains(&name) {
                lock(&self.shared.stats).remove(&name);
            }
        }
        for (id, ch) in lock(&self.shared.outbox).retire_channels(&keep) {
            tracing::error!(incident = %id, channel = %ch, "alert waiting for a channel that is no longer configured; not sent there");
        }
        for ch in rebuilt {
            tracing::info!(channel = %ch.name(), "alert channel (re)built");
            self.spawn_worker(cfg, ch);
        }
        self.commons = cfg.channels();
        self.handoff = cfg.handoff.clone();
        self.keep_reports = cfg.outbox.keep_reports;
        self.retry.send_replace(cfg.retry.clone());
        lock(&self.shared.outbox).set_limits(Limits {
            max_count: cfg.outbox.max_count,
            max_bytes: cfg.outbox.max_bytes,
        });
        self.wake_all();
        Ok(warnings)
    }

    /// Builds the documents, writes them to the outbox together, and acknowledges each.
    async fn accept_many(&mut self, batch: Vec<Incoming>) {
        let now = now_ms();
        let mono = crate::clock::mono_ms();
        let mut acks = Vec::new();
        let mut work = Vec::new();
        for (alert, hold, note, host, ack) in batch {
            let mut doc = AlertDocument::build(&alert);
            doc.evidence_note = note;
            if let Some(g) = host {
                // Kept for the evidence, which rebuilds the document from its alert.
                if hold.is_some() {
                    self.host_pages.insert(doc.id.clone(), (*g).clone());
                }
                doc.apply_host_group(*g);
            }
            doc.handoff = super::handoff::suggest(&self.handoff, &doc);
            let targets: Vec<String> = self
                .commons
                .iter()
                .filter(|c| doc.severity >= c.min_severity)
                .filter(|c| doc.phase != Phase::Resolved || c.send_resolved)
                .map(|c| c.name.clone())
                .collect();
            if targets.is_empty() {
                tracing::debug!(incident = %doc.id, severity = %doc.severity, "alert below every channel's minimum severity; not sent");
                if let Some(a) = ack {
                    let _ = a.send(Ack::Durable);
                }
                continue;
            }
            let held_until =
                hold.map(|h| mono.saturating_add(u64::try_from(h.as_millis()).unwrap_or(u64::MAX)));
            // The readable report is written now, so that a held alert sent without its evidence
            // (the hold ran out, the runbook was stopped) still names a real file; the evidence,
            // when it comes, writes it again under the same name.
            let keep = self.keep_reports;
            work.push((doc, targets, now, held_until, keep));
            acks.push(ack);
        }
        if work.is_empty() {
            return;
        }
        let shared = self.shared.clone();
        let reports_dir = self.reports_dir.clone();
        let result = tokio::task::spawn_blocking(move || {
            let mut ids = Vec::new();
            let mut items = Vec::new();
            for (mut doc, targets, now, held_until, keep) in work {
                keep_report(&reports_dir, &mut doc, keep);
                ids.push(doc.id.clone());
                items.push((doc, targets, now, held_until));
            }
            let pushed = lock(&shared.outbox).push_many(items);
            shared.write_status_soon();
            ids.into_iter().zip(pushed).collect::<Vec<_>>()
        })
        .await;
        let results = match result {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("alert intake failed: {e}");
                return;
            }
        };
        for ((id, pushed), ack) in results.into_iter().zip(acks) {
            self.settle(id, pushed, ack);
        }
    }

    fn settle(&mut self, id: String, pushed: outbox::Pushed, ack: Option<oneshot::Sender<Ack>>) {
        for d in &pushed.dropped {
            tracing::error!(incident = %d.id, severity = %d.severity, "alert outbox full: dropped alert \"{}\"; the next alert reports the count", d.headline);
        }
        match (&pushed.write_error, pushed.seq) {
            (Some(e), Some(seq)) => {
                crate::state::log_write_error("outbox", &format!(
                    "cannot write the alert outbox ({e}); alert {id} is sent from memory and written again every second"
                ));
                if let Some(a) = ack {
                    self.unpersisted.push((seq, a));
                }
            }
            _ => {
                if let Some(e) = &pushed.write_error {
                    crate::state::log_write_error(
                        "outbox",
                        &format!("cannot write the alert outbox: {e}"),
                    );
                }
                if let Some(a) = ack {
                    let _ = a.send(Ack::Durable);
                }
            }
        }
        if pushed.seq.is_some() {
            *lock(&self.shared.accepted_total) += 1;
            self.wake_all();
        }
    }

    /// Writes again the alerts that could not be written; acknowledges those that now are.
    async fn persist_again(&mut self) {
        if self.unpersisted.is_empty() {
            return;
        }
        let shared = self.shared.clone();
        let seqs: Vec<u64> = self.unpersisted.iter().map(|(s, _)| *s).collect();
        let results = tokio::task::spawn_blocking(move || {
            let mut ob = lock(&shared.outbox);
            seqs.into_iter().map(|s| ob.persist(s)).collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let waiting = std::mem::take(&mut self.unpersisted);
        for ((seq, ack), r) in waiting.into_iter().zip(
            results
                .into_iter()
                .map(Some)
                .chain(std::iter::repeat_with(|| None)),
        ) {
            match r {
                Some(Ok(_)) => {
                    let _ = ack.send(Ack::Durable);
                }
                Some(Err(e)) => {
                    crate::state::log_write_error(
                        "outbox",
                        &format!("cannot write the alert outbox ({e})"),
                    );
                    self.unpersisted.push((seq, ack));
                }
                None => self.unpersisted.push((seq, ack)),
            }
        }
    }

    async fn attach(&mut self, alert: Alert) {
        let mut doc = AlertDocument::build(&alert);
        if let Some(g) = self.host_pages.remove(&doc.id) {
            doc.apply_host_group(g);
        }
        doc.handoff = super::handoff::suggest(&self.handoff, &doc);
        let shared = self.shared.clone();
        let reports_dir = self.reports_dir.clone();
        let keep = self.keep_reports;
        let done = tokio::task::spawn_blocking(move || {
            keep_report(&reports_dir, &mut doc, keep);
            let id = doc.id.clone();
            let r = lock(&shared.outbox).attach(doc);
            shared.write_status();
            (id, r)
        })
        .await;
        match done {
            Ok((_, Some((_, None)))) => self.wake_all(),
            Ok((id, Some((_, Some(e))))) => {
                crate::state::log_write_error("outbox", &format!(
                    "cannot write the evidence of alert {id} to the outbox ({e}); it is sent from memory"
                ));
                self.wake_all();
            }
            Ok((id, None)) => {
                tracing::debug!(incident = %id, "evidence for an alert no longer held (sent, dropped or filtered)")
            }
            Err(e) => tracing::error!("alert intake failed: {e}"),
        }
    }
}

/// Writes the readable report beside the outbox when asked to, and notes where in the document.
fn keep_report(dir: &Path, doc: &mut AlertDocument, keep: usize) {
    if keep == 0 {
        return;
    }
    let name = format!("{}.txt", doc.file_stem());
    let path = dir.join(&name);
    doc.report_path = Some(path.display().to_string());
    if let Err(e) = write_report(dir, &name, doc, keep) {
        doc.report_path = None;
        tracing::warn!(incident = %doc.id, "cannot keep the full report on the host: {e}");
    }
}

/// Writes the full report under `dir` and keeps only the newest `keep` reports.
fn write_report(dir: &Path, name: &str, doc: &AlertDocument, keep: usize) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)?;
    // A copy for people on the host, not a record the promise rests on (the outbox is): written
    // whole through a rename, without a flush to disk, so a burst does not wait on the disk.
    crate::state::write_atomic_as(
        &dir.join(name),
        report::render(doc).as_bytes(),
        crate::state::STATE_FILE_MODE,
        crate::state::Durability::Atomic,
    )?;
    // Prune at most once a second: listing the folder for every alert of a burst costs more
    // than the alerts.
    static LAST_PRUNE: AtomicU64 = AtomicU64::new(0);
    let now = crate::clock::mono_ms();
    let last = LAST_PRUNE.load(Ordering::Relaxed);
    if now.saturating_sub(last) < 1000 && last != 0 {
        return Ok(());
    }
    LAST_PRUNE.store(now, Ordering::Relaxed);
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
    channel: Arc<Channel>,
    shared: Arc<Shared>,
    notify: Arc<Notify>,
    rate: RateLimiter,
    retry: watch::Receiver<RetryConfig>,
    shutdown: watch::Receiver<bool>,
    /// This worker alone stops (its channel was removed or rebuilt by a reload).
    stop: watch::Receiver<bool>,
}

/// Sends to one channel at the same time, at most: a receiver that accepts a request and never
/// answers holds one of these until the request times out, not the whole queue.
const MAX_IN_FLIGHT: usize = 4;

/// One finished attempt.
struct Attempt {
    seq: u64,
    doc: Arc<AlertDocument>,
    attempts: u32,
    enqueued_ms: u64,
    result: Result<(), super::DeliveryError>,
}

impl Worker {
    async fn run(mut self) {
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
                let (now, mono) = (now_ms(), crate::clock::mono_ms());
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
            let wait = rate_wait.or_else(|| {
                lock(&self.shared.outbox).next_wait(&name, now_ms(), crate::clock::mono_ms(), &busy)
            });
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

    async fn finish(&self, name: &str, a: Attempt) {
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
    fn outcome(
        &self,
        name: &str,
        doc: &AlertDocument,
        result: Result<(), super::DeliveryError>,
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
