//! NVML as one source: starts the NVML worker, waits a bounded time for its inventory, starts
//! the lost-GPU probe and the health loop ([`crate::source::probe`], [`crate::source::health`])
//! on their own tasks, and turns what they report into values ([`NvmlValue`]).
//!
//! Nothing here calls NVML on the runtime thread, and nothing here touches what the values are
//! for: the daemon's pipeline owns the classifier, the incidents and the counters (the status
//! among them), and applies the values it is sent. So a wedged driver delays no kernel-log
//! finding and no watchdog ping. What the worker reports about itself (stuck, answering again,
//! a late inventory) is logged here and sent on as values for the status.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::mpsc;

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;

use super::{CallError, GpuInfo, NvmlEvent, NvmlWorker, Opened, WorkerOptions};
use crate::health::HealthConfig;
use crate::model::{Finding, Verification};
use crate::source::health::{
    health_loop, take_inventory, Expected, HealthGauges, HealthRound, Keep,
};
use crate::source::probe::{self, probe_loop, Probe, ProbeRound};

/// How long NVML's init may take before the driver counts as unresponsive. The kernel log (and
/// READY=1) waits for it at most `nvml.call_timeout_secs`, never longer than this; an init that
/// answers later still brings its inventory.
pub const NVML_OPEN_LIMIT: Duration = Duration::from_secs(20);

/// Events between the worker and the pipeline; the worker waits (briefly) when it is full.
const EVENT_QUEUE: usize = 256;

/// What reaches the daemon from NVML, the probe and the health loop: the sources' own values.
#[derive(Debug)]
pub enum NvmlMsg {
    Event(NvmlEvent),
    Probe(ProbeRound),
    Health(HealthRound),
}

/// Which side of NVML found a finding: the incident rules treat the probe's apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoundBy {
    /// NVML itself: its events, its init, the health checks.
    Nvml,
    /// The lost-GPU probe.
    Probe,
}

/// What the NVML side asks of the pipeline, as values: the pipeline applies them to the
/// classifier, the engine and the counters it owns.
#[derive(Debug, Clone, PartialEq)]
pub enum NvmlValue {
    /// A finding for the engine, with where it came from.
    Finding(Finding, FoundBy),
    /// NVML's inventory: the GPUs (and driver) the classifier names findings with, and the
    /// status lists.
    Learned {
        gpus: Vec<GpuInfo>,
        driver_version: Option<String>,
    },
    /// Whether NVML answers, for the counters; with `state`, the status's words for it ("ok",
    /// "unresponsive: ...").
    Up { up: bool, state: Option<String> },
    /// The health checks' gauges, as of their last round.
    Health(HealthGauges),
    /// A health check passes again (for its window): its incident ends, verified.
    Verified(Finding),
    /// A probe round NVML answered: lost-GPU incidents it shows recovered end.
    LostCheck(Verification),
    /// What the probe remembers now (saved with the checkpoint).
    ProbeMemory(probe::Memory),
    /// Whether a lost GPU's recovery can be verified (NVML has opened).
    CanVerify(bool),
}

/// What the NVML side is started with (from the config's `[nvml]`, `[health]` and
/// `[inventory]`).
#[derive(Debug, Clone)]
pub struct LinkOptions {
    /// `None`: NVML is off; the probe compares the bus only.
    pub worker: Option<WorkerOptions>,
    /// `[health]`: the checks run when enabled and NVML runs.
    pub health: HealthConfig,
    pub expected_gpus: Option<usize>,
    pub sysfs_root: PathBuf,
    pub probe_every: Duration,
    /// Where this boot's inventory is kept, and the boot it belongs to.
    pub keep: Keep,
    /// The counter the probe adds its rounds to.
    pub probe_rounds: Arc<AtomicU64>,
}

/// NVML as the daemon holds it.
pub struct NvmlLink {
    worker: Option<NvmlWorker>,
    /// NVML has answered its init (in time or late).
    opened: bool,
    inventory: Vec<GpuInfo>,
    events: mpsc::Receiver<NvmlEvent>,
    probes: mpsc::Receiver<ProbeRound>,
    healths: mpsc::Receiver<HealthRound>,
    probe: tokio::task::JoinHandle<()>,
    health: tokio::task::JoinHandle<()>,
}

/// Starts NVML (when enabled), the probe and the health loop. Waits for NVML's init at most the
/// call timeout (capped at [`NVML_OPEN_LIMIT`]); returns the values to apply at once (the
/// inventory, NVML that cannot be used, "changed since last boot"), and the inventory diff the
/// pages carry.
pub async fn start(
    opts: LinkOptions,
    probe_memory: Option<probe::Memory>,
) -> anyhow::Result<(NvmlLink, Vec<NvmlValue>, Vec<crate::inventory::Change>)> {
    let (etx, erx) = mpsc::channel::<NvmlEvent>(EVENT_QUEUE);
    let (ptx, prx) = mpsc::channel::<ProbeRound>(EVENT_QUEUE);
    let (htx, hrx) = mpsc::channel::<HealthRound>(EVENT_QUEUE);
    let mut link = NvmlLink {
        worker: None,
        opened: false,
        inventory: Vec::new(),
        events: erx,
        probes: prx,
        healths: hrx,
        probe: tokio::spawn(async {}),
        health: tokio::spawn(async {}),
    };
    let mut now = Vec::new();
    if let Some(wopts) = opts.worker {
        let call_timeout = wopts.call_timeout;
        let worker = NvmlWorker::spawn_for_async(wopts, etx.clone(), EVENT_QUEUE)
            .context("starting the NVML worker")?;
        // The kernel log waits for NVML's GPU identities at most as long as one NVML call may
        // take; a longer init goes on, and is a stuck driver only past NVML_OPEN_LIMIT.
        let w = worker.clone();
        let hold = call_timeout.min(NVML_OPEN_LIMIT);
        let opened = tokio::task::spawn_blocking(move || w.wait_open_for(hold))
            .await
            .unwrap_or(Err(CallError::Closed));
        match opened {
            Ok(o) => {
                now.extend(link.learn(o));
                link.worker = Some(worker);
            }
            Err(CallError::Failed(failure)) => {
                // The worker has ended: runbook `nvml` steps are skipped, the probe compares the
                // bus only.
                tracing::warn!(
                    "NVML unavailable: {}; watching the kernel log only",
                    failure.describe()
                );
                now.push(NvmlValue::down(failure.describe()));
                now.extend(
                    failure
                        .to_finding()
                        .map(|f| NvmlValue::Finding(f, FoundBy::Nvml)),
                );
            }
            Err(e) => {
                // Still opening (or stuck opening, which arrives as an event of its own and
                // becomes the finding): the worker goes on, and its GPUs are learnt if it answers.
                tracing::warn!("{e}; watching the kernel log meanwhile");
                now.push(NvmlValue::down(e.to_string()));
                link.worker = Some(worker);
            }
        }
    }
    // This boot's inventory (stored and compared on a new boot), and the health task.
    let mut stored = None;
    let mut diff = Vec::new();
    if let Some(w) = link.worker.clone().filter(|_| link.opened) {
        let (dir, boot) = (opts.keep.state_dir.clone(), opts.keep.boot_hex.clone());
        if let Ok((s, changed)) =
            tokio::task::spawn_blocking(move || take_inventory(&w, &dir, &boot)).await
        {
            if let Some(s) = &s {
                diff = s.diff();
            }
            now.extend(changed.into_iter().map(|mut f| {
                link.identify(&mut f);
                NvmlValue::Finding(f, FoundBy::Nvml)
            }));
            stored = s;
        }
    }
    let expected = Expected::from(opts.expected_gpus, stored.as_ref());
    // Nothing to poll without NVML unless a count is expected (the bus is counted then).
    if (opts.health.enabled && link.worker.is_some()) || expected.count.is_some() {
        link.health = tokio::spawn(health_loop(
            opts.health.clone(),
            link.worker.clone(),
            expected,
            opts.sysfs_root.clone(),
            opts.keep.clone(),
            htx,
        ));
    }
    let mut probe = Probe::new(opts.sysfs_root.clone());
    if let Some(m) = probe_memory {
        probe.restore(m);
    }
    link.probe = tokio::spawn(probe_loop(
        probe,
        link.worker.clone(),
        opts.probe_every,
        ptx,
        opts.probe_rounds,
    ));
    now.push(NvmlValue::CanVerify(link.can_verify()));
    Ok((link, now, diff))
}

impl NvmlLink {
    /// Whether NVML has opened, so a lost GPU's recovery can be verified.
    pub fn can_verify(&self) -> bool {
        self.worker.is_some() && self.opened
    }

    /// The next message from NVML, the probe or the health loop; pending forever once all three
    /// have ended.
    pub async fn next(&mut self) -> NvmlMsg {
        loop {
            tokio::select! {
                Some(ev) = self.events.recv() => return NvmlMsg::Event(ev),
                Some(r) = self.probes.recv() => return NvmlMsg::Probe(r),
                Some(r) = self.healths.recv() => return NvmlMsg::Health(r),
                else => std::future::pending::<()>().await,
            }
        }
    }

    /// The handle runbook `nvml` steps go through, when NVML runs.
    pub fn probe_handle(&self) -> Option<Arc<dyn crate::runbook::NvmlProbe>> {
        self.worker
            .clone()
            .map(|w| Arc::new(w) as Arc<dyn crate::runbook::NvmlProbe>)
    }

    /// Turns one message into values for the pipeline, and keeps status and log current.
    pub fn handle(&mut self, msg: NvmlMsg) -> Vec<NvmlValue> {
        let mut out = match msg {
            NvmlMsg::Probe(round) => {
                let mut out: Vec<NvmlValue> = round
                    .found
                    .into_iter()
                    .map(|mut f| {
                        // What NVML told us about this GPU when it could still see it.
                        self.identify(&mut f);
                        NvmlValue::Finding(f, FoundBy::Probe)
                    })
                    .collect();
                out.push(NvmlValue::ProbeMemory(round.memory));
                out.extend(round.verified.map(NvmlValue::LostCheck));
                out
            }
            NvmlMsg::Health(round) => {
                // The gauges, the round's findings, then its verified ends.
                let gauges = std::iter::once(NvmlValue::Health(round.gauges));
                let found = round.found.into_iter().map(|mut f| {
                    self.identify(&mut f);
                    NvmlValue::Finding(f, FoundBy::Nvml)
                });
                let ended: Vec<NvmlValue> = round
                    .ended
                    .into_iter()
                    .map(|mut f| {
                        self.identify(&mut f);
                        NvmlValue::Verified(f)
                    })
                    .collect();
                gauges.chain(found).chain(ended).collect()
            }
            NvmlMsg::Event(ev) => self.event(ev),
        };
        out.push(NvmlValue::CanVerify(self.can_verify()));
        out
    }

    /// What the worker says about itself, and the events it watches for.
    fn event(&mut self, ev: NvmlEvent) -> Vec<NvmlValue> {
        let mut out = Vec::new();
        match &ev {
            NvmlEvent::Watching { notes } => {
                for n in notes {
                    tracing::warn!("NVML: {n}");
                }
            }
            NvmlEvent::Opened(o) => {
                tracing::info!("NVML answered its init late; learning its inventory now");
                out.extend(self.learn((**o).clone()));
            }
            NvmlEvent::Unresponsive(s) => {
                tracing::error!(
                    "NVML is unresponsive: {} has not returned after {:.1} s; {} task(s) in D state. The kernel log is still watched.",
                    s.call,
                    s.running.as_secs_f64(),
                    s.blocked.len() + s.blocked_omitted
                );
                out.push(NvmlValue::down(format!(
                    "unresponsive: {} has not returned",
                    s.call
                )));
            }
            NvmlEvent::Answering { call, stuck_for } => {
                tracing::warn!(
                    "NVML answers again: {call} returned after {:.1} s",
                    stuck_for.as_secs_f64()
                );
                out.push(NvmlValue::Up {
                    up: self.opened,
                    state: self.opened.then(|| "ok".to_string()),
                });
            }
            NvmlEvent::Failed(f) => {
                tracing::warn!("NVML: {}", f.describe());
                out.push(NvmlValue::down(f.describe()));
            }
            NvmlEvent::Xid { .. }
            | NvmlEvent::EccSingleBit { .. }
            | NvmlEvent::EccDoubleBit { .. }
            | NvmlEvent::GpuLost { .. } => {}
        }
        out.extend(
            ev.to_finding(&self.inventory)
                .map(|f| NvmlValue::Finding(f, FoundBy::Nvml)),
        );
        out
    }

    /// Names the GPU of a finding as NVML described it at init.
    fn identify(&self, f: &mut Finding) {
        if let Some(g) = self.inventory.iter().find(|g| Some(g.pci) == f.pci) {
            f.gpu = g.identity();
        }
    }

    /// Stops the probe, the health loop and the worker; a worker stuck in the driver is left to
    /// the exit.
    pub fn stop(self) {
        self.probe.abort();
        self.health.abort();
        if let Some(w) = self.worker {
            if !w.stop(Duration::from_millis(500)) {
                tracing::warn!("the NVML worker is still in a call; leaving it");
            }
        }
    }

    /// NVML's inventory: kept here to name findings, and sent on for the classifier.
    fn learn(&mut self, o: Opened) -> Vec<NvmlValue> {
        for n in &o.notes {
            tracing::warn!("NVML: {n}");
        }
        self.opened = true;
        tracing::info!(
            "NVML: {} GPU(s), driver {}",
            o.inventory.len(),
            o.driver_version.as_deref().unwrap_or("?")
        );
        self.inventory = o.inventory.clone();
        vec![
            NvmlValue::Learned {
                gpus: o.inventory,
                driver_version: o.driver_version,
            },
            NvmlValue::Up {
                up: true,
                state: Some("ok".into()),
            },
        ]
    }
}

impl NvmlValue {
    /// NVML does not answer, in the status's words.
    fn down(state: String) -> NvmlValue {
        NvmlValue::Up {
            up: false,
            state: Some(state),
        }
    }
}
