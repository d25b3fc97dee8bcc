//! What the running daemon knows about itself, for `xidwatch status` and the metrics endpoint.
//!
//! The daemon loop records into one shared [`Telemetry`] (`Arc<Telemetry>`): plain counters are
//! atomics, everything with labels or text sits behind one small mutex that is held only to copy
//! or bump a few values. Readers take a [`StatusSnapshot`], a plain serialisable value: the
//! control socket and `status.json` carry it as JSON, and the Prometheus endpoint renders from it.
//!
//! Label cardinality is bounded here, once, so no exporter has to think about it: at most
//! [`MAX_FINDING_SERIES`] distinct (kind, Xid, GPU) series are kept; findings beyond that are
//! counted under `pci="other"`, and past twice that under `xid="other"` as well, which leaves a
//! fixed number of series (kinds x severities) however strange the kernel log gets.

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::alert::AlertStatus;
use crate::classify::XidOverrides;
use crate::model::{Finding, FindingKind, Incident, IncidentPhase, Severity};
/// The status document's types live with the verdict that reads them; the daemon fills them.
pub use crate::verdict::status::*;

/// Label value for series folded together.
pub const OTHER: &str = "other";

/// Upper bounds (seconds) of the runbook duration histogram; an implicit `+Inf` follows.
pub const RUNBOOK_BUCKETS: [f64; 11] =
    [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0];

fn now_ms() -> u64 {
    crate::clock::wall_ms()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Telemetry is informational: a panic elsewhere must not take status and metrics down too.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A label's value as counted: typed, so counting a finding formats and allocates nothing (the
/// strings are made only when a snapshot is taken; formatting them per finding was a sixth of the
/// daemon's time in an Xid storm). `None` renders as the empty label, `Other` as [`OTHER`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Label<T> {
    None,
    Is(T),
    Other,
}

impl<T: std::fmt::Display> Label<T> {
    fn of(v: Option<T>) -> Label<T> {
        v.map_or(Label::None, Label::Is)
    }

    fn render(&self) -> String {
        match self {
            Label::None => String::new(),
            Label::Is(v) => v.to_string(),
            Label::Other => OTHER.to_string(),
        }
    }
}

/// A (kind, Xid, GPU) series.
type Series = (FindingKind, Label<u32>, Label<crate::model::PciAddress>);
type FindingKey = (Series, Severity);

#[derive(Default)]
struct Inner {
    /// Hashed rather than ordered: counted once per finding, two ordered-map walks of tuple
    /// comparisons were a twentieth of the daemon's time in a storm; ordered when a snapshot is
    /// taken.
    findings: FxHashMap<FindingKey, u64>,
    /// Distinct (kind, xid, pci) label triples in `findings`, for the cardinality cap.
    series: FxHashSet<Series>,
    findings_folded: u64,
    overrides: XidOverrides,
    incidents: BTreeMap<(Severity, &'static str), u64>,
    kmsg_path: Option<String>,
    kmsg_boot: Option<String>,
    kmsg_seq: Option<u64>,
    nvml: NvmlHealth,
    gpus: Vec<GpuSummary>,
    runbooks: BTreeMap<String, RunbookStats>,
    open_total: u64,
    open: Vec<IncidentSummary>,
    resolved: std::collections::VecDeque<ResolvedSummary>,
    last_reload: Option<ReloadInfo>,
    alerts: Option<AlertStatus>,
    health: HealthGauges,
}

/// Something that reports the alert stage's state on demand (an `AlertSender`, usually).
pub type AlertStatusProvider = Arc<dyn Fn() -> AlertStatus + Send + Sync>;

/// The daemon's shared record of itself. Create one with [`Telemetry::new`], wrap it in an
/// `Arc`, hand clones to the metrics and status servers, and record from the daemon loop.
pub struct Telemetry {
    started_ms: u64,
    pid: u32,
    kmsg_records: AtomicU64,
    kmsg_lost: AtomicU64,
    kmsg_malformed: AtomicU64,
    kmsg_out_of_sequence: AtomicU64,
    kmsg_unread: AtomicU64,
    kmsg_userspace_ignored: AtomicU64,
    reloads_ok: AtomicU64,
    reload_failures: AtomicU64,
    config_checks: AtomicU64,
    /// Shared with the probe's task, which counts its own rounds.
    probe_rounds: Arc<AtomicU64>,
    /// See [`StatusSnapshot::heartbeat_ms`].
    heartbeat_ms: AtomicU64,
    inner: Mutex<Inner>,
    alert_provider: Mutex<Option<AlertStatusProvider>>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("started_ms", &self.started_ms)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry::new()
    }
}

impl Telemetry {
    /// Starts the record now, for this process.
    pub fn new() -> Telemetry {
        Telemetry::started(now_ms(), std::process::id())
    }

    /// Starts the record at a given time for a given pid (tests).
    pub fn started(started_ms: u64, pid: u32) -> Telemetry {
        Telemetry {
            started_ms,
            pid,
            kmsg_records: AtomicU64::new(0),
            kmsg_lost: AtomicU64::new(0),
            kmsg_malformed: AtomicU64::new(0),
            kmsg_out_of_sequence: AtomicU64::new(0),
            kmsg_unread: AtomicU64::new(0),
            kmsg_userspace_ignored: AtomicU64::new(0),
            reloads_ok: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
            config_checks: AtomicU64::new(0),
            probe_rounds: Arc::new(AtomicU64::new(0)),
            heartbeat_ms: AtomicU64::new(started_ms),
            inner: Mutex::new(Inner {
                nvml: NvmlHealth {
                    up: false,
                    state: "not started".into(),
                    since_ms: started_ms,
                    probe_rounds: 0,
                },
                ..Inner::default()
            }),
            alert_provider: Mutex::new(None),
        }
    }

    /// When the daemon started (ms since the epoch).
    pub fn started_ms(&self) -> u64 {
        self.started_ms
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The main loop went round: the pipeline is making progress. The liveness endpoint
    /// (`/healthz`) and `npd-check` read the time of the last beat.
    pub fn heartbeat(&self) {
        self.heartbeat_ms.fetch_max(now_ms(), Ordering::Relaxed);
    }

    /// When the main loop last went round (ms since the epoch); the start before the first beat.
    pub fn heartbeat_ms(&self) -> u64 {
        self.heartbeat_ms.load(Ordering::Relaxed)
    }

    /// The per-Xid overrides of the config, so `severity` labels say what the operator set
    /// (`[xid.N] severity = ...`). Call at start and after every successful reload.
    pub fn set_xid_overrides(&self, overrides: XidOverrides) {
        lock(&self.inner).overrides = overrides;
    }

    /// Counts one finding, as the classifier (or NVML, or the probe) produced it. Findings that
    /// only tie a PCI address to a GPU identity are not faults and are not counted. Findings the
    /// config ignores (`[xid.N] ignore = true`) still are: they happened.
    pub fn record_finding(&self, f: &Finding) {
        if f.kind == FindingKind::GpuIdentity {
            return;
        }
        let mut inner = lock(&self.inner);
        let severity = match (f.kind, f.xid) {
            (FindingKind::Xid, Some(x)) => inner
                .overrides
                .get(x)
                .and_then(|o| o.severity)
                .unwrap_or(f.severity),
            _ => f.severity,
        };
        let triple: Series = (f.kind, Label::of(f.xid), Label::of(f.pci));
        let triple = if inner.series.contains(&triple) {
            triple
        } else if inner.series.len() < MAX_FINDING_SERIES {
            inner.series.insert(triple);
            triple
        } else {
            inner.findings_folded += 1;
            let folded = (triple.0, triple.1, Label::Other);
            if inner.series.contains(&folded) || inner.series.len() < 2 * MAX_FINDING_SERIES {
                inner.series.insert(folded);
                folded
            } else {
                // Past twice the cap even the Xid folds: kinds are a fixed set, so this is bounded.
                let folded = (triple.0, Label::Other, Label::Other);
                inner.series.insert(folded);
                folded
            }
        };
        *inner.findings.entry((triple, severity)).or_insert(0) += 1;
    }

    /// Counts one incident handed on to the alert stage (opened or digest).
    pub fn record_incident(&self, i: &Incident) {
        let mut inner = lock(&self.inner);
        *inner
            .incidents
            .entry((i.severity, phase_str(i.phase)))
            .or_insert(0) += 1;
        if i.phase == IncidentPhase::Resolved {
            if inner.resolved.len() >= MAX_RECENTLY_RESOLVED {
                inner.resolved.pop_back();
            }
            inner.resolved.push_front(ResolvedSummary {
                incident: IncidentSummary::from(i),
                resolved_ms: now_ms(),
            });
        }
    }

    /// Adds `n` kernel log records read.
    pub fn kmsg_records(&self, n: u64) {
        self.kmsg_records.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds `n` kernel log records lost (overruns).
    pub fn kmsg_lost(&self, n: u64) {
        self.kmsg_lost.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds `n` malformed kernel log records skipped.
    pub fn kmsg_malformed(&self, n: u64) {
        self.kmsg_malformed.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds `n` lines a reader failed on and that were skipped.
    pub fn kmsg_unread(&self, n: u64) {
        self.kmsg_unread.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds `n` records out of sequence (far ahead or backwards).
    pub fn kmsg_out_of_sequence(&self, n: u64) {
        self.kmsg_out_of_sequence.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds `n` records written by user space and ignored.
    pub fn kmsg_userspace_ignored(&self, n: u64) {
        self.kmsg_userspace_ignored.fetch_add(n, Ordering::Relaxed);
    }

    /// The kernel log being followed.
    pub fn set_kmsg_path(&self, path: &Path) {
        lock(&self.inner).kmsg_path = Some(path.display().to_string());
    }

    /// The last kernel log record handled: boot id (hex) and sequence number.
    pub fn set_kmsg_position(&self, boot_id: &str, seq: u64) {
        let mut inner = lock(&self.inner);
        if inner.kmsg_boot.as_deref() != Some(boot_id) {
            inner.kmsg_boot = Some(boot_id.to_string());
        }
        inner.kmsg_seq = Some(seq);
    }

    /// NVML's state: `up` and a few words ("ok", "disabled", "driver not loaded", ...).
    pub fn set_nvml(&self, up: bool, state: &str) {
        let mut inner = lock(&self.inner);
        if inner.nvml.up != up || inner.nvml.state != state {
            inner.nvml = NvmlHealth {
                up,
                state: state.to_string(),
                since_ms: now_ms(),
                probe_rounds: 0,
            };
        }
    }

    /// The GPUs NVML reported (replaces the previous list).
    /// The health checks' gauges, as of their last round.
    pub fn set_health(&self, mut health: HealthGauges) {
        health.failing.truncate(MAX_LISTED_GPUS * 8);
        lock(&self.inner).health = health;
    }

    pub fn set_gpus(&self, mut gpus: Vec<GpuSummary>) {
        gpus.truncate(MAX_LISTED_GPUS);
        lock(&self.inner).gpus = gpus;
    }

    /// One finished runbook run.
    pub fn runbook_run(&self, name: &str, duration: Duration, ok: bool) {
        let mut inner = lock(&self.inner);
        let name = if inner.runbooks.contains_key(name) || inner.runbooks.len() < MAX_RUNBOOKS {
            name
        } else {
            OTHER
        };
        let st = inner
            .runbooks
            .entry(name.to_string())
            .or_insert_with(|| RunbookStats {
                name: name.to_string(),
                ok: 0,
                failed: 0,
                duration_sum_secs: 0.0,
                buckets: vec![0; RUNBOOK_BUCKETS.len() + 1],
                last_run_ms: 0,
                last_ok: false,
            });
        let secs = duration.as_secs_f64();
        if ok {
            st.ok += 1;
        } else {
            st.failed += 1;
        }
        st.duration_sum_secs += secs;
        let i = RUNBOOK_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(RUNBOOK_BUCKETS.len());
        st.buckets[i] += 1;
        st.last_run_ms = now_ms();
        st.last_ok = ok;
    }

    /// The incidents open now (replaces the previous list). Keeps the exact count and lists the
    /// [`MAX_LISTED_INCIDENTS`] most recently seen.
    pub fn set_open_incidents(&self, mut open: Vec<IncidentSummary>) {
        let total = open.len() as u64;
        open.sort_by_key(|i| std::cmp::Reverse(i.last_seen_ms));
        open.truncate(MAX_LISTED_INCIDENTS);
        let mut inner = lock(&self.inner);
        inner.open_total = total;
        inner.open = open;
    }

    /// Convenience for the daemon: `set_open_incidents(engine.open_incidents())`.
    pub fn set_open_incidents_from<'a>(&self, open: impl IntoIterator<Item = &'a Incident>) {
        self.set_open_incidents(open.into_iter().map(IncidentSummary::from).collect());
    }

    /// A config reload was tried at `when_ms`; `ok` false when the new config was refused.
    pub fn config_reloaded(&self, ok: bool, when_ms: u64) {
        if ok {
            self.reloads_ok.fetch_add(1, Ordering::Relaxed);
        } else {
            self.reload_failures.fetch_add(1, Ordering::Relaxed);
        }
        lock(&self.inner).last_reload = Some(ReloadInfo { ok, at_ms: when_ms });
    }

    /// A change on disk or SIGHUP was looked at (before deciding whether to reload).
    pub fn config_checked(&self) {
        self.config_checks.fetch_add(1, Ordering::Relaxed);
    }

    /// The counter the lost-GPU probe adds its rounds to.
    pub fn probe_rounds(&self) -> Arc<AtomicU64> {
        self.probe_rounds.clone()
    }

    /// Asks `provider` for the alert stage's state on every snapshot (so status and metrics are
    /// always current): `t.set_alert_status_provider(Some(Arc::new(move || sender.status())))`.
    /// `None` removes it (no alert channel). Takes precedence over [`Self::set_alert_status`].
    pub fn set_alert_status_provider(&self, provider: Option<AlertStatusProvider>) {
        *lock(&self.alert_provider) = provider;
    }

    /// Stores the alert stage's state as of now, for a daemon that prefers to push it.
    pub fn set_alert_status(&self, status: Option<AlertStatus>) {
        lock(&self.inner).alerts = status;
    }

    /// `f` on the open incidents and whether NVML is up, without copying them: what a page's
    /// GPU state is computed from, once per alert, cheaply even with thousands open.
    pub fn with_open<R>(&self, f: impl FnOnce(&[IncidentSummary], bool) -> R) -> R {
        let inner = lock(&self.inner);
        f(&inner.open, inner.nvml.up)
    }

    /// Everything, at this instant.
    pub fn snapshot(&self) -> StatusSnapshot {
        // Ask the alert stage first, outside our lock: it takes locks of its own.
        let provider = lock(&self.alert_provider).clone();
        let provided = provider.map(|p| p());
        let inner = lock(&self.inner);
        let mut counted: Vec<(&FindingKey, &u64)> = inner.findings.iter().collect();
        counted.sort_unstable_by_key(|(k, _)| **k);
        let findings = counted
            .into_iter()
            .map(|(((kind, xid, pci), severity), count)| FindingCount {
                kind: kind.as_str().to_string(),
                xid: xid.render(),
                pci: pci.render(),
                severity: *severity,
                count: *count,
            })
            .collect();
        let incidents = inner
            .incidents
            .iter()
            .map(|((severity, phase), count)| IncidentCount {
                severity: *severity,
                phase: phase.to_string(),
                count: *count,
            })
            .collect();
        StatusSnapshot {
            schema: STATUS_SCHEMA.to_string(),
            taken_ms: now_ms(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            pid: self.pid,
            started_ms: self.started_ms,
            heartbeat_ms: self.heartbeat_ms(),
            confinement: crate::runbook::confine::Support::probe().to_string(),
            kmsg: KmsgHealth {
                path: inner.kmsg_path.clone(),
                boot_id: inner.kmsg_boot.clone(),
                last_seq: inner.kmsg_seq,
                records: self.kmsg_records.load(Ordering::Relaxed),
                lost: self.kmsg_lost.load(Ordering::Relaxed),
                malformed: self.kmsg_malformed.load(Ordering::Relaxed),
                userspace_ignored: self.kmsg_userspace_ignored.load(Ordering::Relaxed),
                out_of_sequence: self.kmsg_out_of_sequence.load(Ordering::Relaxed),
                unread: self.kmsg_unread.load(Ordering::Relaxed),
            },
            nvml: NvmlHealth {
                probe_rounds: self.probe_rounds.load(Ordering::Relaxed),
                ..inner.nvml.clone()
            },
            gpus: inner.gpus.clone(),
            findings,
            findings_folded: inner.findings_folded,
            state_write_failures: crate::state::write_failures(),
            incidents,
            open_incidents_total: inner.open_total,
            open_incidents: inner.open.clone(),
            recently_resolved: inner.resolved.iter().cloned().collect(),
            runbooks: inner.runbooks.values().cloned().collect(),
            config: ConfigHealth {
                last_reload: inner.last_reload,
                reloads_ok: self.reloads_ok.load(Ordering::Relaxed),
                reload_failures: self.reload_failures.load(Ordering::Relaxed),
                checks: self.config_checks.load(Ordering::Relaxed),
            },
            alerts: provided.or_else(|| inner.alerts.clone()),
            stopped_ms: None,
            health: inner.health.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Category, PciAddress};

    fn xid(x: u32, pci: Option<&str>, sev: Severity) -> Finding {
        let mut f = Finding::new(FindingKind::Xid, sev, Category::Pcie, format!("Xid {x}"));
        f.xid = Some(x);
        f.pci = pci.map(|p| PciAddress::parse(p).unwrap());
        f
    }

    #[test]
    fn findings_are_counted_per_label_set_and_identity_lines_are_not() {
        let t = Telemetry::started(1_000, 42);
        t.record_finding(&xid(79, Some("0000:3b:00.0"), Severity::Critical));
        t.record_finding(&xid(79, Some("0000:3b:00.0"), Severity::Critical));
        t.record_finding(&xid(13, None, Severity::Warning));
        let mut id = Finding::new(
            FindingKind::GpuIdentity,
            Severity::Info,
            Category::Informational,
            "identity",
        );
        id.pci = PciAddress::parse("0000:3b:00.0").ok();
        t.record_finding(&id);
        let s = t.snapshot();
        assert_eq!(s.findings_total(), 3);
        let c79 = s.findings.iter().find(|f| f.xid == "79").unwrap();
        assert_eq!(
            (c79.kind.as_str(), c79.pci.as_str(), c79.severity, c79.count),
            ("xid", "0000:3b:00.0", Severity::Critical, 2)
        );
        let c13 = s.findings.iter().find(|f| f.xid == "13").unwrap();
        assert_eq!(c13.pci, "");
        assert_eq!(s.pid, 42);
        assert_eq!(s.started_ms, 1_000);
        assert_eq!(s.schema, STATUS_SCHEMA);
    }

    #[test]
    fn a_snapshot_lists_the_counts_in_one_order_whatever_order_they_came_in() {
        let (a, b) = (Telemetry::new(), Telemetry::new());
        let findings = [
            xid(79, Some("0000:3b:00.0"), Severity::Critical),
            xid(13, None, Severity::Warning),
            xid(13, Some("0000:17:00.0"), Severity::Warning),
            xid(48, Some("0000:17:00.0"), Severity::Critical),
        ];
        for f in &findings {
            a.record_finding(f);
        }
        for f in findings.iter().rev() {
            b.record_finding(f);
        }
        let key = |t: &Telemetry| {
            t.snapshot()
                .findings
                .iter()
                .map(|f| format!("{} {} {}", f.kind.as_str(), f.xid, f.pci))
                .collect::<Vec<_>>()
        };
        assert_eq!(key(&a), key(&b));
        assert_eq!(key(&a).len(), 4);
    }

    #[test]
    fn severity_overrides_apply_to_the_label() {
        let t = Telemetry::new();
        let mut table = BTreeMap::new();
        table.insert(
            "13".to_string(),
            toml::from_str::<crate::classify::XidOverride>("severity = \"info\"").unwrap(),
        );
        t.set_xid_overrides(XidOverrides::from_table(table).unwrap());
        t.record_finding(&xid(13, None, Severity::Warning));
        assert_eq!(t.snapshot().findings[0].severity, Severity::Info);
    }

    #[test]
    fn finding_series_are_capped() {
        let t = Telemetry::new();
        // 2.5x the cap of distinct GPUs, each with two Xids.
        let n = MAX_FINDING_SERIES * 5 / 2;
        for i in 0..n {
            let pci = PciAddress::new((i / 256) as u32, (i % 256) as u8, 0, 0).unwrap();
            for x in [13, 31] {
                let mut f = xid(x, None, Severity::Warning);
                f.pci = Some(pci);
                t.record_finding(&f);
            }
        }
        let s = t.snapshot();
        assert_eq!(s.findings_total(), 2 * n as u64, "nothing is dropped");
        assert!(
            s.findings.len() <= MAX_FINDING_SERIES + 2 + FindingKind::ALL.len() * 3,
            "{} series",
            s.findings.len()
        );
        assert!(s.findings.iter().any(|f| f.pci == OTHER && f.xid == "13"));
        assert_eq!(
            s.findings_folded,
            2 * n as u64 - MAX_FINDING_SERIES as u64,
            "every finding past the cap is folded"
        );
        // Past twice the cap, new Xids fold too.
        for x in 1000..1000 + 2 * MAX_FINDING_SERIES as u32 {
            t.record_finding(&xid(x, Some("0000:01:00.0"), Severity::Info));
        }
        let s = t.snapshot();
        assert!(s.findings.len() <= 2 * MAX_FINDING_SERIES + 1 + 3 * FindingKind::ALL.len());
        assert!(s.findings.iter().any(|f| f.pci == OTHER && f.xid == OTHER));
    }

    #[test]
    fn runbooks_incidents_reloads_and_sources() {
        let t = Telemetry::new();
        t.runbook_run("xid79", Duration::from_millis(300), true);
        t.runbook_run("xid79", Duration::from_secs(500), false);
        t.kmsg_records(10);
        t.kmsg_records(5);
        t.kmsg_lost(3);
        t.kmsg_malformed(1);
        t.kmsg_userspace_ignored(2);
        t.kmsg_out_of_sequence(4);
        t.set_kmsg_path(Path::new("/dev/kmsg"));
        t.set_kmsg_position("abcd", 99);
        t.set_nvml(true, "ok");
        t.config_reloaded(false, 5);
        let s = t.snapshot();
        let r = &s.runbooks[0];
        assert_eq!((r.ok, r.failed, r.last_ok), (1, 1, false));
        assert_eq!(r.buckets.len(), RUNBOOK_BUCKETS.len() + 1);
        assert_eq!(r.buckets[2], 1, "0.3 s falls in the 0.5 s bucket");
        assert_eq!(*r.buckets.last().unwrap(), 1, "500 s falls in +Inf");
        assert!((r.duration_sum_secs - 500.3).abs() < 1e-9);
        assert_eq!(
            (
                s.kmsg.records,
                s.kmsg.lost,
                s.kmsg.malformed,
                s.kmsg.userspace_ignored
            ),
            (15, 3, 1, 2)
        );
        assert_eq!(s.kmsg.out_of_sequence, 4);
        assert_eq!(s.kmsg.last_seq, Some(99));
        assert!(s.nvml.up);
        assert_eq!(s.config.reload_failures, 1);
        assert_eq!(
            s.config.last_reload,
            Some(ReloadInfo {
                ok: false,
                at_ms: 5
            })
        );
    }

    #[test]
    fn open_incidents_keep_an_exact_total() {
        let t = Telemetry::new();
        let many: Vec<IncidentSummary> = (0..MAX_LISTED_INCIDENTS as u64 + 5)
            .map(|i| IncidentSummary {
                id: format!("i{i}"),
                title: "t".into(),
                severity: Severity::Warning,
                first_seen_ms: i,
                last_seen_ms: i,
                count: 1,
                kind: "xid".into(),
                pci: None,
                state: false,
            })
            .collect();
        t.set_open_incidents(many);
        let s = t.snapshot();
        assert_eq!(s.open_incidents_total, MAX_LISTED_INCIDENTS as u64 + 5);
        assert_eq!(s.open_incidents.len(), MAX_LISTED_INCIDENTS);
        assert_eq!(
            s.open_incidents[0].id,
            format!("i{}", MAX_LISTED_INCIDENTS + 4)
        );
    }

    #[test]
    fn alert_provider_wins_and_snapshot_round_trips() {
        let t = Telemetry::new();
        let st = |n| AlertStatus {
            updated_ms: 1,
            channels: Vec::new(),
            outbox_count: n,
            outbox_bytes: 0,
            dropped_total: 0,
            accepted_total: 0,
        };
        t.set_alert_status(Some(st(1)));
        assert_eq!(t.snapshot().alerts.unwrap().outbox_count, 1);
        t.set_alert_status_provider(Some(Arc::new(move || st(7))));
        let s = t.snapshot();
        assert_eq!(s.alerts.as_ref().unwrap().outbox_count, 7);
        let json = serde_json::to_string(&s).unwrap();
        let back: StatusSnapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        // An older or newer document still reads.
        let sparse: StatusSnapshot =
            serde_json::from_str(r#"{"pid": 5, "future_field": true}"#).unwrap();
        assert_eq!(sparse.pid, 5);
    }
}
