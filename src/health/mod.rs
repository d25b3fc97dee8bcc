//! Health checks: NVML readings polled on an interval (by `daemon::health`), judged here.
//!
//! Pure: [`Checks::observe`] takes one poll's readings and the monotonic time, and returns the
//! findings. Every check has a sustain rule (a window of time, or a number of polls in a row), so
//! one hot or throttled sample is not a page; a check reports once when its condition has held for
//! the whole window, and again only after the condition has cleared. Severities come from
//! `classify::signals`, the words for the on-call from `classify::guidance`.
//!
//! The PCIe rule: a GPU at idle lowers its link (generation, sometimes width) to save power, so a
//! link below its maximum at idle is normal. The link is judged only while the GPU is busy
//! (utilization at or above `busy_util_percent`), for `polls` busy polls in a row. A busy GPU
//! trains its link back to the maximum within milliseconds, so a busy GPU below its maximum is
//! really degraded. The highest link seen since start is kept and named in the finding.

mod checks;
pub mod config;
pub mod holder;

use checks::{ecc, memory_repair, pcie_link, power, recovery, temperature, throttling};

use std::collections::BTreeMap;
use std::time::Duration;

pub use config::HealthConfig;

use crate::classify::signals;
use crate::model::{Detail, Finding, FindingKind, Origin, PciAddress, RecoveryAction};
use crate::source::nvml::health::{
    GpuProcess, GpuReading, FABRIC_COMPLETED, FABRIC_IN_PROGRESS, FABRIC_NOT_STARTED,
    THROTTLE_HW_POWER_BRAKE, THROTTLE_HW_SLOWDOWN, THROTTLE_HW_THERMAL,
};
use holder::{Episode, Growth, Liveness, Step};

/// What is remembered per GPU between polls.
#[derive(Debug, Default, Clone)]
struct GpuState {
    pci: Option<PciAddress>,
    hot_since: Option<Duration>,
    hot_told: bool,
    throttle_polls: u32,
    throttle_told: bool,
    link_polls: u32,
    link_told: bool,
    best_gen: u32,
    best_width: u32,
    repair_told: Option<(bool, bool, bool)>,
    dbe_last: Option<u64>,
    recovery_told: Option<u32>,
    power_since: Option<Duration>,
    power_told: bool,
    persistence_told: bool,
    held_idle: Episode,
    held_gone: Episode,
    growth: Episode,
    /// Per pid: its memory since it last fell.
    growth_of: BTreeMap<u32, Growth>,
    fabric: Episode,
    /// How long each reported condition has read clear (its incident ends only when that is
    /// long enough: [`Clearing`]).
    hot_clear: Clearing,
    throttle_clear: Clearing,
    link_clear: Clearing,
    repair_clear: Clearing,
    recovery_clear: Clearing,
    power_clear: Clearing,
    persistence_clear: Clearing,
}

/// Polls in a row a check without a window of its own (memory repair, the recovery action,
/// persistence mode) must read clear before its incident ends: one reading is not a verified
/// end, since NVML can answer a single poll with a stale or default value while the GPU is
/// being recovered.
const CLEAR_POLLS: u32 = 3;

/// A reported condition reading clear: the end of its incident is verified only when it has
/// been clear for the check's own window (the sustain window, or its poll count) in a row, the
/// same rule that raised it. A reading with the condition back starts the count again, and
/// the incident never ended in between (no new page, no resolved notice).
#[derive(Debug, Default, Clone)]
struct Clearing {
    since: Option<Duration>,
    polls: u32,
}

impl Clearing {
    /// One clear reading at `now`; true when clear for at least `window` and `polls` polls.
    fn passes(&mut self, now: Duration, window: Duration, polls: u32) -> bool {
        let since = *self.since.get_or_insert(now);
        self.polls = self.polls.saturating_add(1);
        now.saturating_sub(since) >= window && self.polls >= polls.max(1)
    }

    /// The condition holds again.
    fn reset(&mut self) {
        *self = Clearing::default();
    }

    /// One clear reading of a check that is reported (`told`): true, with the count reset, when
    /// it has now passed for its window, so the caller clears the report and says it ended.
    fn passed(&mut self, told: bool, now: Duration, window: Duration, polls: u32) -> bool {
        if told && self.passes(now, window, polls) {
            self.reset();
            return true;
        }
        false
    }
}

impl GpuState {
    /// Takes the reported checks of `g` (an earlier run's memory of this GPU).
    fn take_told(&mut self, g: &GpuMemory) {
        let told = |k: FindingKind| g.told.iter().any(|t| t == k.as_str());
        self.hot_told = told(FindingKind::GpuTemperature);
        self.throttle_told = told(FindingKind::GpuThrottling);
        self.link_told = told(FindingKind::PcieLinkDegraded);
        self.power_told = told(FindingKind::PowerOverLimit);
        self.persistence_told = told(FindingKind::PersistenceModeOff);
        for (kind, e) in self.episodes() {
            e.told = told(kind);
        }
        self.repair_told = g.repair;
        self.recovery_told = g.recovery;
    }

    /// The episodes of the holder and fabric checks, by their finding kind.
    fn episodes(&mut self) -> [(FindingKind, &mut Episode); 4] {
        [
            (FindingKind::GpuHeldNoProcess, &mut self.held_idle),
            (FindingKind::GpuHeldByGoneProcess, &mut self.held_gone),
            (FindingKind::GpuMemoryGrowth, &mut self.growth),
            (FindingKind::FabricNotRegistered, &mut self.fabric),
        ]
    }
}

/// What a restart in the same boot must not forget: which findings were raised (and not yet
/// cleared), so a condition that still holds is not paged again, and the last DBE count, so an
/// increase during the restart is still seen. Sustain timers start again (a restart delays a
/// first report; it never repeats one).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Memory {
    pub boot_id: String,
    pub gpus: Vec<GpuMemory>,
    /// GPUs reported missing by the count check (`None`: the host-wide finding).
    #[serde(default)]
    pub missing: Vec<Option<PciAddress>>,
}

/// One GPU's part of [`Memory`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuMemory {
    pub index: u32,
    pub pci: Option<PciAddress>,
    /// Finding kinds (`gpu_temperature`, ...) raised and not cleared.
    #[serde(default)]
    pub told: Vec<String>,
    #[serde(default)]
    pub repair: Option<(bool, bool, bool)>,
    #[serde(default)]
    pub recovery: Option<u32>,
    #[serde(default)]
    pub dbe_last: Option<u64>,
}

/// The checks and their memory.
#[derive(Debug)]
pub struct Checks {
    cfg: HealthConfig,
    gpus: BTreeMap<u32, GpuState>,
    /// Verified ends since the last [`Checks::take_ended`]: a check that passes again ends its
    /// incident (a state, `incident::is_state`) only on this word, never on silence.
    ended: Vec<Finding>,
    /// The previous boot's reported checks, waiting for their GPU's first reading
    /// ([`Checks::carry_over`]).
    carried: Vec<GpuMemory>,
}

impl Checks {
    pub fn new(cfg: HealthConfig) -> Checks {
        Checks {
            cfg,
            gpus: BTreeMap::new(),
            ended: Vec::new(),
            carried: Vec::new(),
        }
    }

    /// What to keep across a restart in this boot (the count check's part is the caller's).
    pub fn memory(&self, boot_id: &str) -> Memory {
        Memory {
            boot_id: boot_id.to_string(),
            gpus: self
                .gpus
                .iter()
                .map(|(index, st)| GpuMemory {
                    index: *index,
                    pci: st.pci,
                    told: [
                        (st.hot_told, FindingKind::GpuTemperature),
                        (st.throttle_told, FindingKind::GpuThrottling),
                        (st.link_told, FindingKind::PcieLinkDegraded),
                        (st.power_told, FindingKind::PowerOverLimit),
                        (st.persistence_told, FindingKind::PersistenceModeOff),
                        (st.held_idle.told, FindingKind::GpuHeldNoProcess),
                        (st.held_gone.told, FindingKind::GpuHeldByGoneProcess),
                        (st.growth.told, FindingKind::GpuMemoryGrowth),
                        (st.fabric.told, FindingKind::FabricNotRegistered),
                    ]
                    .into_iter()
                    .filter(|(on, _)| *on)
                    .map(|(_, k)| k.as_str().to_string())
                    .collect(),
                    repair: st.repair_told,
                    recovery: st.recovery_told,
                    dbe_last: st.dbe_last,
                })
                .collect(),
            missing: Vec::new(),
        }
    }

    /// Takes back what an earlier run of this boot saved (GPUs matched by index and address).
    pub fn restore(&mut self, m: &Memory) {
        for g in &m.gpus {
            let st = self.gpus.entry(g.index).or_default();
            if st.pci.is_some() && st.pci != g.pci {
                continue;
            }
            st.pci = g.pci;
            st.take_told(g);
            st.dbe_last = g.dbe_last;
        }
    }

    /// What the previous boot's run had reported and not seen clear: a reboot verifies nothing,
    /// so each such check goes on as reported on the same GPU (matched by PCI address at its
    /// first reading: indices can change with a boot), and its incident (carried over by the
    /// pipeline) ends when the check passes for its window. Counters of that boot (the DBE
    /// count) are not taken: they start again with the boot.
    pub fn carry_over(&mut self, m: &Memory) {
        self.carried = m
            .gpus
            .iter()
            .filter(|g| {
                g.pci.is_some()
                    && (!g.told.is_empty() || g.repair.is_some() || g.recovery.is_some())
            })
            .cloned()
            .collect();
    }

    /// The checks in force.
    pub fn config(&self) -> &HealthConfig {
        &self.cfg
    }

    /// The checks whose finding was raised and whose condition still holds, per GPU: the
    /// `xidwatch_health_check_failing` gauge. The ECC check reports increases, not a state.
    pub fn failing(&self) -> Vec<(FindingKind, Option<PciAddress>)> {
        let mut out = Vec::new();
        for st in self.gpus.values() {
            for (on, kind) in [
                (st.hot_told, FindingKind::GpuTemperature),
                (st.throttle_told, FindingKind::GpuThrottling),
                (st.link_told, FindingKind::PcieLinkDegraded),
                (st.repair_told.is_some(), FindingKind::MemoryRepair),
                (st.recovery_told.is_some(), FindingKind::RecoveryAction),
                (st.power_told, FindingKind::PowerOverLimit),
                (st.persistence_told, FindingKind::PersistenceModeOff),
                (st.held_idle.told, FindingKind::GpuHeldNoProcess),
                (st.held_gone.told, FindingKind::GpuHeldByGoneProcess),
                (st.growth.told, FindingKind::GpuMemoryGrowth),
                (st.fabric.told, FindingKind::FabricNotRegistered),
            ] {
                if on {
                    out.push((kind, st.pci));
                }
            }
        }
        out
    }

    /// The verified ends of the polls since the last call: one finding per check that passed
    /// again (its kind and GPU: the key of the incident it ends), for `Engine::resolve_state`.
    pub fn take_ended(&mut self) -> Vec<Finding> {
        std::mem::take(&mut self.ended)
    }

    /// Judges one poll. `now` is monotonic time (any origin, never going back).
    pub fn observe(&mut self, readings: &[GpuReading], now: Duration) -> Vec<Finding> {
        let mut out = Vec::new();
        for r in readings {
            if r.lost {
                // The lost-GPU probe and NVML's own event report that; readings of a lost GPU
                // mean nothing.
                continue;
            }
            let fresh = !self.gpus.contains_key(&r.index);
            let st = self.gpus.entry(r.index).or_default();
            st.pci = r.pci;
            if fresh && r.pci.is_some() {
                if let Some(i) = self.carried.iter().position(|g| g.pci == r.pci) {
                    st.take_told(&self.carried.swap_remove(i));
                }
            }
            let cfg = &self.cfg;
            let ends = &mut self.ended;
            if cfg.temperature.enabled {
                temperature(cfg, st, r, now, &mut out, ends);
            }
            if cfg.throttling.enabled {
                throttling(cfg, st, r, &mut out, ends);
            }
            if cfg.pcie_link.enabled {
                pcie_link(cfg, st, r, &mut out, ends);
            }
            if cfg.memory_repair.enabled {
                memory_repair(st, r, &mut out, ends);
            }
            if cfg.ecc.enabled {
                ecc(st, r, &mut out);
            }
            if cfg.recovery_action.enabled {
                recovery(st, r, &mut out, ends);
            }
            if cfg.power.enabled {
                power(cfg, st, r, now, &mut out, ends);
            }
            if cfg.gpu_held.enabled {
                held(cfg, st, r, now, &mut out, ends);
            }
            if cfg.memory_growth.enabled {
                growth(cfg, st, r, now, &mut out, ends);
            }
            if cfg.fabric.enabled {
                fabric(cfg, st, r, now, &mut out, ends);
            }
            if r.persistence == Some(false) {
                st.persistence_clear.reset();
            }
            if r.persistence == Some(true)
                && st.persistence_clear.passed(
                    st.persistence_told,
                    now,
                    Duration::ZERO,
                    CLEAR_POLLS,
                )
            {
                st.persistence_told = false;
                ended(FindingKind::PersistenceModeOff, r, ends);
            }
            if cfg.persistence_mode.enabled && r.persistence == Some(false) && !st.persistence_told
            {
                st.persistence_told = true;
                out.push(finding(
                    FindingKind::PersistenceModeOff,
                    None,
                    r,
                    "Persistence mode is off".into(),
                    "persistence mode: disabled".into(),
                ));
            }
        }
        out
    }
}

/// The temperature a GPU must reach: the configured threshold, or the GPU's own slowdown
/// threshold minus the margin, whichever is lower.
pub fn temperature_limit(cfg: &HealthConfig, r: &GpuReading) -> u32 {
    let own = r
        .slowdown_c
        .map(|s| s.saturating_sub(cfg.temperature.slowdown_margin_celsius));
    own.map_or(cfg.temperature.threshold_celsius, |o| {
        o.min(cfg.temperature.threshold_celsius)
    })
}

/// A reported check passes again (for its whole window where it has one): said in the log, and
/// a verified end for the pipeline, the only thing that ends the check's incident (a state:
/// silence from a check that reports once per episode proves nothing). The finding carries the
/// kind and GPU of the incident it ends.
fn ended(kind: FindingKind, r: &GpuReading, ends: &mut Vec<Finding>) {
    let at = r
        .pci
        .map_or_else(|| format!("GPU {}", r.index), |p| p.to_string());
    tracing::info!("health check {kind} passes again on {at}: verified, its incident ends");
    ends.push(finding(
        kind,
        None,
        r,
        format!("health check {kind} passes again"),
        format!("{kind} passes again"),
    ));
}

/// The holders for a finding's lines, one per process.
fn holders(procs: &[&GpuProcess]) -> String {
    procs
        .iter()
        .map(|p| holder::describe(p))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The two "GPU held by nobody" cases. Both need NVML's process list: without it neither counts
/// nor clears, since "no list" is not "no process".
fn held(
    cfg: &HealthConfig,
    st: &mut GpuState,
    r: &GpuReading,
    now: Duration,
    out: &mut Vec<Finding>,
    ends: &mut Vec<Finding>,
) {
    let Some(procs) = &r.procs else { return };
    let c = &cfg.gpu_held;
    let window = Duration::from_secs(c.sustain_secs);
    let busy = r.util_pct.filter(|u| *u >= c.busy_util_percent);
    let floor = c.memory_floor_mib << 20;
    let mem = r.mem_used.filter(|m| *m > floor);
    let idle_on = procs.is_empty() && (busy.is_some() || mem.is_some());
    match st.held_idle.step(idle_on, now, window, window) {
        Step::Raise => {
            let mut why = Vec::new();
            if let Some(u) = busy {
                why.push(format!(
                    "utilization {u}% (at or above {}%)",
                    c.busy_util_percent
                ));
            }
            if let Some(m) = mem {
                why.push(format!(
                    "{} MiB of memory in use (above {} MiB)",
                    m >> 20,
                    c.memory_floor_mib
                ));
            }
            let held_for = st.held_idle.held(now).as_secs();
            out.push(finding(
                FindingKind::GpuHeldNoProcess,
                None,
                r,
                format!("GPU held with no process: {} for {held_for} s", why.join(", ")),
                format!(
                    "{} for {held_for} s while NVML lists no compute or graphics process; holder: none",
                    why.join(", ")
                ),
            ));
        }
        Step::Ended => ended(FindingKind::GpuHeldNoProcess, r, ends),
        Step::Nothing => {}
    }
    let gone: Vec<&GpuProcess> = procs
        .iter()
        .filter(|p| {
            p.look
                .as_ref()
                .is_some_and(|l| l.state != Liveness::Running)
        })
        .collect();
    match st.held_gone.step(!gone.is_empty(), now, window, window) {
        Step::Raise => {
            let held_for = st.held_gone.held(now).as_secs();
            let first = gone.first().map_or(0, |p| p.pid);
            let how = if gone
                .iter()
                .any(|p| p.look.as_ref().is_some_and(|l| l.state == Liveness::Zombie))
            {
                "a zombie"
            } else {
                "gone"
            };
            out.push(finding(
                FindingKind::GpuHeldByGoneProcess,
                None,
                r,
                format!("GPU held by pid {first}, which is {how}, for {held_for} s"),
                format!(
                    "NVML lists {} process(es) that are not running, for {held_for} s; holder: {}",
                    gone.len(),
                    holders(&gone)
                ),
            ));
        }
        Step::Ended => ended(FindingKind::GpuHeldByGoneProcess, r, ends),
        Step::Nothing => {}
    }
}

/// One process's memory rising through the whole window without a fall, by at least the
/// configured amount. A pid no longer listed is forgotten.
fn growth(
    cfg: &HealthConfig,
    st: &mut GpuState,
    r: &GpuReading,
    now: Duration,
    out: &mut Vec<Finding>,
    ends: &mut Vec<Finding>,
) {
    let Some(procs) = &r.procs else { return };
    let c = &cfg.memory_growth;
    let window = Duration::from_secs(c.sustain_secs);
    st.growth_of
        .retain(|pid, _| procs.iter().any(|p| p.pid == *pid && p.used.is_some()));
    for p in procs {
        let Some(b) = p.used else { continue };
        let g = st.growth_of.entry(p.pid).or_insert(Growth {
            since: now,
            from: b,
            last: b,
        });
        if b < g.last {
            *g = Growth {
                since: now,
                from: b,
                last: b,
            };
        }
        g.last = b;
    }
    let min = c.min_growth_mib << 20;
    let growing: Vec<(&GpuProcess, Growth)> = procs
        .iter()
        .filter_map(|p| st.growth_of.get(&p.pid).map(|g| (p, *g)))
        .filter(|(_, g)| {
            now.saturating_sub(g.since) >= window && g.last.saturating_sub(g.from) >= min
        })
        .collect();
    // The window is in the per-pid record already: the report comes at once, the end after a
    // window without growth.
    match st
        .growth
        .step(!growing.is_empty(), now, Duration::ZERO, window)
    {
        Step::Raise => {
            let Some((p, g)) = growing.first() else {
                return;
            };
            let secs = now.saturating_sub(g.since).as_secs();
            out.push(finding(
                FindingKind::GpuMemoryGrowth,
                None,
                r,
                format!(
                    "GPU memory of pid {} only grew for {secs} s: {} MiB to {} MiB",
                    p.pid,
                    g.from >> 20,
                    g.last >> 20
                ),
                format!(
                    "GPU memory of one process rose from {} MiB to {} MiB over {secs} s without a fall; holder: {}",
                    g.from >> 20,
                    g.last >> 20,
                    holders(&[p])
                ),
            ));
        }
        Step::Ended => ended(FindingKind::GpuMemoryGrowth, r, ends),
        Step::Nothing => {}
    }
}

/// Fabric registration not complete, or complete with a failure status. Systems without fabric
/// registration give no reading and are silent.
fn fabric(
    cfg: &HealthConfig,
    st: &mut GpuState,
    r: &GpuReading,
    now: Duration,
    out: &mut Vec<Finding>,
    ends: &mut Vec<Finding>,
) {
    let Some(f) = &r.fabric else { return };
    let window = Duration::from_secs(cfg.fabric.sustain_secs);
    let on = f.state != FABRIC_COMPLETED || f.status != 0;
    match st.fabric.step(on, now, window, window) {
        Step::Raise => {
            let state = match f.state {
                FABRIC_NOT_STARTED => "not started",
                FABRIC_IN_PROGRESS => "in progress",
                FABRIC_COMPLETED => "completed with a failure",
                _ => "in an unknown state",
            };
            let held_for = st.fabric.held(now).as_secs();
            out.push(finding(
                FindingKind::FabricNotRegistered,
                None,
                r,
                format!("GPU fabric registration {state} for {held_for} s"),
                format!(
                    "fabric registration {state} (state {}, status {}) for {held_for} s; clique {}, cluster {}",
                    f.state, f.status, f.clique_id, f.cluster_uuid
                ),
            ));
        }
        Step::Ended => ended(FindingKind::FabricNotRegistered, r, ends),
        Step::Nothing => {}
    }
}

fn finding(
    kind: FindingKind,
    detail: Option<Detail>,
    r: &GpuReading,
    title: String,
    what: String,
) -> Finding {
    let mut f = signals::finding(kind, detail, title);
    f.pci = r.pci;
    let at = r
        .pci
        .map_or_else(|| format!("GPU {}", r.index), |p| p.to_string());
    f.message = format!("NVML health check: {what}");
    f.origin = Origin {
        line: 0,
        lines: 1,
        raw: vec![format!("NVML: {what} on {at}")],
        ..Origin::default()
    };
    f
}

/// GPUs expected but not present, by PCI address (when the baseline names them), for the
/// critical `gpu_missing` finding. `present` is what NVML (or, without NVML, the bus) shows now.
pub fn missing_gpus(
    expected: usize,
    known: &[PciAddress],
    present: &[PciAddress],
) -> (usize, Vec<PciAddress>) {
    let gone: Vec<PciAddress> = known
        .iter()
        .filter(|p| !present.contains(p))
        .copied()
        .collect();
    (expected.saturating_sub(present.len()), gone)
}

/// The `gpu_missing` findings for a count below the expected one: one per address that is gone
/// (named from the baseline), or one host-wide finding when the baseline cannot name them.
pub fn count_findings(
    expected: usize,
    known: &[PciAddress],
    present: &[PciAddress],
) -> Vec<Finding> {
    let (short, gone) = missing_gpus(expected, known, present);
    if short == 0 {
        return Vec::new();
    }
    let head = format!("{} of {expected} expected GPUs present", present.len());
    let mk = |pci: Option<PciAddress>, title: String| {
        let mut f = signals::finding(FindingKind::GpuMissing, None, title);
        f.pci = pci;
        f.message = format!("GPU count check: {head}");
        f.origin = Origin {
            line: 0,
            lines: 1,
            raw: vec![format!(
                "GPU count: {head}; gone: {}",
                if gone.is_empty() {
                    "(the baseline does not name them)".to_string()
                } else {
                    gone.iter()
                        .map(|p| p.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            )],
            ..Origin::default()
        };
        f
    };
    if gone.is_empty() {
        return vec![mk(None, format!("GPU missing: {head}"))];
    }
    gone.iter()
        .map(|p| mk(Some(*p), format!("GPU {p} is missing: {head}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hot(t: u32) -> GpuReading {
        GpuReading {
            index: 0,
            pci: PciAddress::parse("0000:17:00.0").ok(),
            temp_c: Some(t),
            slowdown_c: Some(92),
            ..GpuReading::default()
        }
    }

    #[test]
    fn temperature_needs_the_whole_window_and_reports_once() {
        let mut c = Checks::new(HealthConfig::default());
        let s = Duration::from_secs;
        // Limit: min(85, 92 - 5) = 85.
        assert_eq!(temperature_limit(c.config(), &hot(0)), 85);
        assert!(c.observe(&[hot(90)], s(0)).is_empty());
        assert!(c.observe(&[hot(90)], s(200)).is_empty());
        assert!(c.observe(&[hot(70)], s(230)).is_empty(), "cleared");
        assert!(c.observe(&[hot(90)], s(260)).is_empty());
        assert!(c.observe(&[hot(90)], s(500)).is_empty());
        let f = c.observe(&[hot(91)], s(560));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, FindingKind::GpuTemperature);
        assert!(c.observe(&[hot(91)], s(590)).is_empty(), "said once");
    }

    #[test]
    fn an_idle_link_is_not_degraded_and_a_busy_one_is() {
        let mut c = Checks::new(HealthConfig::default());
        let link = |w, util| GpuReading {
            link_gen: Some(if util > 0 { 5 } else { 1 }),
            link_gen_max: Some(5),
            link_width: Some(w),
            link_width_max: Some(16),
            util_pct: Some(util),
            ..hot(40)
        };
        for _ in 0..5 {
            assert!(c.observe(&[link(4, 0)], Duration::ZERO).is_empty());
        }
        assert!(c.observe(&[link(4, 95)], Duration::ZERO).is_empty());
        let f = c.observe(&[link(4, 95)], Duration::ZERO);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].title.contains("x4"), "{}", f[0].title);
    }

    #[test]
    fn nvml_recovery_numbers_are_named_and_unknown_ones_kept() {
        use super::checks::recovery_of;
        assert_eq!(recovery_of(4), RecoveryAction::DrainAndReset);
        assert_eq!(recovery_of(5), RecoveryAction::RecoverImexDomain);
        assert_eq!(recovery_of(6), RecoveryAction::BusReset);
        assert_eq!(recovery_of(7), RecoveryAction::SystemReboot);
        assert_eq!(
            recovery_of(9),
            RecoveryAction::Other("recovery action 9".into())
        );
    }

    #[test]
    fn throttling_ecc_repair_recovery_power_and_persistence() {
        use crate::model::Severity;
        use crate::source::nvml::health::RemapCounts;
        let mut c = Checks::new(HealthConfig::default());
        let z = Duration::ZERO;
        let kinds = |f: &[Finding]| f.iter().map(|f| f.kind).collect::<Vec<_>>();
        // Throttling: software power capping (0x4) is policy; power brake for 4 polls is a finding.
        let thr = |bits| GpuReading {
            throttle: Some(bits),
            ..hot(40)
        };
        for _ in 0..6 {
            assert!(c.observe(&[thr(0x4)], z).is_empty());
        }
        for _ in 0..3 {
            assert!(c.observe(&[thr(0x80)], z).is_empty());
        }
        assert_eq!(
            kinds(&c.observe(&[thr(0x80)], z)),
            [FindingKind::GpuThrottling]
        );
        assert_eq!(c.failing(), [(FindingKind::GpuThrottling, hot(0).pci)]);
        for _ in 0..c.config().throttling.polls {
            assert!(c.observe(&[thr(0)], z).is_empty());
        }
        assert!(c.failing().is_empty(), "cleared");

        // ECC: an increase over the previous poll, not a count left from before.
        let dbe = |n| GpuReading {
            dbe_volatile: Some(n),
            ..hot(40)
        };
        assert!(c.observe(&[dbe(3)], z).is_empty());
        assert!(c.observe(&[dbe(3)], z).is_empty());
        let f = c.observe(&[dbe(5)], z);
        assert_eq!(kinds(&f), [FindingKind::EccDbeIncrease]);
        assert_eq!(f[0].severity, Severity::Critical);

        // Memory repair: pending is a warning, failed critical; said when the state changes.
        let rep = |pending, failed| GpuReading {
            remap: Some(RemapCounts {
                correctable: 0,
                uncorrectable: 1,
                pending,
                failed,
            }),
            ..hot(40)
        };
        let f = c.observe(&[rep(true, false)], z);
        assert_eq!(f[0].severity, Severity::Warning);
        assert!(c.observe(&[rep(true, false)], z).is_empty());
        let f = c.observe(&[rep(true, true)], z);
        assert_eq!(f[0].severity, Severity::Critical, "{f:?}");

        // Recovery action: a GPU reset asked for, at the first poll.
        let mut c = Checks::new(HealthConfig::default());
        let rec = |v| GpuReading {
            recovery: Some(v),
            ..hot(40)
        };
        assert!(c.observe(&[rec(0)], z).is_empty());
        let f = c.observe(&[rec(1)], z);
        assert_eq!(f[0].severity, Severity::Critical);
        assert!(f[0].title.contains("GPU reset"), "{}", f[0].title);
        assert!(c.observe(&[rec(1)], z).is_empty());

        // Power: over the limit by more than 5 % for 300 s.
        let pw = |mw| GpuReading {
            power_mw: Some(mw),
            limit_mw: Some(700_000),
            ..hot(40)
        };
        let s = Duration::from_secs;
        assert!(
            c.observe(&[pw(720_000)], s(0)).is_empty(),
            "within the margin"
        );
        assert!(c.observe(&[pw(760_000)], s(10)).is_empty());
        assert!(c.observe(&[pw(760_000)], s(200)).is_empty());
        assert_eq!(
            kinds(&c.observe(&[pw(760_000)], s(310))),
            [FindingKind::PowerOverLimit]
        );

        // Persistence off: info, once; each check can be turned off.
        let off = GpuReading {
            persistence: Some(false),
            ..hot(40)
        };
        let f = c.observe(std::slice::from_ref(&off), z);
        assert_eq!(f[0].severity, Severity::Info);
        assert!(c.observe(std::slice::from_ref(&off), z).is_empty());
        let mut cfg = HealthConfig::default();
        cfg.persistence_mode.enabled = false;
        assert!(Checks::new(cfg).observe(&[off], z).is_empty());
    }

    /// A reported check ends (its verified end, for the incident) only when it has passed for
    /// the same window that raised it: the sustain time, the poll count, or for checks without
    /// one [`CLEAR_POLLS`] polls. The condition coming back in between starts the count again,
    /// and the check stays failing all along.
    #[test]
    fn a_check_ends_only_after_passing_for_its_window() {
        use crate::source::nvml::health::RemapCounts;
        let s = Duration::from_secs;
        let mut c = Checks::new(HealthConfig::default());
        let window = c.config().temperature.sustain_secs;
        c.observe(&[hot(90)], s(0));
        assert_eq!(c.observe(&[hot(90)], s(window)).len(), 1);
        let t0 = window + 10;
        assert!(c.observe(&[hot(60)], s(t0)).is_empty());
        assert!(c.observe(&[hot(60)], s(t0 + window - 1)).is_empty());
        assert!(c.take_ended().is_empty(), "not yet a whole window");
        assert_eq!(c.failing().len(), 1, "still failing while it clears");
        // Hot again: the clear window starts over, and nothing is paged again.
        assert!(c.observe(&[hot(90)], s(t0 + window)).is_empty());
        assert!(c.observe(&[hot(60)], s(t0 + window + 1)).is_empty());
        assert!(c.observe(&[hot(60)], s(t0 + 2 * window)).is_empty());
        assert!(c.take_ended().is_empty(), "the window restarted");
        assert!(c.observe(&[hot(60)], s(t0 + 2 * window + 1)).is_empty());
        let ended = c.take_ended();
        assert_eq!(ended.len(), 1, "{ended:?}");
        assert_eq!(ended[0].kind, FindingKind::GpuTemperature);
        assert!(c.failing().is_empty());

        // Memory repair has no window: CLEAR_POLLS clear polls in a row.
        let mut c = Checks::new(HealthConfig::default());
        let rep = |pending| GpuReading {
            remap: Some(RemapCounts {
                correctable: 0,
                uncorrectable: 1,
                pending,
                failed: false,
            }),
            ..hot(40)
        };
        let z = Duration::ZERO;
        assert_eq!(c.observe(&[rep(true)], z).len(), 1);
        for _ in 1..CLEAR_POLLS {
            c.observe(&[rep(false)], z);
        }
        c.observe(&[rep(true)], z);
        assert!(c.take_ended().is_empty(), "pending again before it cleared");
        for _ in 1..CLEAR_POLLS {
            c.observe(&[rep(false)], z);
        }
        assert!(c.take_ended().is_empty());
        assert_eq!(c.failing(), [(FindingKind::MemoryRepair, hot(0).pci)]);
        c.observe(&[rep(false)], z);
        assert_eq!(c.take_ended().len(), 1);
        assert!(c.failing().is_empty());
    }

    /// A new boot carries over what the previous boot reported, by PCI address (the index
    /// changed): the check does not page again while the condition holds, and ends (a verified
    /// end for the carried incident) once it passes for its window. The DBE count of the old
    /// boot is not taken.
    #[test]
    fn a_new_boot_goes_on_with_what_the_previous_one_reported() {
        let s = Duration::from_secs;
        let mut old = Checks::new(HealthConfig::default());
        let window = old.config().temperature.sustain_secs;
        old.observe(&[hot(90)], s(0));
        assert_eq!(old.observe(&[hot(90)], s(window)).len(), 1);
        let mut m = old.memory("previous");
        m.gpus[0].dbe_last = Some(7);
        let mut new = Checks::new(HealthConfig::default());
        new.carry_over(&m);
        let moved = |t| GpuReading {
            index: 5,
            dbe_volatile: Some(0),
            ..hot(t)
        };
        assert!(
            new.observe(&[moved(90)], s(0)).is_empty(),
            "not paged again"
        );
        assert!(
            new.observe(&[moved(90)], s(2 * window)).is_empty(),
            "still reported, still not paged again"
        );
        assert_eq!(new.failing().len(), 1, "{:?}", new.failing());
        assert!(new.observe(&[moved(60)], s(2 * window + 1)).is_empty());
        assert!(new.observe(&[moved(60)], s(3 * window + 1)).is_empty());
        let ended = new.take_ended();
        assert_eq!(ended.len(), 1, "{ended:?}");
        assert_eq!(ended[0].pci, hot(0).pci);
        // The old boot's DBE count is no baseline: 0 after the reboot is no decrease, and
        // 1 is an increase of 1 over this boot's first reading.
        let f = new.observe(
            &[GpuReading {
                dbe_volatile: Some(1),
                ..moved(60)
            }],
            s(3 * window + 2),
        );
        assert_eq!(f.len(), 1);
        assert!(f[0].title.contains("went up by 1"), "{}", f[0].title);
    }

    #[test]
    fn a_restart_remembers_what_was_told() {
        let mut c = Checks::new(HealthConfig::default());
        let s = Duration::from_secs;
        c.observe(&[hot(90)], s(0));
        assert_eq!(c.observe(&[hot(90)], s(300)).len(), 1);
        let m = c.memory("b");
        let back: Memory = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        let mut again = Checks::new(HealthConfig::default());
        again.restore(&back);
        assert!(again.observe(&[hot(90)], s(0)).is_empty());
        assert!(
            again.observe(&[hot(90)], s(400)).is_empty(),
            "not paged again"
        );
        // Cool for the whole window: the episode ends.
        assert!(again.observe(&[hot(60)], s(430)).is_empty());
        assert!(again.observe(&[hot(60)], s(730)).is_empty());
        assert_eq!(again.take_ended().len(), 1);
        again.observe(&[hot(90)], s(760));
        assert_eq!(
            again.observe(&[hot(90)], s(1060)).len(),
            1,
            "a new episode is"
        );
    }

    #[test]
    fn count_names_the_gone_addresses() {
        let a = PciAddress::parse("0000:17:00.0").unwrap();
        let b = PciAddress::parse("0000:2a:00.0").unwrap();
        let f = count_findings(2, &[a, b], &[a]);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].pci, Some(b));
        assert_eq!(f[0].severity, crate::model::Severity::Critical);
        assert!(count_findings(2, &[a, b], &[a, b]).is_empty());
        assert_eq!(count_findings(3, &[], &[a]).len(), 1);
    }
}
