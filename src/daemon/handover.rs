//! The hand-over: where incidents leave the pipeline. JSON on standard output with `--json`;
//! the alert stage, which makes each alert durable at once (its acknowledgement comes back to
//! the checkpoint's [`Acks`]); and the runbooks. A new incident's alert is held in the outbox
//! while its runbook runs (bounded concurrency, off the processing loop), and the evidence is
//! attached when it is done; a digest goes straight out, so a storm never runs a runbook per
//! line. [`Emitter::emit_all`] is the one place an incident is handed over.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use super::options::Output;
use crate::alert::dispatch::Acks;
use crate::config::Config;
use crate::history::pages::{self, Pages};
use crate::model::Incident;
use crate::status::telemetry::Telemetry;

fn now_ms() -> u64 {
    crate::clock::wall_ms()
}

/// Kernel log lines kept for runbook excerpts ("the kernel log around the incident").
const LOG_RING: usize = 2000;

/// Hands incidents on: JSON on standard output with `--json`; to the alert stage, which makes
/// each alert durable at once (the acknowledgement comes back to [`Acks`]); and to the runbooks.
/// A new incident's alert is held in the outbox while its runbook runs (bounded concurrency, off
/// the processing loop), and the evidence is attached when it is done; a digest goes straight
/// out, so a storm never runs a runbook per line.
pub(super) struct Emitter {
    pub(super) output: Output,
    pub(super) stdout: std::io::Stdout,
    pub(super) alerts: crate::alert::AlertSender,
    pub(super) runbooks: Arc<crate::runbook::RunbookSet>,
    pub(super) env: crate::runbook::RunbookEnv,
    pub(super) limits: crate::runbook::RunLimits,
    pub(super) permits: Arc<tokio::sync::Semaphore>,
    /// `[runbooks] max_parallel_runbooks`: the permits, for how long a host page waits.
    pub(super) parallel: usize,
    pub(super) log: crate::runbook::LogRing,
    pub(super) tel: Arc<Telemetry>,
    /// Runbooks running (or waiting to run) for new incidents.
    pub(super) tasks: tokio::task::JoinSet<()>,
    /// Tells running runbooks to give up (shutdown).
    pub(super) stop_runbooks: tokio::sync::watch::Sender<bool>,
    /// The GPU's history and inventory diff, put on each page beside the runbook's evidence.
    pub(super) pages: Option<Pages>,
    /// `[kmsg] lookback_secs`, for the note.
    pub(super) lookback_secs: u64,
    /// Incidents opened before the look-back at start-up: recorded, not paged.
    pub(super) before_lookback: u64,
    /// Whether a page already carried the note about them: said once.
    pub(super) told_before_lookback: bool,
}

/// New incidents waiting for (or running) their runbook, at most; past this an incident's alert
/// goes out at once without evidence (and says so) rather than queue excerpts without bound.
const MAX_WAITING_RUNBOOKS: usize = 64;

/// How long shutdown waits for runbook tasks to hand their evidence over.
const RUNBOOK_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How long past a runbook's budget its alert stays held, in case the task itself is lost.
const HOLD_GRACE: Duration = Duration::from_secs(15);

impl Emitter {
    /// An emitter for the config: nothing handed over yet, the runbooks as [`Emitter::configure`]
    /// builds them.
    pub(super) fn new(
        cfg: &Config,
        output: Output,
        alerts: crate::alert::AlertSender,
        tel: Arc<Telemetry>,
    ) -> Emitter {
        let mut out = Emitter {
            lookback_secs: cfg.kmsg.lookback_secs,
            before_lookback: 0,
            told_before_lookback: false,
            output,
            stdout: std::io::stdout(),
            alerts,
            runbooks: cfg.runbook_set.clone(),
            env: runbook_env(cfg),
            limits: cfg.runbook_limits,
            permits: Arc::new(tokio::sync::Semaphore::new(1)),
            parallel: 1,
            log: crate::runbook::LogRing::new(LOG_RING),
            tel,
            pages: None,
            tasks: tokio::task::JoinSet::new(),
            stop_runbooks: tokio::sync::watch::channel(false).0,
        };
        out.configure(cfg);
        out
    }

    /// The runbook parts from a config: at start-up and, swapped in, on reload. Runbook `nvml`
    /// steps keep the NVML handle they were given (NVML is not reloaded).
    pub(super) fn configure(&mut self, cfg: &Config) {
        self.runbooks = cfg.runbook_set.clone();
        let nvml = self.env.nvml.take();
        self.env = runbook_env(cfg);
        self.env.nvml = nvml;
        self.limits = cfg.runbook_limits;
        self.permits = Arc::new(tokio::sync::Semaphore::new(
            cfg.runbooks.max_parallel_runbooks(),
        ));
        self.parallel = cfg.runbooks.max_parallel_runbooks();
    }

    /// What the first page after start-up says about the old faults it did not page, once.
    fn before_lookback_note(&self) -> Option<String> {
        (self.before_lookback > 0 && !self.told_before_lookback).then(|| {
            crate::alert::document::older_faults_note(self.before_lookback, self.lookback_secs)
        })
    }

    /// Stops waiting runbooks and lets every task hand its evidence (or its release) over.
    pub(super) async fn finish(&mut self) {
        let _ = self.stop_runbooks.send(true);
        let drained = tokio::time::timeout(RUNBOOK_SHUTDOWN_GRACE, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("runbook tasks did not finish in time; their alerts go out without evidence after the restart");
            self.tasks.abort_all();
        }
    }

    /// Keeps a kernel log line for runbook excerpts.
    pub(super) fn remember(&mut self, seq: u64, ts_usec: u64, text: &str) {
        self.log.remember(seq, ts_usec, text);
    }

    /// Hands every incident over. Waits while the alert stage's queue is full (back-pressure
    /// reaches the kernel log reader); each alert's acknowledgement goes into `acks`.
    pub(super) async fn emit_all(&mut self, incidents: &mut Vec<Incident>, acks: &mut Acks) {
        if incidents.is_empty() {
            return;
        }
        for inc in incidents.iter() {
            self.tel.record_incident(inc);
            // Counted before any page of the batch goes out: old and recent faults read at
            // start-up are released together, and the page must count all the old ones.
            if inc.before_lookback && inc.phase == crate::model::IncidentPhase::Opened && !inc.test
            {
                self.before_lookback += 1;
            }
        }
        if self.output == Output::Json {
            let mut lock = self.stdout.lock();
            for inc in incidents.iter() {
                let _ = serde_json::to_writer(&mut lock, inc)
                    .map_err(std::io::Error::from)
                    .and_then(|_| lock.write_all(b"\n"));
            }
            let _ = lock.flush();
        }
        while self.tasks.try_join_next().is_some() {}
        let mut groups = crate::alert::document::host_roles(incidents, &self.env.sysfs_root);
        for inc in incidents.drain(..) {
            let opened = inc.phase == crate::model::IncidentPhase::Opened && !inc.test;
            let (host, members) = match groups.remove(&inc.id) {
                Some(crate::alert::document::HostRole::Lead(g, members)) => (Some(g), members),
                Some(crate::alert::document::HostRole::Folded(lead)) => {
                    // Its own incident and history go on; its opening page is the host page.
                    if let Some(p) = &self.pages {
                        p.annotate(&inc);
                    }
                    tracing::info!(
                        "incident {} ({}) opened with others on this host: paged in host page {lead}",
                        inc.id,
                        inc.title
                    );
                    continue;
                }
                None => (None, Vec::new()),
            };
            if inc.before_lookback {
                // An old fault read at start-up: into the history (and status, above), no page.
                if opened {
                    if let Some(p) = &self.pages {
                        p.annotate(&inc);
                    }
                    tracing::info!(
                        "incident {} ({}) was logged before the {} look-back: recorded, not paged",
                        inc.id,
                        inc.title,
                        crate::clock::duration_words(self.lookback_secs.saturating_mul(1000))
                    );
                }
                continue;
            }
            let catalog = Some(catalog_text(&inc));
            let mut evidence = self
                .pages
                .as_ref()
                .map(|p| p.annotate(&inc))
                .unwrap_or_default();
            if opened {
                if let Some(note) = self.before_lookback_note() {
                    self.told_before_lookback = true;
                    evidence.push(crate::model::Evidence::note(
                        "startup-lookback",
                        "older faults at start-up",
                        &note,
                        &inc.host,
                        now_ms(),
                    ));
                }
            }
            let alert = crate::alert::Alert {
                catalog,
                evidence,
                gpu_state: Some(
                    self.tel
                        .with_open(|open, up| crate::verdict::gpu_state_doc(open, up, inc.pci)),
                ),
                incident: inc,
            };
            if !opened {
                acks.submitted(self.alerts.submit(alert, None, None).await);
                continue;
            }
            if self.tasks.len() >= MAX_WAITING_RUNBOOKS {
                tracing::warn!(
                    "{} runbooks waiting: incident {} is alerted without evidence",
                    self.tasks.len(),
                    alert.incident.id
                );
                let note = format!(
                    "no evidence: {} runbooks were already waiting when this incident opened",
                    self.tasks.len()
                );
                acks.submitted(self.alerts.submit_host(alert, None, Some(note), host).await);
                continue;
            }
            // A host page waits for every GPU's runbook; they share the runbook permits, so
            // as many budgets as rounds of them.
            let rounds = (members.len() + 1).div_ceil(self.parallel.max(1)) as u32;
            let hold = self
                .limits
                .max_budget
                .saturating_mul(rounds)
                .saturating_add(HOLD_GRACE);
            acks.submitted(
                self.alerts
                    .submit_host(alert.clone(), Some(hold), None, host)
                    .await,
            );
            self.spawn_runbook(alert, members);
        }
    }

    /// Runs the incident's runbook off the loop and attaches its evidence to the held alert.
    /// For a host page, `members` are the other GPUs' incidents: each one's runbook runs too
    /// (its placeholders are that GPU's), and every GPU's evidence goes on the one page, named
    /// by its GPU.
    fn spawn_runbook(&mut self, mut alert: crate::alert::Alert, members: Vec<Incident>) {
        let lines = self.log.lines();
        let subjects: Vec<crate::runbook::Subject> = std::iter::once(&alert.incident)
            .chain(members.iter())
            .map(|i| crate::runbook::Subject::from(i).with_recent_log(lines.clone()))
            .collect();
        let (set, env, limits, permits, tel, sender) = (
            self.runbooks.clone(),
            self.env.clone(),
            self.limits,
            self.permits.clone(),
            self.tel.clone(),
            self.alerts.clone(),
        );
        let mut stop = self.stop_runbooks.subscribe();
        self.tasks.spawn(async move {
            let stopped = async {
                let _ = stop.wait_for(|stop| *stop).await;
            };
            let runs = tokio::select! {
                runs = set.run_each(&subjects, &env, &limits, &permits, |ev| {
                    tel.runbook_run(&ev.runbook, Duration::from_millis(ev.duration_ms), ev.ran_clean());
                }) => runs,
                () = stopped => {
                    tracing::warn!("shutting down: incident {} is alerted without its runbook's evidence", alert.incident.id);
                    let note = "xidwatch stopped while this incident's runbook ran: the alert is sent without its evidence".to_string();
                    if let Err(e) = sender.release(alert.incident.id.clone(), note).await {
                        tracing::debug!("alert stage: {e}");
                    }
                    return;
                }
            };
            alert.evidence = pages::merge(std::mem::take(&mut alert.evidence), runs);
            if let Err(e) = sender.attach_evidence(alert).await {
                tracing::error!("alert stage: {e}");
            }
        });
    }
}

pub use crate::alert::input::catalog_text;
pub use crate::config::env::runbook_env;
