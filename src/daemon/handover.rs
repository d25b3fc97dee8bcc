//! The hand-over: where incidents leave the pipeline. JSON on standard output with `--json`;
//! the alert stage, which makes each alert durable at once (its acknowledgement comes back to
//! the checkpoint's [`Acks`]); and the runbooks. A new incident's alert is held in the outbox
//! while its runbook runs (bounded concurrency, off the processing loop), and the evidence is
//! attached when it is done; a digest goes straight out, so a storm never runs a runbook per
//! line. [`Emitter::emit_all`] is the one place an incident is handed over.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use super::checkpoint::Acks;
use super::options::Output;
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
    pub(super) log: std::collections::VecDeque<crate::runbook::LogLine>,
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

/// "6 h", "90 min", "45 s": the look-back as people read it.
fn lookback_words(secs: u64) -> String {
    if secs >= 3600 && secs.is_multiple_of(3600) {
        format!("{} h", secs / 3600)
    } else if secs >= 60 && secs.is_multiple_of(60) {
        format!("{} min", secs / 60)
    } else {
        format!("{secs} s")
    }
}

/// The note on the first page after start-up, as evidence of its own so every channel shows it.
fn before_lookback_evidence(note: &str, host: &str) -> crate::model::Evidence {
    use crate::model::{StepResult, StepStatus};
    crate::model::Evidence {
        runbook: "startup-lookback".into(),
        meaning: String::new(),
        next_steps: String::new(),
        steps: vec![StepResult {
            name: "older faults at start-up".into(),
            kind: "note".into(),
            target: Vec::new(),
            status: StepStatus::Done { exit_code: None },
            output: format!("{note}\n"),
            bytes_dropped: 0,
            duration_ms: 0,
            notes: vec![note.to_string()],
        }],
        started_ms: now_ms(),
        duration_ms: 0,
        host: host.to_string(),
    }
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
            log: std::collections::VecDeque::with_capacity(LOG_RING),
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
        if self.before_lookback == 0 || self.told_before_lookback {
            return None;
        }
        let n = self.before_lookback;
        Some(format!(
            "{n} older fault{s} found at start-up (before the {} look-back) {were} recorded, not paged: see xidwatch history",
            lookback_words(self.lookback_secs),
            s = if n == 1 { "" } else { "s" },
            were = if n == 1 { "was" } else { "were" },
        ))
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

    /// Keeps a kernel log line for runbook excerpts. Once the ring is full, the oldest line's
    /// text buffer takes the new line: no allocation per record on the daemon's hot path.
    pub(super) fn remember(&mut self, seq: u64, ts_usec: u64, text: &str) {
        let mut buf = match self.log.len() {
            LOG_RING.. => self.log.pop_front().map(|l| l.text).unwrap_or_default(),
            _ => String::new(),
        };
        buf.clear();
        buf.push_str(text);
        self.log.push_back(crate::runbook::LogLine {
            seq: Some(seq),
            ts_usec: Some(ts_usec),
            text: buf,
        });
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
        let mut groups = host_groups(incidents, &self.env.sysfs_root);
        for inc in incidents.drain(..) {
            let opened = inc.phase == crate::model::IncidentPhase::Opened && !inc.test;
            let (host, members) = match groups.remove(&inc.id) {
                Some(HostRole::Lead(g, members)) => (Some(g), members),
                Some(HostRole::Folded(lead)) => {
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
                        lookback_words(self.lookback_secs)
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
                    evidence.push(before_lookback_evidence(&note, &inc.host));
                }
            }
            let alert = crate::alert::Alert {
                catalog,
                evidence,
                gpu_state: Some(state_doc(&self.tel, inc.pci)),
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
        let lines: Vec<_> = self.log.iter().cloned().collect();
        let subject_of = |inc: &Incident| {
            let first_seq = inc.findings.first().and_then(|f| f.origin.seq);
            let anchor = first_seq.and_then(|s| lines.iter().rposition(|l| l.seq == Some(s)));
            crate::runbook::Subject::from(inc).with_kernel_log(lines.clone(), anchor)
        };
        let grouped = !members.is_empty();
        let subjects: Vec<(Option<crate::model::PciAddress>, crate::runbook::Subject)> =
            std::iter::once(&alert.incident)
                .chain(members.iter())
                .map(|i| (i.pci, subject_of(i)))
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
            // Every GPU's runbook at once, each under a permit (so the bound on runbooks
            // running holds), in the group's order.
            let run = futures_util::future::join_all(subjects.iter().map(|(pci, subject)| {
                let (set, env, permits) = (&set, &env, &permits);
                async move {
                    let ev = match permits.clone().acquire_owned().await {
                        Ok(_permit) => set.run_for(subject, env, &limits).await,
                        Err(_) => None,
                    };
                    (*pci, ev)
                }
            }));
            let stopped = async {
                let _ = stop.wait_for(|stop| *stop).await;
            };
            let found = tokio::select! {
                ev = run => ev,
                () = stopped => {
                    tracing::warn!("shutting down: incident {} is alerted without its runbook's evidence", alert.incident.id);
                    let note = "xidwatch stopped while this incident's runbook ran: the alert is sent without its evidence".to_string();
                    if let Err(e) = sender.release(alert.incident.id.clone(), note).await {
                        tracing::debug!("alert stage: {e}");
                    }
                    return;
                }
            };
            let mut runs = Vec::new();
            for (pci, ev) in found {
                let Some(mut ev) = ev else { continue };
                let ok = !ev.steps.iter().any(|s| {
                    matches!(
                        s.status,
                        crate::model::StepStatus::Failed { .. }
                            | crate::model::StepStatus::TimedOut { .. }
                    )
                });
                tel.runbook_run(&ev.runbook, Duration::from_millis(ev.duration_ms), ok);
                if let (true, Some(pci)) = (grouped, pci) {
                    // One page, several GPUs' evidence: each says whose it is.
                    ev.runbook = format!("{} ({pci})", ev.runbook);
                }
                runs.push(ev);
            }
            alert.evidence = pages::merge(std::mem::take(&mut alert.evidence), runs);
            if let Err(e) = sender.attach_evidence(alert).await {
                tracing::error!("alert stage: {e}");
            }
        });
    }
}

/// The verdict's word on `pci`'s GPU (the host's for a host-level incident) as of now, the one
/// `status` and `npd-check` would give, for the page.
fn state_doc(
    tel: &Telemetry,
    pci: Option<crate::model::PciAddress>,
) -> crate::alert::gpu_state::GpuStateDoc {
    let judged = tel.with_open(|open, up| crate::verdict::judge_one(open, up, pci));
    crate::alert::gpu_state::GpuStateDoc {
        state: judged.state.as_str().to_string(),
        reasons: judged.reasons.iter().map(|r| r.title.clone()).collect(),
        incidents: judged.incidents,
    }
}

/// What an opening incident is in a host page.
enum HostRole {
    /// It carries the host page, and the other GPUs' incidents, whose runbooks run with its own.
    Lead(crate::alert::document::HostGroup, Vec<Incident>),
    /// Its opening page is folded into the host page with this incident id.
    Folded(String),
}

/// The host pages of a batch, as the engine marked them ([`Incident::host_page`]: the same
/// critical fault opening on several GPUs together): the lead carries the group, the others
/// fold into it. Keyed by incident id. A member whose lead is not in the batch (which the engine
/// never does) is paged on its own rather than lost.
fn host_groups(
    incidents: &[Incident],
    sysfs_root: &std::path::Path,
) -> std::collections::HashMap<String, HostRole> {
    use crate::model::IncidentPhase;
    let opened = |i: &&Incident| i.phase == IncidentPhase::Opened && !i.test;
    let mut members: std::collections::BTreeMap<&str, Vec<&Incident>> = Default::default();
    for inc in incidents.iter().filter(opened) {
        if let Some(lead) = &inc.host_page {
            members.entry(lead.as_str()).or_default().push(inc);
        }
    }
    let mut out = std::collections::HashMap::new();
    for (lead_id, others) in members {
        let Some(lead) = incidents.iter().filter(opened).find(|i| i.id == lead_id) else {
            continue;
        };
        for o in &others {
            out.insert(o.id.clone(), HostRole::Folded(lead.id.clone()));
        }
        let g = crate::alert::document::HostGroup::new(lead, &others, sysfs_root);
        let others = others.into_iter().cloned().collect();
        out.insert(lead.id.clone(), HostRole::Lead(g, others));
    }
    out
}

pub use crate::alert::input::catalog_text;
pub use crate::config::env::runbook_env;
