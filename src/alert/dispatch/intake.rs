//! The intake task: builds each page once, writes it to the outbox (and the full report on the
//! host), acknowledges it, and starts, keeps or stops one worker per channel across reloads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::JoinHandle;

use super::shared::{
    lock, mono_ms, now_ms, shutdown_requested, Ack, ChannelStatus, Envelope, Shared,
};
use super::worker::{RateLimiter, Worker};
use crate::alert::channel::{BuiltChannels, Channel};
use crate::alert::config::{AlertConfig, ChannelSettings};
use crate::alert::document::build::PageBuilder;
use crate::alert::document::{AlertDocument, HostGroup, Phase};
use crate::alert::error::AlertError;
use crate::alert::input::Alert;
use crate::alert::outbox::{self, Limits};
use crate::alert::report;
use crate::alert::retry::RetryConfig;
use crate::alert::sink::ChannelCommon;

/// A channel's settings and its name, filter and rate limit, as configured: a reload rebuilds
/// the channel only when these change.
pub(super) fn spec_of(
    cfg: &AlertConfig,
    name: &str,
) -> Option<(ChannelSettings, Option<ChannelCommon>)> {
    let common = cfg.channels().into_iter().find(|c| c.name == name);
    Some((cfg.settings(name)?, common))
}

pub(super) struct WorkerHandle {
    pub(super) spec: Option<(ChannelSettings, Option<ChannelCommon>)>,
    pub(super) notify: Arc<Notify>,
    pub(super) stop: watch::Sender<bool>,
    pub(super) join: JoinHandle<()>,
}

pub(super) struct Intake {
    pub(super) rx: mpsc::Receiver<Envelope>,
    pub(super) shared: Arc<Shared>,
    pub(super) commons: Vec<ChannelCommon>,
    /// Builds every page (with `[handoff]`'s drain command where the fault takes the GPU out of service).
    pub(super) pages: PageBuilder,
    pub(super) workers: BTreeMap<String, WorkerHandle>,
    pub(super) retry: watch::Sender<RetryConfig>,
    pub(super) reports_dir: PathBuf,
    pub(super) keep_reports: usize,
    pub(super) shutdown: watch::Receiver<bool>,
    /// Alerts in memory whose outbox file could not be written yet, with their acks: they are
    /// written again every second, and acknowledged only then.
    pub(super) unpersisted: Vec<(u64, oneshot::Sender<Ack>)>,
    /// Host pages held for their evidence, by incident id: the evidence rebuilds the document
    /// from the lead's alert alone, and must not turn it back into a one-GPU page. Memory only:
    /// after a restart the evidence never comes (the held page is sent as it was written).
    pub(super) host_pages: std::collections::HashMap<String, HostGroup>,
}

/// One alert as the intake takes it: the alert, its hold, its note, its acknowledgement.
pub(super) type Incoming = (
    Alert,
    Option<Duration>,
    Option<String>,
    Option<Box<HostGroup>>,
    Option<oneshot::Sender<Ack>>,
);

/// Alerts written to the outbox together, at most.
pub(super) const MAX_BATCH: usize = 256;

/// How often alerts that could not be written are tried again.
pub(super) const PERSIST_RETRY: Duration = Duration::from_millis(500);

impl Intake {
    pub(super) fn spawn_worker(&mut self, cfg: &AlertConfig, ch: Arc<Channel>) {
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

    pub(super) async fn run(mut self) {
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

    pub(super) async fn handle(&mut self, env: Envelope) {
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

    pub(super) fn wake_all(&self) {
        for w in self.workers.values() {
            w.notify.notify_one();
        }
    }

    pub(super) fn reconfigure(
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
        self.pages = PageBuilder::new(cfg.handoff.clone());
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
    pub(super) async fn accept_many(&mut self, batch: Vec<Incoming>) {
        let now = now_ms();
        let mono = mono_ms();
        let mut acks = Vec::new();
        let mut work = Vec::new();
        for (alert, hold, note, host, ack) in batch {
            let host = host.map(|g| *g);
            // Kept for the evidence, which rebuilds the document from its alert.
            if let (Some(g), Some(_)) = (&host, hold) {
                self.host_pages.insert(alert.incident.id.clone(), g.clone());
            }
            let doc = self.pages.page(&alert, note, host);
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

    pub(super) fn settle(
        &mut self,
        id: String,
        pushed: outbox::Pushed,
        ack: Option<oneshot::Sender<Ack>>,
    ) {
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
    pub(super) async fn persist_again(&mut self) {
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

    pub(super) async fn attach(&mut self, alert: Alert) {
        let host = self.host_pages.remove(&alert.incident.id);
        let mut doc = self.pages.page(&alert, None, host);
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
pub(super) fn keep_report(dir: &Path, doc: &mut AlertDocument, keep: usize) {
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
pub(super) fn write_report(
    dir: &Path,
    name: &str,
    doc: &AlertDocument,
    keep: usize,
) -> std::io::Result<()> {
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
    let now = mono_ms();
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
