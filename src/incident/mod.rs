//! Incidents: findings grouped per GPU into one incident per real problem.
//!
//! Pure: findings and the current time go in, incidents come out. Rules, in order, for a finding
//! on a GPU that already has an open incident:
//! - the same (GPU, kind, Xid): a repeat, counted exactly;
//! - "caused by previous Xid N", Xid 45 (cleanup after another error) or Xid 154 (recovery action
//!   for the error before it): an echo of the open incident;
//! - the same family (bus: Xid 79, fallen off the bus, AER, GPU lost/missing; memory: 48, 63,
//!   64, 92, 94, 95, 140, ECC events; GSP: 119, 120, GSP errors): an echo, unless it ranks
//!   higher than the incident's cause, in which case it opens a new incident that absorbs the
//!   old one (an AER warning followed by Xid 79 becomes one critical Xid 79 incident).
//!
//! A new incident is held for a short settle delay before its first alert: whatever arrives for
//! the same GPU meanwhile (the real cause a few milliseconds after an AER warning, Xid 45
//! cleanups, AER echoes) joins the same alert, led by the most causal and most severe finding, so
//! one GPU fault is one page. When its window closes, a digest with exact counts follows if
//! anything was folded in after the first alert; when nothing new has been seen for the quiet
//! period, a resolved notice closes it for the receivers.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use serde::{Deserialize, Serialize};

use crate::classify::XidOverrides;
use crate::clock::Now;
use crate::model::{
    Category, EchoCount, Finding, FindingKind, GpuIdentity, Incident, IncidentPhase, PciAddress,
    Severity, Superseded,
};

/// Where a finding came from, for the rules that treat sources differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Kmsg,
    Nvml,
    Probe,
}

/// NVML Xid events waiting for their kernel-log twin, at most.
const MAX_WAITING: usize = 1024;

/// Findings kept in an incident as samples; the rest are counted.
const MAX_SAMPLES: usize = 10;

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub window_ms: u64,
    pub max_open: usize,
    pub nvml_match_ms: u64,
    pub host: String,
    /// Hex boot id, part of every incident id.
    pub boot_id: String,
    pub overrides: XidOverrides,
    /// How long a new incident's first alert waits for related findings (0: no wait).
    pub settle_ms: u64,
    /// How long an incident must be quiet (no new finding) after its window before a resolved
    /// notice goes out (0: never).
    pub quiet_ms: u64,
    /// How often an incident that ends only when verified ([`ends_verified`]) is told again
    /// while it holds (0: never), so a dead GPU does not fade from a channel that forgets.
    pub remind_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
enum Family {
    Bus,
    Memory,
    Gsp,
    None,
}

fn family_rank(f: &Finding) -> (Family, u8) {
    use FindingKind as K;
    match (f.kind, f.xid) {
        (K::Xid, Some(79)) | (K::FallenOffBus, _) => (Family::Bus, 3),
        (K::GpuLost, _) | (K::GpuMissing, _) => (Family::Bus, 2),
        (K::PcieAer, _) => (Family::Bus, 1),
        (K::Xid, Some(48 | 95 | 140)) => (Family::Memory, 3),
        (K::Xid, Some(64 | 94)) => (Family::Memory, 2),
        (K::EccError, _) if f.severity == Severity::Critical => (Family::Memory, 2),
        (K::Xid, Some(63 | 92)) | (K::EccError, _) => (Family::Memory, 1),
        (K::Xid, Some(119 | 120)) => (Family::Gsp, 3),
        (K::DriverError, _) if f.category == Category::Gsp => (Family::Gsp, 1),
        _ => (Family::None, 0),
    }
}

/// An open incident and its bookkeeping.
#[derive(Debug, Clone)]
struct Open {
    inc: Incident,
    key: Key,
    family: Family,
    rank: u8,
    /// When the window closes, on the monotonic clock.
    deadline_ms: u64,
    /// When it opened and when it last grew, on the monotonic clock (decisions never use the
    /// wall-clock `first_seen_ms`/`last_seen_ms`, which are for display).
    opened_mono_ms: u64,
    last_mono_ms: u64,
    /// Occurrences needed before the first alert (per-Xid threshold).
    min_count: u64,
    emitted: bool,
    /// Until when (monotonic) the first alert is held for related findings; 0 when not held.
    settle_until_ms: u64,
    /// What the last alert already told, so a digest goes out only when there is news.
    told_count: u64,
    /// A lost GPU: the other board already reported at its address, so it is said once.
    told_other: Option<String>,
    /// Monotonic time of the last alert out for it, for reminders.
    told_mono_ms: u64,
    told_echoes: u64,
    echo_total: u64,
    /// Carried over from the previous boot ([`Engine::carry_over`]): a reboot ended nothing by
    /// itself, and the resolved notice says it was verified after the reboot.
    carried: bool,
}

/// What makes two findings the same problem: the GPU, the kind and the Xid, and for a driver
/// error that names no GPU, its topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pci: Option<PciAddress>,
    kind: FindingKind,
    xid: Option<u32>,
    /// 0 unless [`topic`] says otherwise.
    topic: u32,
}

impl Key {
    fn of(f: &Finding) -> Key {
        Key {
            pci: f.pci,
            kind: f.kind,
            xid: f.xid,
            topic: topic(f),
        }
    }
}

/// What a driver error that names no GPU is about. Without it every such error on a host (a GSP
/// boot failure, a display-driver error, a hung task in nvidia_uvm) would be one incident, and
/// the second problem would be counted as a repeat of the first and never paged. The finding
/// says which shape read it (a shape-table row's id, or one of [`crate::classify::shape_id`]),
/// and the module where the shape names one: numbers and task names are not part of it, so a
/// storm of one shape with changing numbers or tasks stays one incident, and rewording a title
/// keeps its incidents whole.
fn topic(f: &Finding) -> u32 {
    use FindingKind as K;
    // One incident per unit: Fabric Manager down and the persistence daemon down are two
    // problems, each ending on its own.
    if let (K::ServiceDown, Some(crate::model::Detail::Service { unit, .. })) = (f.kind, &f.detail)
    {
        let mut h = crate::model::Fnv::default();
        h.eat(unit.as_bytes());
        return (h.finish() as u32).max(1);
    }
    if f.pci.is_some()
        || f.xid.is_some()
        || !matches!(f.kind, K::DriverError | K::DriverInitFailure)
    {
        return 0;
    }
    // What was classified names the topic, never the title's words: the shape that read the
    // line and, for the shapes where it tells two findings apart, the module. A finding no shape
    // read (a source's own) has one topic per kind.
    let Some(id) = f.shape else { return 0 };
    let mut h = crate::model::Fnv::default();
    h.eat(f.category.as_str().as_bytes());
    h.eat(id.as_bytes());
    if let Some(m) = &f.module {
        h.eat(b"/");
        h.eat(m.as_bytes());
    }
    // Never 0, which means "no topic".
    (h.finish() as u32).max(1)
}

/// "10 min", "45 s": a quiet period in the words of a resolved notice.
fn quiet_words(ms: u64) -> String {
    let s = ms / 1000;
    if s >= 60 && s.is_multiple_of(60) {
        format!("{} min", s / 60)
    } else if s >= 60 {
        format!("{} min {} s", s / 60, s % 60)
    } else {
        format!("{s} s")
    }
}

/// The deadline of an incident without a window.
const NO_DEADLINE: u64 = u64::MAX;

/// Kinds that are a state, not an event: open until their source verifies the state is gone
/// ([`Engine::resolve_state`]), never closed by a window or resolved by a quiet period. A
/// health check that still fails is quiet only because it reports once per episode: resolving
/// it on silence would declare a GPU fine while the check says otherwise. The one list the
/// engine, the alert headline and the health task's verified ends go by.
///
/// - `service_down`: the service watch sees the unit active again.
/// - The health checks of `crate::health` that track a condition (not an increase like
///   `ecc_dbe_increase`): the check passes again (for its window where it has one).
///
/// A lost GPU (Xid 79, fallen off the bus, GPU lost, `gpu_missing`) is a state too, but one of
/// its own ([`is_lost`]): it folds with its bus family, so it is not in this list.
pub fn is_state(kind: FindingKind) -> bool {
    use FindingKind as K;
    matches!(
        kind,
        K::ServiceDown
            | K::GpuTemperature
            | K::GpuThrottling
            | K::PcieLinkDegraded
            | K::MemoryRepair
            | K::RecoveryAction
            | K::PowerOverLimit
            | K::PersistenceModeOff
            | K::GpuHeldNoProcess
            | K::GpuHeldByGoneProcess
            | K::GpuMemoryGrowth
            | K::FabricNotRegistered
    )
}

/// A GPU gone from its bus or from NVML: Xid 79, "fallen off the bus", NVML's GPU lost, the
/// probe's `gpu_missing`. Such a GPU does not come back by itself, so its silence in the log
/// says nothing: the incident has no window and no quiet period, and ends only when a probe
/// verifies the same board is on the bus and reachable through NVML again
/// ([`Engine::verify_lost`]).
pub fn is_lost(kind: FindingKind, xid: Option<u32>) -> bool {
    use FindingKind as K;
    matches!(
        (kind, xid),
        (K::Xid, Some(79)) | (K::FallenOffBus, _) | (K::GpuLost, _) | (K::GpuMissing, _)
    )
}

/// Incidents the lost-GPU probe's rounds end ([`Engine::verify_lost`]): a lost GPU, and the
/// driver failing to initialise (a GPU, or the whole driver), which is over only when NVML
/// reaches that GPU (or, naming none, any GPU) again, however quiet the log is meanwhile.
pub fn probe_verified(kind: FindingKind, xid: Option<u32>) -> bool {
    is_lost(kind, xid) || kind == FindingKind::DriverInitFailure
}

/// Incidents that end only by a verified end (a state: [`is_state`], a lost GPU or a driver
/// that did not initialise: [`probe_verified`]), never by time: receivers must keep them firing
/// until the resolved notice comes.
pub fn ends_verified(kind: FindingKind, xid: Option<u32>) -> bool {
    is_state(kind) || probe_verified(kind, xid)
}

mod persist;
mod place;
mod verify;

pub use crate::model::{Reached, Verification};
pub use persist::{SavedIncidents, CHECKPOINT};

/// The page's words for a lost GPU that cannot be verified back.
pub const NO_NVML_NOTE: &str = "xidwatch cannot verify recovery without NVML; this stays open until xidwatch runs with NVML and reaches the same board (same UUID or serial) on the bus again";

/// The page's words for a driver initialisation failure that cannot be verified gone.
pub const NO_NVML_DRIVER_NOTE: &str = "xidwatch cannot verify the driver without NVML; this stays open until xidwatch runs with NVML and NVML reaches the GPU";

/// Why a probe-verified incident of `kind` cannot be verified without NVML.
fn no_nvml_note(kind: FindingKind) -> String {
    if kind == FindingKind::DriverInitFailure {
        NO_NVML_DRIVER_NOTE.to_string()
    } else {
        NO_NVML_NOTE.to_string()
    }
}

/// A closed incident waiting out its quiet period before its resolved notice.
#[derive(Debug, Clone)]
struct Quiet {
    inc: Incident,
    /// Monotonic time at which it counts as resolved.
    until_ms: u64,
}

/// How strongly a finding claims to be the cause of what happened to its GPU: never an echo
/// (Xid 45, Xid 154, "caused by previous Xid"), then the most severe, then the highest rank in its
/// family (Xid 79 over a lost GPU over an AER warning).
fn lead_score(f: &Finding, rank: u8) -> (bool, Severity, u8) {
    let echo =
        f.caused_by.is_some() || (f.kind == FindingKind::Xid && matches!(f.xid, Some(45 | 154)));
    (!echo, f.severity, rank)
}

/// A finding from NVML that waits to see whether the kernel log reports the same Xid.
#[derive(Debug, Clone)]
struct Waiting {
    finding: Finding,
    deadline_ms: u64,
}

/// What the engine counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineStats {
    pub findings: u64,
    pub ignored: u64,
    pub opened: u64,
    pub digests: u64,
    /// Incidents whose per-Xid threshold was not reached within the window.
    pub below_threshold: u64,
    /// Incidents closed early because the table was full.
    pub evicted: u64,
    pub nvml_folded: u64,
    /// Findings folded into a new incident while its first alert was held (settle delay).
    #[serde(default)]
    pub settled: u64,
    /// Resolved notices: incidents quiet for their quiet period.
    #[serde(default)]
    pub resolved: u64,
}

/// The correlation engine.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    /// Keyed by (GPU, kind, Xid): a repeat in a storm is one hash lookup, however many are open.
    open: FxHashMap<Key, Open>,
    waiting: Vec<Waiting>,
    /// Closed incidents waiting out their quiet period, keyed like the open ones.
    quiet: FxHashMap<Key, Quiet>,
    pub stats: EngineStats,
    /// Bumped by everything that changes what [`Engine::snapshot`] would return.
    changes: u64,
    /// NVML runs, so a lost GPU's recovery can be verified; without it the page says it cannot.
    can_verify: bool,
    /// On the first start of a boot: kernel log faults logged before this wall-clock time and
    /// read at start-up are recorded, not paged ([`Engine::set_lookback`]).
    lookback_from_ms: Option<u64>,
    /// Whether an open incident may be [`Incident::before_lookback`]: set by every insert of
    /// one, cleared by the first search that finds none. A recent fault looks for such incidents
    /// to close (see `place`); without this, every finding of a storm walked every open incident
    /// for them, long after start-up.
    maybe_before_lookback: bool,
}

impl Engine {
    pub fn new(cfg: EngineConfig) -> Self {
        Engine {
            cfg,
            open: FxHashMap::default(),
            waiting: Vec::new(),
            quiet: FxHashMap::default(),
            stats: EngineStats::default(),
            changes: 0,
            can_verify: true,
            lookback_from_ms: None,
            maybe_before_lookback: false,
        }
    }

    /// Opens (or restores) an incident under `key`: every insert into the open table goes
    /// through here, so that [`Engine::maybe_before_lookback`] cannot miss one.
    fn insert_open(&mut self, key: Key, open: Open) {
        self.maybe_before_lookback |= open.inc.before_lookback;
        self.open.insert(key, open);
    }

    /// Sets the look-back of the first start of a boot: a fault read at start-up that the
    /// kernel logged before `from_ms` (wall clock) opens an incident marked
    /// [`Incident::before_lookback`], which the daemon records but does not page. `None` (a
    /// restart within the boot, or a look-back of 0) pages everything.
    pub fn set_lookback(&mut self, from_ms: Option<u64>) {
        self.lookback_from_ms = from_ms;
    }

    /// Whether `f`, read at start-up or not, falls before the look-back.
    fn before_lookback(&self, f: &Finding, at_startup: bool) -> bool {
        at_startup
            && matches!((self.lookback_from_ms, f.logged_ms), (Some(from), Some(at)) if at < from)
    }

    /// A counter that moves whenever the engine's state moved: the daemon saves its checkpoint
    /// only then.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Applies a reloaded config; open incidents keep their windows.
    pub fn reconfigure(&mut self, new: EngineConfig) {
        // The host and boot the incidents are keyed by stay.
        self.cfg = EngineConfig {
            host: std::mem::take(&mut self.cfg.host),
            boot_id: std::mem::take(&mut self.cfg.boot_id),
            ..new
        };
    }

    /// Whether NVML runs (opened), so lost GPUs can be verified back. Without it, a lost GPU's
    /// page says it cannot be, instead of promising an end that will never be checked.
    pub fn set_can_verify(&mut self, yes: bool) {
        self.can_verify = yes;
    }

    /// Number of open incidents.
    pub fn open_count(&self) -> usize {
        self.open.len()
    }

    /// Open incidents, for `status`.
    pub fn open_incidents(&self) -> impl Iterator<Item = &Incident> {
        self.open.values().map(|o| &o.inc)
    }

    /// The earliest time `tick` has work to do.
    pub fn next_deadline(&self) -> Option<u64> {
        // A reminder is a deadline too: without it a quiet host (no log line, no probe round)
        // would never wake the loop to say a dead GPU is still dead.
        let remind = self.cfg.remind_ms;
        let reminders = self
            .open
            .values()
            .filter(move |o| remind > 0 && o.emitted && ends_verified(o.key.kind, o.key.xid))
            .map(move |o| o.told_mono_ms.saturating_add(remind));
        self.open
            .values()
            .map(|o| {
                if o.held() && o.inc.count >= o.min_count {
                    o.settle_until_ms.min(o.deadline_ms)
                } else {
                    o.deadline_ms
                }
            })
            .filter(|d| *d != NO_DEADLINE)
            .chain(reminders)
            .chain(self.waiting.iter().map(|w| w.deadline_ms))
            .chain(self.quiet.values().map(|q| q.until_ms))
            .min()
    }

    /// Feeds one finding.
    pub fn push(
        &mut self,
        mut f: Finding,
        origin: Origin,
        now: impl Into<Now>,
        at_startup: bool,
        out: &mut Vec<Incident>,
    ) {
        let now = now.into();
        self.stats.findings += 1;
        self.changes += 1;
        if f.kind == FindingKind::GpuIdentity {
            return;
        }
        let runbook = match self.cfg.overrides.apply(&mut f) {
            crate::classify::overrides::Verdict::Ignore => {
                self.stats.ignored += 1;
                return;
            }
            crate::classify::overrides::Verdict::Keep { runbook } => runbook,
        };
        // The kernel log is the source of truth for Xids: an NVML Xid waits for its twin.
        if origin == Origin::Nvml && f.kind == FindingKind::Xid {
            if self.fold_nvml(&f) {
                return;
            }
            if self.waiting.len() >= MAX_WAITING {
                // An NVML event storm: report rather than queue without bound.
                self.place(f, now, at_startup, runbook, out);
                return;
            }
            self.waiting.push(Waiting {
                finding: f,
                deadline_ms: now.mono_ms.saturating_add(self.cfg.nvml_match_ms),
            });
            return;
        }
        if origin == Origin::Kmsg && f.kind == FindingKind::Xid {
            // The twin of a waiting NVML event: drop the NVML copy.
            let (pci, xid) = (f.pci, f.xid);
            let before = self.waiting.len();
            self.waiting
                .retain(|w| !(w.finding.pci == pci && w.finding.xid == xid));
            self.stats.nvml_folded += (before - self.waiting.len()) as u64;
        }
        self.place(f, now, at_startup, runbook, out);
    }

    fn fold_nvml(&mut self, f: &Finding) -> bool {
        let found = self.open.contains_key(&Key {
            pci: f.pci,
            kind: FindingKind::Xid,
            xid: f.xid,
            topic: 0,
        });
        if found {
            self.stats.nvml_folded += 1;
        }
        found
    }

    /// Closes windows that have ended (digests) and reports NVML Xids that never showed up in
    /// the kernel log.
    pub fn tick(&mut self, now: impl Into<Now>, out: &mut Vec<Incident>) {
        let now = now.into();
        let now_ms = now.mono_ms;
        if self.next_deadline().is_some_and(|d| d <= now_ms) {
            self.changes += 1;
        }
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].deadline_ms <= now_ms {
                let w = self.waiting.swap_remove(i);
                self.place(w.finding, now, false, None, out);
            } else {
                i += 1;
            }
        }
        // First alerts whose settle delay is over, the earliest first.
        let mut settled: Vec<(u64, Key)> = self
            .open
            .values()
            .filter(|o| o.held() && o.settle_until_ms <= now_ms && o.inc.count >= o.min_count)
            .map(|o| (o.opened_mono_ms, o.key))
            .collect();
        settled.sort();
        let released_from = out.len();
        for (_, k) in settled {
            if let Some(o) = self.open.get_mut(&k) {
                release(o, &mut self.stats, out);
            }
        }
        self.mark_host_pages(&mut out[released_from..]);
        if self.cfg.remind_ms > 0 {
            let remind: Vec<Key> = self
                .open
                .values()
                .filter(|o| o.emitted && ends_verified(o.key.kind, o.key.xid))
                .filter(|o| now_ms.saturating_sub(o.told_mono_ms) >= self.cfg.remind_ms)
                .map(|o| o.key)
                .collect();
            for k in remind {
                if let Some(o) = self.open.get_mut(&k) {
                    o.told_mono_ms = now_ms;
                    let mut inc = o.inc.clone();
                    inc.phase = IncidentPhase::Digest;
                    inc.note = Some(match inc.note.take() {
                        Some(n) => format!("still failing; {n}"),
                        None => "still failing".to_string(),
                    });
                    self.stats.digests += 1;
                    out.push(inc);
                }
            }
        }
        let mut due: Vec<(u64, u64, Key)> = self
            .open
            .values()
            .filter(|o| o.deadline_ms <= now_ms)
            .map(|o| (o.deadline_ms, o.opened_mono_ms, o.key))
            .collect();
        // Digests in a stable order: the earliest window first.
        due.sort();
        for (_, _, k) in due {
            if probe_verified(k.kind, k.xid) {
                // A lost GPU's window ends with its digest, but not the incident: it stays open
                // until a probe verifies the board back ([`Engine::verify_lost`]).
                if let Some(o) = self.open.get_mut(&k) {
                    o.deadline_ms = NO_DEADLINE;
                    if o.emitted && (o.inc.count > o.told_count || o.echo_total > o.told_echoes) {
                        o.told_count = o.inc.count;
                        o.told_echoes = o.echo_total;
                        o.told_mono_ms = now_ms;
                        let mut inc = o.inc.clone();
                        inc.phase = IncidentPhase::Digest;
                        self.stats.digests += 1;
                        out.push(inc);
                    }
                }
                continue;
            }
            if let Some(o) = self.open.remove(&k) {
                self.close(o, out);
            }
        }
        let mut quiet: Vec<(u64, Key)> = self
            .quiet
            .iter()
            .filter(|(_, q)| q.until_ms <= now_ms)
            .map(|(k, q)| (q.until_ms, *k))
            .collect();
        quiet.sort();
        for (_, k) in quiet {
            if let Some(q) = self.quiet.remove(&k) {
                let mut inc = q.inc;
                inc.phase = IncidentPhase::Resolved;
                // What is true: it stopped, nobody checked that anything was fixed.
                inc.note = Some(format!("quiet for {}", quiet_words(self.cfg.quiet_ms)));
                self.stats.resolved += 1;
                out.push(inc);
            }
        }
    }

    /// Incidents closed and waiting out their quiet period, for `status`.
    #[cfg(test)]
    pub fn quiet_count(&self) -> usize {
        self.quiet.len()
    }

    /// Open incidents, oldest first: a stable order for digests and saved state.
    fn drain_oldest_first(&mut self) -> Vec<Open> {
        let mut all: Vec<Open> = self.open.drain().map(|(_, o)| o).collect();
        all.sort_by(|a, b| (a.inc.first_seen_ms, &a.inc.id).cmp(&(b.inc.first_seen_ms, &b.inc.id)));
        all
    }

    fn close(&mut self, mut o: Open, out: &mut Vec<Incident>) {
        if !o.emitted && o.inc.count >= o.min_count {
            // Closed while its first alert was held (the table was full, or `scan` ends): the
            // first alert goes out now, with what settled into it.
            release(&mut o, &mut self.stats, out);
        }
        if !o.emitted {
            self.stats.below_threshold += 1;
            return;
        }
        let news = o.inc.count > o.told_count || o.echo_total > o.told_echoes;
        let last_mono = o.last_mono_ms;
        let key = o.key;
        let mut inc = o.inc;
        if news {
            inc.phase = IncidentPhase::Digest;
            self.stats.digests += 1;
            out.push(inc.clone());
        }
        // A lost GPU closed early (a full table, `scan`) is not quiet: it is gone, and a resolved
        // notice would declare it back.
        if self.cfg.quiet_ms > 0 && !probe_verified(key.kind, key.xid) {
            if self.quiet.len() >= self.cfg.max_open {
                // Bounded like the open table: the one closest to resolving goes without notice.
                if let Some(k) = self
                    .quiet
                    .iter()
                    .min_by_key(|(_, q)| (q.until_ms, q.inc.id.clone()))
                    .map(|(k, _)| *k)
                {
                    self.quiet.remove(&k);
                }
            }
            self.quiet.insert(
                key,
                Quiet {
                    until_ms: last_mono.saturating_add(self.cfg.quiet_ms),
                    inc,
                },
            );
        }
    }

    /// Closes every open incident now (digests included), e.g. for `scan`.
    pub fn close_all(&mut self, out: &mut Vec<Incident>) {
        for o in self.drain_oldest_first() {
            self.close(o, out);
        }
        for w in std::mem::take(&mut self.waiting) {
            self.place(w.finding, Now::from(0), false, None, out);
        }
        for o in self.drain_oldest_first() {
            self.close(o, out);
        }
        // Offline, nothing is waited out: there is no later to resolve in.
        self.quiet.clear();
    }
}

impl Open {
    /// The first alert is waiting for its settle delay.
    fn held(&self) -> bool {
        !self.emitted && self.settle_until_ms > 0
    }
}

/// Sends a held incident's first alert, with everything that settled into it.
fn release(o: &mut Open, stats: &mut EngineStats, out: &mut Vec<Incident>) {
    o.emitted = true;
    o.settle_until_ms = 0;
    o.told_count = o.inc.count;
    o.told_echoes = o.echo_total;
    stats.opened += 1;
    out.push(o.inc.clone());
}

fn push_sample(inc: &mut Incident, f: Finding) {
    if inc.findings.len() < MAX_SAMPLES {
        inc.findings.push(f);
    }
}

/// A headline for people: "GPU 3 (0000:17:00.0) fell off the bus", "GPU 0000:2a:00.0: an
/// uncorrectable double-bit ECC error hit GPU memory" (the catalog's summary, first clause).
fn title(f: &Finding) -> String {
    let phrase = match (f.kind, f.xid) {
        (FindingKind::Xid, Some(79)) | (FindingKind::FallenOffBus, _) => {
            " fell off the bus".to_string()
        }
        (FindingKind::Xid, Some(x)) => match crate::classify::catalog::lookup(x) {
            Some(e) => format!(": {}", first_clause(e.summary)),
            None => format!(": {}", f.title),
        },
        _ => format!(": {}", f.title),
    };
    match (f.pci, f.gpu.index) {
        (Some(p), Some(i)) => format!("GPU {i} ({p}){phrase}"),
        (Some(p), None) => format!("GPU {p}{phrase}"),
        _ => f.title.to_string(),
    }
}

/// "An uncorrectable error hit X; jobs are lost." -> "an uncorrectable error hit X".
fn first_clause(s: &str) -> String {
    let end = s.find([';', ':']).unwrap_or(s.len());
    let c = s[..end].trim().trim_end_matches('.');
    let mut chars = c.chars();
    match chars.next() {
        // Keep acronyms ("GSP", "NVLink") as written; lower-case an ordinary first word.
        Some(first) if chars.next().is_some_and(|n| n.is_lowercase()) => first
            .to_lowercase()
            .chain(c[first.len_utf8()..].chars())
            .collect(),
        _ => c.to_string(),
    }
}

/// A stable id from what the incident is: FNV-1a over (boot, GPU, kind, Xid, first sequence).
/// Not `DefaultHasher`: its output may change between Rust releases, and ids must not.
pub fn incident_id(boot: &str, key: &Key, first: u64) -> String {
    let mut h = crate::model::Fnv::default();
    h.eat(boot.as_bytes());
    h.eat(
        key.pci
            .map(|p| p.to_string())
            .unwrap_or_default()
            .as_bytes(),
    );
    h.eat(key.kind.as_str().as_bytes());
    h.eat(&key.xid.unwrap_or(u32::MAX).to_le_bytes());
    if key.topic != 0 {
        h.eat(&key.topic.to_le_bytes());
    }
    h.eat(&first.to_le_bytes());
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> Engine {
        Engine::new(EngineConfig {
            window_ms: 60_000,
            max_open: 8,
            nvml_match_ms: 2_000,
            host: "h".into(),
            boot_id: "b".into(),
            overrides: XidOverrides::default(),
            settle_ms: 0,
            quiet_ms: 0,
            remind_ms: 0,
        })
    }

    /// Feeds a kernel-log finding at time `now`.
    fn feed(e: &mut Engine, f: Finding, now: u64, out: &mut Vec<Incident>) {
        e.push(f, Origin::Kmsg, now, false, out);
    }

    fn xid(pci: &str, x: u32, sev: Severity, seq: u64) -> Finding {
        let mut f = Finding::new(FindingKind::Xid, sev, Category::Driver, format!("Xid {x}"));
        f.xid = Some(x);
        f.pci = Some(PciAddress::parse(pci).unwrap());
        f.origin.seq = Some(seq);
        f
    }

    /// An old fault's incident still closes when a recent fault on its GPU comes after findings
    /// about other GPUs, and after a restart that restored it from the saved state: the search
    /// for such incidents is skipped only once none is open.
    #[test]
    fn an_old_faults_incident_is_found_after_other_findings_and_after_a_restore() {
        let now = 10 * 3_600_000;
        let mut e = engine();
        e.set_lookback(Some(now - 6 * 3_600_000));
        let mut out = Vec::new();
        let mut old = xid("0000:17:00.0", 79, Severity::Critical, 1);
        old.logged_ms = Some(60_000);
        e.push(old, Origin::Kmsg, now, true, &mut out);
        assert!(out[0].before_lookback);
        let recent = |seq: u64, pci: &str| {
            let mut f = xid(pci, 79, Severity::Critical, seq);
            f.logged_ms = Some(now - 60_000);
            f
        };
        for (seq, pci) in [
            (2, "0000:2a:00.0"),
            (3, "0000:3b:00.0"),
            (4, "0000:2a:00.0"),
        ] {
            e.push(recent(seq, pci), Origin::Kmsg, now, true, &mut out);
        }
        let mut restored = engine();
        restored.set_lookback(Some(now - 6 * 3_600_000));
        restored.restore(e.snapshot());
        for engine in [&mut e, &mut restored] {
            out.clear();
            engine.push(recent(5, "0000:17:00.0"), Origin::Kmsg, now, true, &mut out);
            let on_gpu: Vec<&Incident> = engine
                .open_incidents()
                .filter(|i| i.pci.map(|p| p.to_string()).as_deref() == Some("0000:17:00.0"))
                .collect();
            assert_eq!(on_gpu.len(), 1, "{on_gpu:#?}");
            assert!(!on_gpu[0].before_lookback, "{on_gpu:#?}");
        }
    }

    /// An old fault read at start-up is dated when logged and marked, not paged; a recent one on
    /// the same GPU is not swallowed by it as a repeat.
    #[test]
    fn faults_before_the_lookback_are_marked_and_a_recent_one_opens_its_own() {
        let mut e = engine();
        let now = 10 * 3_600_000;
        e.set_lookback(Some(now - 6 * 3_600_000));
        let mut out = Vec::new();
        let mut old = xid("0000:17:00.0", 79, Severity::Critical, 1);
        old.logged_ms = Some(60_000);
        e.push(old, Origin::Kmsg, now, true, &mut out);
        assert_eq!(out.len(), 1);
        assert!(out[0].before_lookback);
        assert_eq!(out[0].first_seen_ms, 60_000);
        let mut recent = xid("0000:17:00.0", 79, Severity::Critical, 2);
        recent.logged_ms = Some(now - 60_000);
        out.clear();
        e.push(recent, Origin::Kmsg, now, true, &mut out);
        let opened: Vec<&Incident> = out
            .iter()
            .filter(|i| i.phase == IncidentPhase::Opened && !i.before_lookback)
            .collect();
        assert_eq!(opened.len(), 1, "{out:#?}");
        assert_eq!(opened[0].first_seen_ms, now - 60_000);
        assert_eq!(opened[0].count, 1);
        // Read live (not at start-up), an old timestamp never hides a fault.
        let mut live = xid("0000:2a:00.0", 48, Severity::Critical, 3);
        live.logged_ms = Some(60_000);
        out.clear();
        e.push(live, Origin::Kmsg, now, false, &mut out);
        assert!(!out[0].before_lookback);
    }

    /// A wall-clock step (NTP, `date -s`, a resumed VM) must not decide anything: the window is
    /// measured on the monotonic clock, the wall clock only labels what people read.
    #[test]
    fn wall_clock_steps_neither_close_nor_freeze_incidents() {
        const DAY: u64 = 86_400_000;
        for step in [DAY * 365, 0u64.wrapping_sub(DAY * 365)] {
            let mut e = engine();
            let mut out = Vec::new();
            let wall0 = 1_800_000_000_000u64;
            let at = |mono: u64, wall: u64| Now {
                mono_ms: mono,
                wall_ms: wall,
            };
            e.push(
                xid("0000:17:00.0", 13, Severity::Warning, 1),
                Origin::Kmsg,
                at(10_000, wall0),
                false,
                &mut out,
            );
            assert_eq!(out.len(), 1);
            // The wall clock jumps a year (forward, or back) one second later.
            let stepped = wall0.wrapping_add(step);
            e.push(
                xid("0000:17:00.0", 13, Severity::Warning, 2),
                Origin::Kmsg,
                at(11_000, stepped),
                false,
                &mut out,
            );
            e.tick(at(11_000, stepped), &mut out);
            assert_eq!(
                out.len(),
                1,
                "a step must not close the window early: {out:#?}"
            );
            assert_eq!(e.open_count(), 1);
            // The window closes when 60 s have passed on the monotonic clock, whatever the wall
            // clock says.
            e.tick(at(10_000 + 59_999, stepped), &mut out);
            assert_eq!(out.len(), 1);
            e.tick(at(10_000 + 60_000, stepped), &mut out);
            assert_eq!(out.len(), 2, "the window closes on time: {out:#?}");
            assert_eq!((out[1].phase, out[1].count), (IncidentPhase::Digest, 2));
            // A new occurrence after the window opens a new incident: one new page, not a storm.
            e.push(
                xid("0000:17:00.0", 13, Severity::Warning, 3),
                Origin::Kmsg,
                at(10_000 + 61_000, stepped),
                false,
                &mut out,
            );
            assert_eq!(out.len(), 3);
            assert_eq!(e.next_deadline(), Some(10_000 + 61_000 + 60_000));
        }
    }

    #[test]
    fn storm_is_one_incident_and_one_digest_with_exact_counts() {
        let mut e = engine();
        let mut out = Vec::new();
        for i in 0..5000 {
            feed(
                &mut e,
                xid("0000:17:00.0", 13, Severity::Warning, i),
                1000 + i,
                &mut out,
            );
        }
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].phase, IncidentPhase::Opened);
        e.tick(1000 + 60_000 + 5000, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!((out[1].phase, out[1].count), (IncidentPhase::Digest, 5000));
        assert_eq!(out[0].id, out[1].id);
        assert_eq!(out[1].findings.len(), MAX_SAMPLES);
    }

    #[test]
    fn echoes_fold_into_their_cause() {
        let mut e = engine();
        let mut out = Vec::new();
        feed(
            &mut e,
            xid("0000:17:00.0", 79, Severity::Critical, 1),
            0,
            &mut out,
        );
        let mut fob = Finding::new(
            FindingKind::FallenOffBus,
            Severity::Critical,
            Category::Pcie,
            "f",
        );
        fob.pci = Some(PciAddress::parse("0000:17:00.0").unwrap());
        e.push(fob, Origin::Kmsg, 1, false, &mut out);
        let mut x45 = xid("0000:17:00.0", 45, Severity::Warning, 3);
        x45.caused_by = Some(79);
        e.push(x45, Origin::Kmsg, 2, false, &mut out);
        e.push(
            xid("0000:17:00.0", 79, Severity::Critical, 4),
            Origin::Nvml,
            3,
            false,
            &mut out,
        );
        feed(
            &mut e,
            xid("0000:2a:00.0", 48, Severity::Critical, 5),
            4,
            &mut out,
        );
        feed(
            &mut e,
            xid("0000:2a:00.0", 63, Severity::Warning, 6),
            5,
            &mut out,
        );
        feed(
            &mut e,
            xid("0000:2a:00.0", 154, Severity::Critical, 7),
            6,
            &mut out,
        );
        assert_eq!(out.len(), 2, "{out:#?}");
        e.tick(100_000, &mut out);
        let digests: Vec<_> = out
            .iter()
            .filter(|i| i.phase == IncidentPhase::Digest)
            .collect();
        assert_eq!(digests.len(), 2);
        assert_eq!(digests.iter().map(|d| d.echoes.len()).sum::<usize>(), 4);
        assert_eq!(e.stats.nvml_folded, 1);
    }

    #[test]
    fn a_higher_ranked_cause_supersedes() {
        let mut e = engine();
        let mut out = Vec::new();
        let mut aer = Finding::new(
            FindingKind::PcieAer,
            Severity::Warning,
            Category::Pcie,
            "aer",
        );
        aer.pci = Some(PciAddress::parse("0000:17:00.0").unwrap());
        e.push(aer, Origin::Kmsg, 0, false, &mut out);
        feed(
            &mut e,
            xid("0000:17:00.0", 79, Severity::Critical, 2),
            1,
            &mut out,
        );
        assert_eq!(out.len(), 2);
        assert_eq!(
            (out[1].xid, out[1].severity),
            (Some(79), Severity::Critical)
        );
        assert_eq!(
            out[1].echoes.len(),
            0,
            "the first alert of the new incident is about its cause"
        );
        assert_eq!(e.open_count(), 1);
        e.tick(100_000, &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(out[2].echoes[0].kind, FindingKind::PcieAer);
    }

    #[test]
    fn thresholds_ignore_and_restore() {
        let t: std::collections::BTreeMap<String, crate::classify::XidOverride> =
            toml::from_str("[13]\nmin_count = 3\nwindow_secs = 10\n[43]\nignore = true\n").unwrap();
        let mut e = Engine::new(EngineConfig {
            overrides: XidOverrides::from_table(t).unwrap(),
            ..engine().cfg
        });
        let mut out = Vec::new();
        feed(
            &mut e,
            xid("0000:17:00.0", 43, Severity::Warning, 1),
            0,
            &mut out,
        );
        feed(
            &mut e,
            xid("0000:17:00.0", 13, Severity::Warning, 2),
            0,
            &mut out,
        );
        feed(
            &mut e,
            xid("0000:17:00.0", 13, Severity::Warning, 3),
            1,
            &mut out,
        );
        assert!(out.is_empty());
        feed(
            &mut e,
            xid("0000:17:00.0", 13, Severity::Warning, 4),
            2,
            &mut out,
        );
        assert_eq!((out.len(), out[0].count), (1, 3));
        // Persist, restore into a fresh engine: the same incident goes on counting.
        let saved = serde_json::to_string(&e.snapshot()).unwrap();
        let mut e2 = Engine::new(e.cfg.clone());
        e2.restore(serde_json::from_str(&saved).unwrap());
        feed(
            &mut e2,
            xid("0000:17:00.0", 13, Severity::Warning, 5),
            3,
            &mut out,
        );
        e2.tick(20_000, &mut out);
        assert_eq!(
            (out.len(), out[1].id == out[0].id, out[1].count),
            (2, true, 4)
        );
        assert_eq!(e.stats.ignored, 1);
    }

    fn settling(settle_ms: u64, quiet_ms: u64) -> Engine {
        Engine::new(EngineConfig {
            settle_ms,
            quiet_ms,
            ..engine().cfg
        })
    }

    fn aer(pci: &str) -> Finding {
        let mut f = Finding::new(
            FindingKind::PcieAer,
            Severity::Warning,
            Category::Pcie,
            "PCIe Bus Error: severity=Uncorrected (Non-Fatal)",
        );
        f.pci = Some(PciAddress::parse(pci).unwrap());
        f
    }

    /// AER, Xid 79 and Xid 45 on one GPU within 50 ms: one page, led by the cause, with the
    /// others counted in it; nothing goes out before the settle delay, nothing twice after it.
    #[test]
    fn one_fault_is_one_page_led_by_its_cause() {
        let mut e = settling(2_000, 0);
        let mut out = Vec::new();
        e.push(aer("0000:17:00.0"), Origin::Kmsg, 10_000, false, &mut out);
        feed(
            &mut e,
            xid("0000:17:00.0", 79, Severity::Critical, 2),
            10_005,
            &mut out,
        );
        let mut x45 = xid("0000:17:00.0", 45, Severity::Warning, 3);
        x45.caused_by = None;
        feed(&mut e, x45, 10_050, &mut out);
        assert!(out.is_empty(), "held for the settle delay: {out:#?}");
        assert_eq!(
            e.next_deadline(),
            Some(12_000),
            "settled from the first finding"
        );
        e.tick(11_999, &mut out);
        assert!(out.is_empty());
        e.tick(12_000, &mut out);
        assert_eq!(out.len(), 1, "{out:#?}");
        let page = &out[0];
        assert_eq!(page.phase, IncidentPhase::Opened);
        assert_eq!((page.kind, page.xid), (FindingKind::Xid, Some(79)));
        assert_eq!(page.severity, Severity::Critical);
        let mut echoes: Vec<_> = page
            .echoes
            .iter()
            .map(|c| (c.kind, c.xid, c.count))
            .collect();
        echoes.sort();
        assert_eq!(
            echoes,
            vec![
                (FindingKind::Xid, Some(45), 1),
                (FindingKind::PcieAer, None, 1)
            ]
        );
        assert_eq!(page.findings[0].xid, Some(79), "the cause leads the page");
        assert_eq!(e.open_count(), 1);
        // The window closes without news: no digest, since the page told everything.
        e.tick(10_005 + 300_000, &mut out);
        assert_eq!(out.len(), 1, "{out:#?}");
    }

    /// The order of arrival does not matter: an echo first, then the cause.
    #[test]
    fn the_cause_leads_whatever_arrives_first() {
        let mut e = settling(2_000, 0);
        let mut out = Vec::new();
        let mut x45 = xid("0000:17:00.0", 45, Severity::Warning, 1);
        x45.caused_by = Some(79);
        feed(&mut e, x45, 0, &mut out);
        feed(
            &mut e,
            xid("0000:17:00.0", 79, Severity::Critical, 2),
            30,
            &mut out,
        );
        feed(
            &mut e,
            xid("0000:17:00.0", 79, Severity::Critical, 3),
            40,
            &mut out,
        );
        // Another GPU is another page.
        feed(
            &mut e,
            xid("0000:2a:00.0", 13, Severity::Warning, 4),
            40,
            &mut out,
        );
        e.tick(2_040, &mut out);
        assert_eq!(out.len(), 2, "{out:#?}");
        let page = out
            .iter()
            .find(|i| i.pci == out[0].pci && i.xid == Some(79));
        let page = page.expect("the Xid 79 page");
        assert_eq!(page.count, 2);
        assert_eq!(page.echoes.len(), 1);
        assert!(out.iter().any(|i| i.xid == Some(13)));
    }

    /// 0 disables the settle delay: the first alert goes out at once, as before.
    #[test]
    fn zero_settle_sends_at_once() {
        let mut e = settling(0, 0);
        let mut out = Vec::new();
        feed(
            &mut e,
            xid("0000:17:00.0", 79, Severity::Critical, 1),
            0,
            &mut out,
        );
        assert_eq!(out.len(), 1);
    }

    /// The same critical fault on a second GPU within the first's settle delay comes out in the
    /// same tick (the alert stage makes one host page of them); each keeps its own incident.
    /// Another fault on another GPU keeps its own timing.
    #[test]
    fn the_same_critical_fault_on_two_gpus_settles_together() {
        let mut e = settling(500, 0);
        let mut out = Vec::new();
        feed(
            &mut e,
            xid("0000:19:00.0", 79, Severity::Critical, 1),
            0,
            &mut out,
        );
        feed(
            &mut e,
            xid("0000:1a:00.0", 79, Severity::Critical, 2),
            300,
            &mut out,
        );
        feed(
            &mut e,
            xid("0000:3b:00.0", 13, Severity::Warning, 3),
            300,
            &mut out,
        );
        assert_eq!(e.next_deadline(), Some(500));
        e.tick(500, &mut out);
        let got: Vec<_> = out
            .iter()
            .map(|i| (i.pci.map(|p| p.to_string()), i.xid))
            .collect();
        assert_eq!(
            got,
            vec![
                (Some("0000:19:00.0".to_string()), Some(79)),
                (Some("0000:1a:00.0".to_string()), Some(79)),
            ]
        );
        assert_eq!(e.open_count(), 3);
        e.tick(800, &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(out[2].xid, Some(13));
    }

    /// Host-level findings (config refused, kernel log overrun) have no GPU to wait for.
    #[test]
    fn host_findings_do_not_settle() {
        let mut e = settling(2_000, 0);
        let mut out = Vec::new();
        let f = Finding::new(
            FindingKind::KmsgOverrun,
            Severity::Warning,
            Category::Informational,
            "overrun",
        );
        e.push(f, Origin::Kmsg, 0, false, &mut out);
        assert_eq!(out.len(), 1);
    }

    /// A held first alert survives a restart and still goes out once.
    #[test]
    fn a_held_alert_survives_a_restart() {
        let mut e = settling(2_000, 0);
        let mut out = Vec::new();
        feed(
            &mut e,
            xid("0000:17:00.0", 79, Severity::Critical, 1),
            100,
            &mut out,
        );
        let saved = serde_json::to_string(&e.snapshot()).unwrap();
        let mut e2 = Engine::new(e.cfg.clone());
        e2.restore(serde_json::from_str(&saved).unwrap());
        e2.tick(2_100, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].phase, IncidentPhase::Opened);
    }

    /// A health check's incident is a state: no window and no quiet period close it while the
    /// check still fails; its verified end does, at once. It stands alone: an Xid on the same
    /// GPU in its settle delay is its own page, and the check's own settle does not take it in.
    #[test]
    fn a_health_check_incident_ends_only_on_its_verified_end() {
        let mut e = settling(2_000, 1_000);
        let mut out = Vec::new();
        let mut repair = Finding::new(
            FindingKind::MemoryRepair,
            Severity::Warning,
            Category::Memory,
            "GPU memory needs repair".to_string(),
        );
        repair.pci = PciAddress::parse("0000:17:00.0").ok();
        e.push(repair.clone(), Origin::Nvml, 0, false, &mut out);
        feed(
            &mut e,
            xid("0000:17:00.0", 13, Severity::Warning, 1),
            500,
            &mut out,
        );
        e.tick(10_000_000, &mut out);
        let phases: Vec<(FindingKind, IncidentPhase)> =
            out.iter().map(|i| (i.kind, i.phase)).collect();
        assert_eq!(
            phases,
            [
                (FindingKind::MemoryRepair, IncidentPhase::Opened),
                (FindingKind::Xid, IncidentPhase::Opened),
                (FindingKind::Xid, IncidentPhase::Resolved),
            ],
            "{out:#?}"
        );
        assert_eq!(e.open_count(), 1, "the check's incident stays open");
        e.resolve_state(&repair, 10_000_001, &mut out);
        assert_eq!(out.len(), 4);
        assert_eq!(
            (out[3].kind, out[3].phase, out[3].id.as_str()),
            (
                FindingKind::MemoryRepair,
                IncidentPhase::Resolved,
                out[0].id.as_str()
            )
        );
        assert_eq!(e.open_count(), 0);
        // An event's "end" from a source is no end: it waits out its quiet period.
        feed(
            &mut e,
            xid("0000:17:00.0", 13, Severity::Warning, 9),
            20_000_000,
            &mut out,
        );
        e.tick(20_002_000, &mut out);
        let n = out.len();
        e.resolve_state(
            &xid("0000:17:00.0", 13, Severity::Warning, 9),
            20_002_001,
            &mut out,
        );
        assert_eq!(out.len(), n);
        assert_eq!(e.open_count(), 1);
    }

    /// Quiet for the quiet period after the window: one resolved notice; a new finding on the
    /// same key before that means the GPU is not quiet, and the old incident is not resolved.
    #[test]
    fn quiet_incidents_resolve_once() {
        let mut e = settling(0, 600_000);
        let mut out = Vec::new();
        feed(
            &mut e,
            xid("0000:17:00.0", 48, Severity::Critical, 1),
            0,
            &mut out,
        );
        feed(
            &mut e,
            xid("0000:17:00.0", 48, Severity::Critical, 2),
            1_000,
            &mut out,
        );
        e.tick(60_000, &mut out);
        assert_eq!(out.len(), 2, "opened, digest: {out:#?}");
        assert_eq!(e.next_deadline(), Some(601_000));
        e.tick(600_999, &mut out);
        assert_eq!(out.len(), 2);
        e.tick(601_000, &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(out[2].phase, IncidentPhase::Resolved);
        assert_eq!((out[2].id.as_str(), out[2].count), (out[0].id.as_str(), 2));
        e.tick(10_000_000, &mut out);
        assert_eq!(out.len(), 3, "resolved once");
        assert_eq!(e.stats.resolved, 1);

        let mut e = settling(0, 600_000);
        let mut out = Vec::new();
        feed(
            &mut e,
            xid("0000:17:00.0", 13, Severity::Warning, 1),
            0,
            &mut out,
        );
        e.tick(60_000, &mut out);
        feed(
            &mut e,
            xid("0000:17:00.0", 13, Severity::Warning, 2),
            100_000,
            &mut out,
        );
        e.tick(650_000, &mut out);
        assert_eq!(out.len(), 2, "two pages, nothing resolved yet: {out:#?}");
        e.tick(760_000, &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(
            (out[2].phase, &out[2].id),
            (IncidentPhase::Resolved, &out[1].id)
        );
    }

    /// A lost GPU (Xid 79) never resolves on silence, whatever the quiet period; a probe round
    /// that sees another board is said once and ends nothing; the same board ends it, saying so.
    #[test]
    fn a_lost_gpu_ends_only_when_the_same_board_is_verified() {
        let mut e = settling(0, 1_000);
        let mut out = Vec::new();
        let mut f = xid("0000:17:00.0", 79, Severity::Critical, 1);
        f.gpu.uuid = Some("GPU-a".into());
        let pci = f.pci.unwrap();
        feed(&mut e, f, 0, &mut out);
        e.tick(10_000_000, &mut out);
        assert_eq!(out.len(), 1, "{out:#?}");
        let round = |uuid: &str, at| Verification {
            at_mono_ms: at,
            on_bus: vec![pci],
            reached: vec![Reached {
                pci,
                uuid: Some(uuid.into()),
                serial: None,
            }],
        };
        e.verify_lost(&round("GPU-b", 10_000_001), 10_000_001, &mut out);
        e.verify_lost(&round("GPU-b", 10_000_002), 10_000_002, &mut out);
        assert_eq!(out.len(), 2);
        assert!(out[1].note.as_deref().unwrap().contains("different board"));
        assert_eq!(e.open_count(), 1);
        e.verify_lost(&round("GPU-a", 10_000_003), 10_000_003, &mut out);
        assert_eq!(out[2].phase, IncidentPhase::Resolved);
        assert_eq!(
            out[2].note.as_deref(),
            Some("recovered: GPU-a reachable again (same board)")
        );
        assert_eq!(e.open_count(), 0);
    }

    /// NVML's `gpu_missing`, paged before the kernel's Xid 79 on the same GPU: the Xid 79
    /// supersedes it and remembers it (so a receiver ends its alert), it gets no resolved notice
    /// of its own while the GPU is still lost, and the memory survives a restart. One that was
    /// never paged (still settling) is not remembered: nothing went out to end.
    #[test]
    fn a_paged_incident_superseded_by_a_stronger_cause_ends_with_it() {
        let mut e = settling(500, 1_000);
        let mut out = Vec::new();
        let mut missing = Finding::new(
            FindingKind::GpuMissing,
            Severity::Critical,
            Category::Pcie,
            "GPU missing".to_string(),
        );
        missing.pci = Some(PciAddress::parse("0000:17:00.0").unwrap());
        missing.gpu.uuid = Some("GPU-a".into());
        missing.gpu.index = Some(0);
        e.push(missing, Origin::Probe, 0, false, &mut out);
        e.tick(600, &mut out);
        assert_eq!(out.len(), 1, "{out:#?}");
        let missing_id = out[0].id.clone();
        feed(
            &mut e,
            xid("0000:17:00.0", 79, Severity::Critical, 7),
            1_000,
            &mut out,
        );
        e.tick(1_600, &mut out);
        assert_eq!(out.len(), 2, "{out:#?}");
        let sup = &out[1].supersedes;
        assert_eq!(sup.len(), 1, "{:#?}", out[1]);
        assert_eq!(sup[0].id, missing_id);
        assert_eq!(sup[0].kind, FindingKind::GpuMissing);
        assert_eq!(sup[0].gpu.index, Some(0));
        assert_eq!(e.open_count(), 1);

        // A restart: the successor still knows what it superseded.
        let mut e2 = settling(0, 1_000);
        e2.restore(e.snapshot());
        let pci = PciAddress::parse("0000:17:00.0").unwrap();
        e2.tick(10_000_000, &mut out);
        assert!(
            out[2..]
                .iter()
                .all(|i| i.phase != IncidentPhase::Resolved && i.id != missing_id),
            "{out:#?}"
        );
        let back = Verification {
            at_mono_ms: 10_000_001,
            on_bus: vec![pci],
            reached: vec![Reached {
                pci,
                uuid: Some("GPU-a".into()),
                serial: None,
            }],
        };
        e2.verify_lost(&back, 10_000_001, &mut out);
        let resolved: Vec<&Incident> = out
            .iter()
            .filter(|i| i.phase == IncidentPhase::Resolved)
            .collect();
        assert_eq!(resolved.len(), 1, "{out:#?}");
        assert_eq!(resolved[0].xid, Some(79));
        assert_eq!(resolved[0].supersedes.len(), 1);
        assert_eq!(resolved[0].supersedes[0].id, missing_id);

        // Superseded while still settling: never paged, nothing to end.
        let mut e = settling(500, 1_000);
        let mut out = Vec::new();
        let mut missing = Finding::new(
            FindingKind::GpuMissing,
            Severity::Critical,
            Category::Pcie,
            "GPU missing".to_string(),
        );
        missing.pci = Some(pci);
        e.push(missing, Origin::Probe, 0, false, &mut out);
        feed(
            &mut e,
            xid("0000:17:00.0", 79, Severity::Critical, 7),
            100,
            &mut out,
        );
        e.tick(600, &mut out);
        assert_eq!(out.len(), 1, "{out:#?}");
        assert!(out[0].supersedes.is_empty(), "{:#?}", out[0]);
    }

    /// Two GPUs' Xid 79 released together: the second names the first as its host page, in
    /// its opening alert and in every later notice, across a restart; a fault of another kind
    /// released in the same tick is no member.
    #[test]
    fn members_of_a_host_page_name_it_in_every_notice() {
        let mut e = settling(500, 1_000);
        let mut out = Vec::new();
        feed(
            &mut e,
            xid("0000:19:00.0", 79, Severity::Critical, 1),
            0,
            &mut out,
        );
        let mut b = xid("0000:1a:00.0", 79, Severity::Critical, 2);
        b.gpu.uuid = Some("GPU-b".into());
        feed(&mut e, b, 20, &mut out);
        feed(
            &mut e,
            xid("0000:3b:00.0", 48, Severity::Critical, 3),
            0,
            &mut out,
        );
        e.tick(500, &mut out);
        assert_eq!(out.len(), 3, "{out:#?}");
        let at = |pci: &str| {
            out.iter()
                .find(|i| i.pci.map(|p| p.to_string()).as_deref() == Some(pci))
                .expect(pci)
        };
        let lead = at("0000:19:00.0").id.clone();
        assert_eq!(at("0000:19:00.0").host_page, None);
        assert_eq!(at("0000:1a:00.0").host_page.as_deref(), Some(lead.as_str()));
        assert_eq!(
            at("0000:3b:00.0").host_page,
            None,
            "another fault is not in the group"
        );
        let member = at("0000:1a:00.0").id.clone();
        let mut e2 = settling(500, 1_000);
        e2.restore(e.snapshot());
        let pci = PciAddress::parse("0000:1a:00.0").unwrap();
        let back = Verification {
            at_mono_ms: 10_000_001,
            on_bus: vec![pci],
            reached: vec![Reached {
                pci,
                uuid: Some("GPU-b".into()),
                serial: None,
            }],
        };
        e2.verify_lost(&back, 10_000_001, &mut out);
        let r = out
            .iter()
            .find(|i| i.id == member && i.phase == IncidentPhase::Resolved)
            .expect("the member's resolved notice");
        assert_eq!(r.host_page.as_deref(), Some(lead.as_str()));
    }

    /// A worse finding on a paged incident raises it (a digest at once), and the incident
    /// remembers the severity it was paged under, across a restart, so that alert can be ended;
    /// restored, it names its GPU as its pages did (index and name too), so its later notices
    /// carry the same labels and end the same alerts.
    #[test]
    fn a_raised_incident_remembers_what_it_was_paged_as_and_under_which_gpu() {
        let mut e = engine();
        let mut out = Vec::new();
        let mut first = xid("0000:17:00.0", 13, Severity::Warning, 1);
        first.gpu = GpuIdentity {
            index: Some(3),
            uuid: Some("GPU-5c7a1e4e-0000-0000-0000-000000000003".into()),
            serial: Some("1652722001234".into()),
            name: Some("NVIDIA H100 80GB HBM3".into()),
        };
        feed(&mut e, first, 1_000, &mut out);
        assert_eq!(out.len(), 1, "paged as a warning: {out:#?}");
        assert!(out[0].paged_as.is_empty());
        out.clear();
        feed(
            &mut e,
            xid("0000:17:00.0", 154, Severity::Critical, 2),
            2_000,
            &mut out,
        );
        assert_eq!(out.len(), 1, "{out:#?}");
        assert_eq!(
            (out[0].phase, out[0].severity, out[0].paged_as.clone()),
            (
                IncidentPhase::Digest,
                Severity::Critical,
                vec![Severity::Warning]
            )
        );
        let id = out[0].id.clone();
        // Restored from the checkpoint, the incident still says so on its next notice.
        let mut again = engine();
        again.restore(e.snapshot());
        let open: Vec<&Incident> = again.open_incidents().collect();
        assert_eq!(open[0].gpu, out[0].gpu, "the GPU as its pages named it");
        assert_eq!(open.len(), 1);
        assert_eq!(
            (open[0].id.as_str(), open[0].paged_as.clone()),
            (id.as_str(), vec![Severity::Warning])
        );
    }

    /// A lost GPU's reminder is a deadline of its own, so a host with nothing else to wake the
    /// loop still says, on time, that the GPU is still lost.
    #[test]
    fn a_reminder_is_a_deadline() {
        let mut e = settling(0, 1_000);
        e.cfg.remind_ms = 5_000;
        let mut out = Vec::new();
        feed(
            &mut e,
            xid("0000:17:00.0", 79, Severity::Critical, 1),
            0,
            &mut out,
        );
        e.tick(60_000, &mut out); // the window's end: a lost GPU stays open without deadline
        let next = e.next_deadline().expect("the reminder's deadline");
        assert!(next <= 65_000, "{next}");
        let before = out.len();
        e.tick(next, &mut out);
        assert_eq!(out.len(), before + 1, "{out:#?}");
        assert_eq!(out[before].note.as_deref(), Some("still failing"));
    }

    /// The first start of a new boot: a lost GPU of the previous boot stays open, without
    /// window, until the probe verifies the same board ("after the reboot"); an event of that
    /// boot (open, or waiting out its quiet period) gets its resolved notice at once, saying
    /// the reboot ended it; one never paged is dropped.
    #[test]
    fn a_new_boot_carries_states_over_and_ends_events() {
        let mut e = settling(0, 600_000);
        let mut out = Vec::new();
        let mut lost = xid("0000:17:00.0", 79, Severity::Critical, 1);
        lost.gpu.uuid = Some("GPU-a".into());
        feed(&mut e, lost, 0, &mut out);
        feed(
            &mut e,
            xid("0000:3b:00.0", 13, Severity::Warning, 2),
            0,
            &mut out,
        );
        feed(
            &mut e,
            xid("0000:3c:00.0", 31, Severity::Warning, 3),
            0,
            &mut out,
        );
        e.tick(70_000, &mut out); // Xid 13 and 31 closed, waiting out their quiet period
        feed(
            &mut e,
            xid("0000:3b:00.0", 43, Severity::Warning, 4),
            80_000,
            &mut out,
        );
        let saved = e.snapshot();
        let ids: Vec<String> = out.iter().map(|i| i.id.clone()).collect();

        // The new boot: its monotonic clock starts again near 0.
        let mut n = settling(0, 600_000);
        let mut out = Vec::new();
        n.carry_over(saved, "oldboot", 5_000, &mut out);
        assert_eq!(n.open_count(), 1, "only the lost GPU goes on");
        assert_eq!(out.len(), 3, "{out:#?}");
        for r in &out {
            assert_eq!(r.phase, IncidentPhase::Resolved);
            assert_eq!(
                r.note.as_deref(),
                Some("ended by the reboot: not seen since")
            );
            assert!(ids.contains(&r.id), "the same incident ids");
            assert_eq!(r.boot_id.as_deref(), Some("oldboot"));
        }
        assert_eq!(
            n.next_deadline(),
            None,
            "no window: it ends only when verified"
        );
        // Another engine on the same carried state: an Xid 79 logged in the new boot is a new
        // fault with its own page, superseding the carried incident (not resolving it).
        let mut again = settling(0, 600_000);
        let mut out2 = Vec::new();
        again.carry_over(n.snapshot(), "oldboot", 5_000, &mut out2);
        let mut lost = xid("0000:17:00.0", 79, Severity::Critical, 9);
        lost.gpu.uuid = Some("GPU-a".into());
        feed(&mut again, lost, 5_500, &mut out2);
        let opened = out2.last().unwrap();
        assert_eq!(opened.phase, IncidentPhase::Opened);
        assert!(!ids.contains(&opened.id), "a new incident");
        assert_eq!(opened.supersedes.len(), 1, "{opened:#?}");
        assert!(ids.contains(&opened.supersedes[0].id));
        assert_eq!(again.open_count(), 1);
        let pci = PciAddress::parse("0000:17:00.0").unwrap();
        let back = Verification {
            at_mono_ms: 6_000,
            on_bus: vec![pci],
            reached: vec![Reached {
                pci,
                uuid: Some("GPU-a".into()),
                serial: None,
            }],
        };
        n.verify_lost(&back, 6_000, &mut out);
        let r = out.last().unwrap();
        assert_eq!(r.phase, IncidentPhase::Resolved);
        assert_eq!(
            r.note.as_deref(),
            Some("recovered after the reboot: GPU-a reachable again (same board)")
        );
        assert!(ids.contains(&r.id));
    }

    /// A driver that did not initialise is a state: no quiet period ends it, only a probe
    /// round in which NVML reaches the GPU it named (or, naming none, any GPU).
    #[test]
    fn a_driver_init_failure_ends_only_when_nvml_reaches_the_gpu() {
        let mut e = settling(0, 1_000);
        let mut out = Vec::new();
        let mut host = Finding::new(
            FindingKind::DriverInitFailure,
            Severity::Critical,
            Category::Driver,
            "the NVIDIA kernel module failed to load".to_string(),
        );
        host.origin.seq = Some(1);
        let mut gpu = host.clone();
        gpu.pci = Some(PciAddress::parse("0000:17:00.0").unwrap());
        gpu.title = "RmInitAdapter failed".into();
        gpu.origin.seq = Some(2);
        feed(&mut e, host, 0, &mut out);
        feed(&mut e, gpu, 0, &mut out);
        assert_eq!(out.len(), 2);
        e.tick(10_000_000, &mut out);
        assert!(
            out.iter().all(|i| i.phase != IncidentPhase::Resolved),
            "no end on silence: {out:#?}"
        );
        assert_eq!(e.open_count(), 2);
        let other = PciAddress::parse("0000:3b:00.0").unwrap();
        let round = |pcis: Vec<PciAddress>, at| Verification {
            at_mono_ms: at,
            on_bus: pcis.clone(),
            reached: pcis
                .into_iter()
                .map(|pci| Reached {
                    pci,
                    uuid: None,
                    serial: None,
                })
                .collect(),
        };
        e.verify_lost(&round(Vec::new(), 10_000_001), 10_000_001, &mut out);
        assert_eq!(e.open_count(), 2, "NVML reaches nothing");
        e.verify_lost(&round(vec![other], 10_000_002), 10_000_002, &mut out);
        assert_eq!(
            e.open_count(),
            1,
            "the driver is up; the failed GPU is not reached"
        );
        let r = out.last().unwrap();
        assert_eq!(r.phase, IncidentPhase::Resolved);
        assert_eq!(
            r.note.as_deref(),
            Some("verified: the driver is loaded and NVML reaches 1 GPU(s)")
        );
        let failed = PciAddress::parse("0000:17:00.0").unwrap();
        e.verify_lost(
            &round(vec![other, failed], 10_000_003),
            10_000_003,
            &mut out,
        );
        assert_eq!(e.open_count(), 0);
        assert_eq!(
            out.last().unwrap().note.as_deref(),
            Some("verified: the driver is loaded and NVML reaches 0000:17:00.0")
        );
    }

    /// A restart during the quiet period keeps the resolved notice.
    #[test]
    fn the_quiet_period_survives_a_restart() {
        let mut e = settling(0, 600_000);
        let mut out = Vec::new();
        feed(
            &mut e,
            xid("0000:17:00.0", 48, Severity::Critical, 1),
            0,
            &mut out,
        );
        e.tick(60_000, &mut out);
        assert_eq!((e.open_count(), e.quiet_count()), (0, 1));
        let saved = serde_json::to_string(&e.snapshot()).unwrap();
        let mut e2 = Engine::new(e.cfg.clone());
        e2.restore(serde_json::from_str(&saved).unwrap());
        assert_eq!((e2.open_count(), e2.quiet_count()), (0, 1));
        e2.tick(599_999, &mut out);
        assert_eq!(out.len(), 1);
        e2.tick(600_000, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(
            (out[1].phase, &out[1].id),
            (IncidentPhase::Resolved, &out[0].id)
        );
    }

    #[test]
    fn ids_are_stable() {
        let k = Key {
            pci: Some(PciAddress::parse("0000:17:00.0").unwrap()),
            kind: FindingKind::Xid,
            xid: Some(79),
            topic: 0,
        };
        assert_eq!(incident_id("b", &k, 7), incident_id("b", &k, 7));
        assert_ne!(incident_id("b", &k, 7), incident_id("b", &k, 8));
        assert_eq!(incident_id("b", &k, 7).len(), 16);
        // Pinned: ids are the receivers' dedup key across restarts and upgrades; a change to the
        // hash would make every open incident a new one. Change this only on purpose.
        assert_eq!(incident_id("b", &k, 7), "c62e07a398b0bdd7");
    }

    /// Classifies a log as `scan` does and returns its findings.
    fn classify(log: &str) -> Vec<Finding> {
        crate::classify::testing::read(&log.lines().collect::<Vec<_>>(), false)
    }

    #[test]
    fn driver_errors_that_name_no_gpu_are_told_apart_by_what_they_are() {
        // Real lines (fixtures/corpus): a display-driver error, a probe failure and a hung task
        // in nvidia_uvm. None names a GPU address; each is a different problem and is paged.
        let first = classify(
            "[ 3702.312931] nvidia-modeset: ERROR: GPU:0: Failed to query display engine channel state: 0x0000c57e:4:0:0x0000000f\n\
             [ 9687.215135] NVRM: The NVIDIA probe routine was not called for 1 device(s).\n\
             [  721.028170] INFO: task nvc:[driver]:5403 blocked for more than 120 seconds.\n\
             [  721.028346] Call Trace:\n\
             [  721.028422]  [<ffffffffa09c376e>] uvm_gpu_retain_by_uuid+0x1e/0x40 [nvidia_uvm]\n",
        );
        assert_eq!(first.len(), 3, "{first:#?}");
        assert!(first.iter().all(|f| f.pci.is_none()));
        let mut e = engine();
        let mut out = Vec::new();
        for f in first {
            feed(&mut e, f, 1_000, &mut out);
        }
        assert_eq!(out.len(), 3, "three problems, three pages: {out:#?}");
        let ids: std::collections::HashSet<_> = out.iter().map(|i| i.id.clone()).collect();
        assert_eq!(ids.len(), 3);

        // The same shapes again with other numbers and another task: repeats, not new pages.
        let again = classify(
            "[ 3702.313188] nvidia-modeset: ERROR: GPU:0: Failed to query display engine channel state: 0x0000c57e:6:0:0x0000000f\n\
             [ 9690.000001] NVRM: The NVIDIA probe routine was not called for 3 device(s).\n\
             [  841.028170] INFO: task python3:7781 blocked for more than 240 seconds.\n\
             [  841.028346] Call Trace:\n\
             [  841.028422]  [<ffffffffa09c376e>] uvm_gpu_retain_by_uuid+0x1e/0x40 [nvidia_uvm]\n",
        );
        assert_eq!(again.len(), 3);
        out.clear();
        for f in again {
            feed(&mut e, f, 2_000, &mut out);
        }
        assert!(out.is_empty(), "{out:#?}");
        assert_eq!(e.open_count(), 3);
        assert!(e.open_incidents().all(|i| i.count == 2));

        // The topic survives a restart.
        let saved = serde_json::to_string(&e.snapshot()).unwrap();
        let mut e2 = engine();
        e2.restore(serde_json::from_str(&saved).unwrap());
        let probe =
            classify("[ 9700.1] NVRM: The NVIDIA probe routine was not called for 2 device(s).\n");
        feed(&mut e2, probe.into_iter().next().unwrap(), 3_000, &mut out);
        assert!(out.is_empty(), "{out:#?}");
        assert_eq!(e2.open_count(), 3);
    }

    #[test]
    fn a_driver_error_is_keyed_by_its_shape_and_module_never_by_its_title() {
        // Real lines (fixtures/corpus): two module-load failures and two hung tasks, in two
        // modules each. None names a GPU.
        let read = classify(
            "[   12.1] systemd-modules-load[1054]: Failed to insert module 'nvidia_uvm': Cannot allocate memory\n\
             [   12.2] modprobe: FATAL: Module nvidia-drm not found.\n\
             [  721.028170] INFO: task nvc:[driver]:5403 blocked for more than 120 seconds.\n\
             [  721.028346] Call Trace:\n\
             [  721.028422]  [<ffffffffa09c376e>] uvm_gpu_retain_by_uuid+0x1e/0x40 [nvidia_uvm]\n\
             [  900.000001] irq 16: nobody cared\n\
             [  961.028170] INFO: task Xorg:1234 blocked for more than 120 seconds.\n\
             [  961.028346] Call Trace:\n\
             [  961.028422]  [<ffffffffa0a1b2c3>] nvkms_ioctl+0x1e/0x40 [nvidia_modeset]\n",
        );
        assert_eq!(read.len(), 4, "{read:#?}");
        assert!(read.iter().all(|f| f.pci.is_none() && f.shape.is_some()));
        let modules: Vec<_> = read.iter().map(|f| f.module.as_deref()).collect();
        assert_eq!(
            modules,
            [
                Some("nvidia_uvm"),
                Some("nvidia-drm"),
                Some("nvidia_uvm"),
                Some("nvidia_modeset")
            ]
        );
        let mut e = engine();
        let mut out = Vec::new();
        for f in read.iter().cloned() {
            feed(&mut e, f, 1_000, &mut out);
        }
        assert_eq!(out.len(), 4, "one page per module and shape: {out:#?}");

        // The same findings with their titles reworded: repeats of the open incidents.
        out.clear();
        for mut f in read.iter().cloned() {
            f.title = format!("reworded: {}", f.title.len()).into();
            feed(&mut e, f, 2_000, &mut out);
        }
        assert!(out.is_empty(), "a title is not a key: {out:#?}");
        assert_eq!(e.open_count(), 4);

        // One title, two shapes: two problems.
        let mut a = read[0].clone();
        a.shape = Some(crate::classify::shape_id::INIT_MODULE_SYMBOL);
        feed(&mut e, a, 3_000, &mut out);
        assert_eq!(out.len(), 1, "{out:#?}");
    }

    #[test]
    fn the_table_is_bounded() {
        let mut e = engine();
        let mut out = Vec::new();
        for bus in 0..50u32 {
            e.push(
                xid(
                    &format!("0000:{bus:02x}:00.0"),
                    13,
                    Severity::Warning,
                    bus as u64,
                ),
                Origin::Kmsg,
                bus as u64,
                false,
                &mut out,
            );
        }
        assert_eq!(e.open_count(), 8);
        assert_eq!(e.stats.evicted, 42);
    }
}
