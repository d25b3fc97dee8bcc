//! The daemon's side of NVML: starts the NVML worker, waits a bounded time for its inventory, runs
//! the lost-GPU probe off the pipeline's task, and turns what both report into findings.
//!
//! Nothing here calls NVML on the runtime thread: the pipeline only ever receives values
//! ([`NvmlMsg`]) from a channel, so a wedged driver delays no kernel-log finding and no watchdog
//! ping. What the worker reports about itself (stuck, answering again, a late inventory) is logged
//! and shown in the status here.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::mpsc;

use super::probe::Probe;
use super::telemetry::{GpuSummary, Telemetry};
use super::SourceStats;
use crate::classify::Classifier;
use crate::config::Config;
use crate::incident::Origin;
use crate::model::Finding;
use crate::source::nvml::{CallError, GpuInfo, NvmlEvent, NvmlWorker, Opened, WorkerOptions};

/// How long NVML's init may take before the driver counts as unresponsive. The kernel log (and
/// READY=1) waits for it at most `nvml.call_timeout_secs`, never longer than this; an init that
/// answers later still brings its inventory.
pub const NVML_OPEN_LIMIT: Duration = Duration::from_secs(20);

/// Events between the worker and the pipeline; the worker waits (briefly) when it is full.
const EVENT_QUEUE: usize = 256;

/// What reaches the pipeline from NVML and the probe.
#[derive(Debug)]
pub enum NvmlMsg {
    Event(NvmlEvent),
    /// One probe round's findings (GPUs missing from NVML's view or gone from the bus), and
    /// what the probe remembers after it (saved with the daemon's checkpoint).
    Probe(
        Vec<Finding>,
        super::probe::Memory,
        Option<crate::incident::Verification>,
    ),
    /// One health round's findings (checks, the GPU count), its verified ends (checks that
    /// pass again, whose incidents end: [`NvmlLink::take_verified`]) and its gauges.
    Health(Vec<Finding>, Vec<Finding>, super::telemetry::HealthGauges),
}

/// NVML as the daemon holds it.
pub struct NvmlLink {
    worker: Option<NvmlWorker>,
    /// NVML has answered its init (in time or late).
    opened: bool,
    inventory: Vec<GpuInfo>,
    rx: mpsc::Receiver<NvmlMsg>,
    probe: tokio::task::JoinHandle<()>,
    /// What the probe remembers, as of its last round: a GPU that stays missing across a
    /// restart is not reported again.
    pub probe_memory: super::probe::Memory,
    health: tokio::task::JoinHandle<()>,
    /// The history and inventory diff every page carries.
    pages: super::health::Pages,
    /// Verified ends of health checks from the last [`NvmlLink::handle`], for the pipeline to
    /// end their incidents with (after that round's findings).
    verified: Vec<Finding>,
    /// The last probe round NVML answered, for the pipeline to end lost-GPU incidents with.
    lost_check: Option<crate::incident::Verification>,
}

/// Starts NVML (when enabled) and the probe. Waits for NVML's init at most the call timeout
/// (capped at [`NVML_OPEN_LIMIT`]); returns the findings to report at once (NVML that cannot be
/// used).
pub async fn start(
    cfg: &Config,
    tel: &Telemetry,
    classifier: &mut Classifier,
    stats: &mut SourceStats,
    probe_memory: Option<super::probe::Memory>,
    boot_hex: &str,
) -> anyhow::Result<(NvmlLink, Vec<Finding>)> {
    let (tx, rx) = mpsc::channel::<NvmlMsg>(EVENT_QUEUE);
    let mut link = NvmlLink {
        worker: None,
        opened: false,
        inventory: Vec::new(),
        rx,
        probe: tokio::spawn(async {}),
        probe_memory: probe_memory.clone().unwrap_or_default(),
        health: tokio::spawn(async {}),
        pages: super::health::Pages::open(cfg.state_dir.clone(), cfg.history.clone()),
        verified: Vec::new(),
        lost_check: None,
    };
    let mut now = Vec::new();
    if cfg.nvml.enabled {
        let (etx, erx) = std::sync::mpsc::sync_channel::<NvmlEvent>(EVENT_QUEUE);
        let worker = NvmlWorker::spawn(
            WorkerOptions {
                library: cfg.nvml.library.clone(),
                call_timeout: Duration::from_secs(cfg.nvml.call_timeout_secs),
                open_timeout: NVML_OPEN_LIMIT,
                procfs_root: cfg.nvml.procfs_root.clone(),
            },
            etx,
        )
        .context("starting the NVML worker")?;
        let bridge = tx.clone();
        std::thread::Builder::new()
            .name("xidwatch-nvml-bridge".into())
            .spawn(move || {
                while let Ok(ev) = erx.recv() {
                    if bridge.blocking_send(NvmlMsg::Event(ev)).is_err() {
                        break;
                    }
                }
            })
            .context("starting the NVML bridge")?;
        // The kernel log waits for NVML's GPU identities at most as long as one NVML call may
        // take; a longer init goes on, and is a stuck driver only past NVML_OPEN_LIMIT.
        let w = worker.clone();
        let hold = Duration::from_secs(cfg.nvml.call_timeout_secs).min(NVML_OPEN_LIMIT);
        let opened = tokio::task::spawn_blocking(move || w.wait_open_for(hold))
            .await
            .unwrap_or(Err(CallError::Closed));
        match opened {
            Ok(o) => {
                link.learn(o, tel, classifier, stats);
                link.worker = Some(worker);
            }
            Err(CallError::Failed(failure)) => {
                // The worker has ended: runbook `nvml` steps are skipped, the probe compares the
                // bus only.
                tracing::warn!(
                    "NVML unavailable: {}; watching the kernel log only",
                    failure.describe()
                );
                tel.set_nvml(false, &failure.describe());
                now.extend(failure.to_finding());
            }
            Err(e) => {
                // Still opening (or stuck opening, which arrives as an event of its own and
                // becomes the finding): the worker goes on, and its GPUs are learnt if it answers.
                tracing::warn!("{e}; watching the kernel log meanwhile");
                tel.set_nvml(false, &e.to_string());
                link.worker = Some(worker);
            }
        }
    }
    // This boot's inventory (stored and compared on a new boot), and the health task.
    let mut stored = None;
    if let Some(w) = link.worker.clone().filter(|_| link.opened) {
        let (dir, boot) = (cfg.state_dir.clone(), boot_hex.to_string());
        if let Ok((s, changed)) =
            tokio::task::spawn_blocking(move || super::health::take_inventory(&w, &dir, &boot))
                .await
        {
            if let Some(s) = &s {
                link.pages.set_diff(s.diff());
            }
            now.extend(changed.into_iter().map(|mut f| {
                link.identify(&mut f);
                f
            }));
            stored = s;
        }
    }
    let expected = super::health::Expected::from(cfg.inventory.expected_gpus, stored.as_ref());
    // Nothing to poll without NVML unless a count is expected (the bus is counted then).
    if (cfg.health.enabled && link.worker.is_some()) || expected.count.is_some() {
        link.health = tokio::spawn(super::health::health_loop(
            cfg.health.clone(),
            link.worker.clone(),
            expected,
            cfg.nvml.sysfs_root.clone(),
            super::health::Keep {
                state_dir: cfg.state_dir.clone(),
                boot_hex: boot_hex.to_string(),
            },
            tx.clone(),
        ));
    }
    let mut probe = Probe::new(cfg.nvml.sysfs_root.clone());
    if let Some(m) = probe_memory {
        probe.restore(m);
    }
    link.probe = tokio::spawn(probe_loop(
        probe,
        link.worker.clone(),
        Duration::from_secs(cfg.nvml.probe_interval_secs),
        tx,
    ));
    Ok((link, now))
}

/// How often the worker is looked at for a call that overran its limit with nobody waiting for
/// it (an event wait that never returns): the probe may run only every few minutes.
const STUCK_CHECK: Duration = Duration::from_secs(1);

/// The lost-GPU probe, on its own task: NVML's answer is awaited here (on a blocking thread that
/// returns within the call deadline), never on the pipeline. Also looks at the worker every
/// [`STUCK_CHECK`].
async fn probe_loop(
    mut probe: Probe,
    worker: Option<NvmlWorker>,
    every: Duration,
    tx: mpsc::Sender<NvmlMsg>,
) {
    let mut timer = tokio::time::interval(every);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = probe.memory();
    let mut stuck_check = tokio::time::interval(STUCK_CHECK);
    stuck_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = timer.tick() => {}
            _ = stuck_check.tick(), if worker.is_some() => {
                let w = worker.clone();
                // A report scans procfs: not on the runtime thread.
                let _ = tokio::task::spawn_blocking(move || w.map(|w| w.check())).await;
                continue;
            }
        }
        let w = worker.clone();
        let round = tokio::task::spawn_blocking(move || {
            // Taken before NVML is asked: a finding after this is not answered by this round.
            let at_mono_ms = crate::clock::Now::read().mono_ms;
            // A stuck or failing NVML says nothing about which GPUs are reachable: only the bus
            // is compared then (the stuck driver is its own finding), and nothing is verified.
            let reached = w.and_then(|w| w.reached_gpus().ok());
            let reachable: Option<Vec<_>> =
                reached.as_ref().map(|r| r.iter().map(|g| g.pci).collect());
            let found = probe.check(reachable.as_deref());
            let verified = reached.and_then(|reached| {
                let on_bus = probe.gpus_on_bus().ok()?.into_iter().collect();
                Some(crate::incident::Verification {
                    at_mono_ms,
                    on_bus,
                    reached,
                })
            });
            (probe, found, verified)
        })
        .await;
        let Ok((back, found, verified)) = round else {
            return;
        };
        probe = back;
        let memory = probe.memory();
        // Every round NVML answered goes to the pipeline: it is what ends a lost GPU's incident.
        if (!found.is_empty() || memory != last || verified.is_some())
            && tx
                .send(NvmlMsg::Probe(found, memory.clone(), verified))
                .await
                .is_err()
        {
            return;
        }
        last = memory;
    }
}

impl NvmlLink {
    /// The verified ends the last [`NvmlLink::handle`] took in (health checks that pass again).
    pub fn take_verified(&mut self) -> Vec<Finding> {
        std::mem::take(&mut self.verified)
    }

    /// The probe round from the last [`NvmlLink::handle`], if NVML answered it.
    pub fn take_lost_check(&mut self) -> Option<crate::incident::Verification> {
        self.lost_check.take()
    }

    /// Whether NVML has opened, so a lost GPU's recovery can be verified.
    pub fn can_verify(&self) -> bool {
        self.worker.is_some() && self.opened
    }

    /// The next message from NVML or the probe; pending forever when both have ended.
    pub async fn next(&mut self) -> Option<NvmlMsg> {
        self.rx.recv().await
    }

    /// The handle runbook `nvml` steps go through, when NVML runs.
    pub fn probe_handle(&self) -> Option<Arc<dyn crate::runbook::NvmlProbe>> {
        self.worker
            .clone()
            .map(|w| Arc::new(w) as Arc<dyn crate::runbook::NvmlProbe>)
    }

    /// Turns one message into findings (with their origin), and keeps status and log current.
    pub fn handle(
        &mut self,
        msg: NvmlMsg,
        tel: &Telemetry,
        classifier: &mut Classifier,
        stats: &mut SourceStats,
    ) -> Vec<(Finding, Origin)> {
        match msg {
            NvmlMsg::Probe(found, memory, verified) => {
                self.probe_memory = memory;
                self.lost_check = verified;
                found
                    .into_iter()
                    .map(|mut f| {
                        // What NVML told us about this GPU when it could still see it.
                        if let Some(g) = self.inventory.iter().find(|g| Some(g.pci) == f.pci) {
                            f.gpu = g.identity();
                        }
                        (f, Origin::Probe)
                    })
                    .collect()
            }
            NvmlMsg::Health(found, ended, gauges) => {
                tel.set_health(gauges);
                for mut f in ended {
                    self.identify(&mut f);
                    self.verified.push(f);
                }
                found
                    .into_iter()
                    .map(|mut f| {
                        self.identify(&mut f);
                        (f, Origin::Nvml)
                    })
                    .collect()
            }
            NvmlMsg::Event(ev) => {
                match &ev {
                    NvmlEvent::Watching { notes } => {
                        for n in notes {
                            tracing::warn!("NVML: {n}");
                        }
                    }
                    NvmlEvent::Opened(o) => {
                        tracing::info!("NVML answered its init late; learning its inventory now");
                        self.learn((**o).clone(), tel, classifier, stats);
                    }
                    NvmlEvent::Unresponsive(s) => {
                        tracing::error!(
                            "NVML is unresponsive: {} has not returned after {:.1} s; {} task(s) in D state. The kernel log is still watched.",
                            s.call,
                            s.running.as_secs_f64(),
                            s.blocked.len() + s.blocked_omitted
                        );
                        stats.nvml_up = false;
                        tel.set_nvml(false, &format!("unresponsive: {} has not returned", s.call));
                    }
                    NvmlEvent::Answering { call, stuck_for } => {
                        tracing::warn!(
                            "NVML answers again: {call} returned after {:.1} s",
                            stuck_for.as_secs_f64()
                        );
                        stats.nvml_up = self.opened;
                        if self.opened {
                            tel.set_nvml(true, "ok");
                        }
                    }
                    NvmlEvent::Failed(f) => {
                        tracing::warn!("NVML: {}", f.describe());
                        stats.nvml_up = false;
                        tel.set_nvml(false, &f.describe());
                    }
                    NvmlEvent::Xid { .. }
                    | NvmlEvent::EccSingleBit { .. }
                    | NvmlEvent::EccDoubleBit { .. }
                    | NvmlEvent::GpuLost { .. } => {}
                }
                ev.to_finding(&self.inventory)
                    .map(|f| (f, Origin::Nvml))
                    .into_iter()
                    .collect()
            }
        }
    }

    /// The history and inventory diff every page carries.
    pub fn pages(&self) -> super::health::Pages {
        self.pages.clone()
    }

    /// Names the GPU of a finding as NVML described it at init.
    fn identify(&self, f: &mut Finding) {
        if let Some(g) = self.inventory.iter().find(|g| Some(g.pci) == f.pci) {
            f.gpu = g.identity();
        }
    }

    /// Stops the probe and the worker; a worker stuck in the driver is left to the exit.
    pub fn stop(self) {
        self.probe.abort();
        self.health.abort();
        if let Some(w) = self.worker {
            if !w.stop(Duration::from_millis(500)) {
                tracing::warn!("the NVML worker is still in a call; leaving it");
            }
        }
    }

    fn learn(
        &mut self,
        o: Opened,
        tel: &Telemetry,
        classifier: &mut Classifier,
        stats: &mut SourceStats,
    ) {
        for g in &o.inventory {
            classifier.learn_gpu(g.pci, g.identity());
        }
        if let Some(v) = &o.driver_version {
            classifier.set_driver_version(v);
        }
        for n in &o.notes {
            tracing::warn!("NVML: {n}");
        }
        self.opened = true;
        stats.nvml_up = true;
        stats.gpus_seen = o.inventory.len();
        tel.set_nvml(true, "ok");
        tel.set_gpus(o.inventory.iter().map(GpuSummary::from).collect());
        tracing::info!(
            "NVML: {} GPU(s), driver {}",
            o.inventory.len(),
            o.driver_version.as_deref().unwrap_or("?")
        );
        self.inventory = o.inventory;
    }
}
