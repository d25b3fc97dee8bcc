//! One state per GPU and one for the host, computed from the open incidents of a status
//! snapshot: the single answer `status`, `npd-check`, `health-check`, the metrics and
//! `GET /verdict` all give, so no two readers of the same daemon can disagree.
//!
//! A quiet kernel log says nothing about a GPU; the state says what the daemon knows. The rules
//! (docs/operating.md, "GPU state"), the worst one that applies wins:
//!
//! - `failed`: an open critical incident on the GPU, or an open incident of a kind that *is* a
//!   lost GPU ([`FAILED_KINDS`]: fallen off the bus, GPU lost, GPU missing), whatever its
//!   severity. For the host also a host-level incident of such a kind (a service down, the
//!   driver failing to initialise) or any critical host-level incident.
//! - `unknown`: the daemon cannot verify: there is no fresh status (the daemon is not running,
//!   its status is unreadable, or its main loop is stuck; this one overrides every other rule,
//!   since an old status is no evidence either way), or NVML is down or disabled while an
//!   open incident on the GPU is a state only NVML can see end.
//! - `degraded`: an open warning incident.
//! - `healthy`: otherwise. Info incidents never change a state.
//!
//! The host's state is the worst of its GPUs' states and of its host-level incidents (those
//! naming no GPU). Pure functions of the snapshot and the time: no I/O here.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub mod status;

use crate::model::{FindingKind, PciAddress, Severity};
use status::{IncidentSummary, StatusSnapshot};

/// Version of the [`Verdict`] document (docs/verdict.schema.json); it only ever gains fields
/// within one version.
pub const VERDICT_SCHEMA: &str = "xidwatch.verdict/v1";

/// Kinds that mean the GPU (or, naming none, the host's GPU service) is gone or down: failed
/// whatever severity the config gave them, since a lost GPU runs no job.
pub const FAILED_KINDS: [FindingKind; 5] = [
    FindingKind::FallenOffBus,
    FindingKind::GpuLost,
    FindingKind::GpuMissing,
    FindingKind::ServiceDown,
    FindingKind::DriverInitFailure,
];

/// A GPU's or the host's state, from best to worst (the order `max` goes by).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuState {
    Healthy,
    Degraded,
    Unknown,
    Failed,
}

impl GpuState {
    /// Every state, for gauges that export all of them (one at 1, the others at 0).
    pub const ALL: [GpuState; 4] = [
        GpuState::Healthy,
        GpuState::Degraded,
        GpuState::Unknown,
        GpuState::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            GpuState::Healthy => "healthy",
            GpuState::Degraded => "degraded",
            GpuState::Unknown => "unknown",
            GpuState::Failed => "failed",
        }
    }
}

/// Why a state is what it is: an open incident, or (with `incident` empty) what the daemon
/// cannot see (`kind` then says which: `no_status`, `daemon_stuck`, `nvml_down`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reason {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incident: Option<String>,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<Severity>,
    pub title: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<PciAddress>,
    /// Since when it holds (ms since the epoch), where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
}

/// The state of one GPU, or of the host, with the reasons for exactly that state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Judged {
    pub state: GpuState,
    /// The earliest `since_ms` of the reasons; `None` when healthy (a daemon cannot know since
    /// when nothing has been wrong) or when no reason has a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// Only the reasons for this state (a degraded GPU's warnings, not its info incidents),
    /// the oldest first.
    pub reasons: Vec<Reason>,
    /// The incidents among the reasons, for readers that only want ids.
    pub incidents: Vec<String>,
}

impl Judged {
    fn healthy() -> Judged {
        Judged {
            state: GpuState::Healthy,
            since_ms: None,
            reasons: Vec::new(),
            incidents: Vec::new(),
        }
    }

    /// The worst of `candidates`; on a tie every reason of that level is kept.
    fn from(candidates: Vec<(GpuState, Reason)>) -> Judged {
        let Some(worst) = candidates.iter().map(|(s, _)| *s).max() else {
            return Judged::healthy();
        };
        let mut reasons: Vec<Reason> = candidates
            .into_iter()
            .filter(|(s, _)| *s == worst)
            .map(|(_, r)| r)
            .collect();
        reasons.sort_by_key(|r| (r.since_ms.unwrap_or(u64::MAX), r.incident.clone()));
        Judged {
            state: worst,
            since_ms: reasons.iter().filter_map(|r| r.since_ms).min(),
            incidents: reasons.iter().filter_map(|r| r.incident.clone()).collect(),
            reasons,
        }
    }
}

/// One GPU's entry in the verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuVerdict {
    pub pci: PciAddress,
    /// NVML's index; `None` for a GPU only incidents name (one NVML no longer lists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(flatten)]
    pub judged: Judged,
}

/// The versioned document for machines ([`VERDICT_SCHEMA`]): `status --json` carries it as
/// `verdict`, the metrics listener serves it at `GET /verdict`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub schema: String,
    /// When it was computed (ms since the epoch).
    pub taken_ms: u64,
    /// When the status it was computed from was taken; `None` without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_taken_ms: Option<u64>,
    pub host: Judged,
    /// Every GPU NVML lists and every GPU an open incident names, by PCI address.
    pub gpus: Vec<GpuVerdict>,
    /// False when the status listed only part of the open incidents (more than it keeps): a
    /// state may then miss a reason, never gain a wrong one.
    pub complete: bool,
}

/// What the reader knows about the freshness of the status it hands to [`judge`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Freshness {
    /// A running daemon's status whose main loop beats.
    Fresh,
    /// There is a status, but it cannot be trusted now (in words: "xidwatch is not running",
    /// "no progress for 3m"): every state is unknown, with the status's GPUs still listed.
    Stale(String),
}

fn incident_reason(i: &IncidentSummary) -> Reason {
    Reason {
        incident: Some(i.id.clone()),
        kind: i.kind.clone(),
        severity: Some(i.severity),
        title: i.title.clone(),
        pci: i.pci,
        since_ms: Some(i.first_seen_ms),
    }
}

/// The state one open incident puts on its GPU (or the host), if any.
fn state_of(i: &IncidentSummary, nvml_up: bool) -> Option<GpuState> {
    if FAILED_KINDS.iter().any(|k| k.as_str() == i.kind) || i.severity == Severity::Critical {
        return Some(GpuState::Failed);
    }
    if i.severity < Severity::Warning {
        return None;
    }
    // A health check's condition (temperature, throttling, ...) ends only when NVML sees it
    // gone: with NVML down nobody can tell whether it still holds.
    let needs_nvml = i.state && i.kind != FindingKind::ServiceDown.as_str();
    if needs_nvml && !nvml_up {
        return Some(GpuState::Unknown);
    }
    Some(GpuState::Degraded)
}

/// No status at all: the host is unknown and no GPU can be named.
pub fn no_status(why: &str, now_ms: u64) -> Verdict {
    Verdict {
        schema: VERDICT_SCHEMA.to_string(),
        taken_ms: now_ms,
        status_taken_ms: None,
        host: Judged::from(vec![(
            GpuState::Unknown,
            Reason {
                incident: None,
                kind: "no_status".into(),
                severity: None,
                title: why.to_string(),
                pci: None,
                since_ms: None,
            },
        )]),
        gpus: Vec::new(),
        complete: true,
    }
}

/// A GPU's NVML index and UUID, and the states its incidents put on it.
type Candidates = (Option<u32>, Option<String>, Vec<(GpuState, Reason)>);

/// The state of each GPU and of the host, from `snap`'s open incidents.
pub fn judge(snap: &StatusSnapshot, freshness: &Freshness, now_ms: u64) -> Verdict {
    let nvml_up = snap.nvml.up;
    let mut gpus: BTreeMap<PciAddress, Candidates> = snap
        .gpus
        .iter()
        .map(|g| (g.pci, (Some(g.index), g.uuid.clone(), Vec::new())))
        .collect();
    let mut host = Vec::new();
    for i in &snap.open_incidents {
        let Some(state) = state_of(i, nvml_up) else {
            // Still list the GPU: an incident names it even when NVML does not.
            if let Some(pci) = i.pci {
                gpus.entry(pci).or_insert((None, None, Vec::new()));
            }
            continue;
        };
        let reason = incident_reason(i);
        if let Some(pci) = i.pci {
            gpus.entry(pci)
                .or_insert((None, None, Vec::new()))
                .2
                .push((state, reason.clone()));
        }
        // The host is as bad as its worst GPU, so every reason counts for it too.
        host.push((state, reason));
    }
    if let Freshness::Stale(why) = freshness {
        let since = if snap.heartbeat_ms > 0 {
            snap.heartbeat_ms
        } else {
            snap.taken_ms
        };
        let stale = |pci| {
            (
                GpuState::Unknown,
                Reason {
                    incident: None,
                    kind: "no_status".into(),
                    severity: None,
                    title: why.clone(),
                    pci,
                    since_ms: Some(since),
                },
            )
        };
        // An old status is no evidence either way: a GPU it called failed may have been reset
        // since (a reboot, a daemon restart), and one it called healthy may have fallen off
        // the bus while nobody watched. The GPUs stay listed so a reader sees which.
        for (pci, g) in gpus.iter_mut() {
            g.2 = vec![stale(Some(*pci))];
        }
        host = vec![stale(None)];
    }
    let gpus: Vec<GpuVerdict> = gpus
        .into_iter()
        .map(|(pci, (index, uuid, c))| GpuVerdict {
            pci,
            index,
            uuid,
            judged: Judged::from(c),
        })
        .collect();
    Verdict {
        schema: VERDICT_SCHEMA.to_string(),
        taken_ms: now_ms,
        status_taken_ms: Some(snap.taken_ms),
        host: Judged::from(host),
        gpus,
        complete: snap.open_incidents_total <= snap.open_incidents.len() as u64,
    }
}

/// The verdict's word on `pci`'s GPU (the host's for a host-level incident), the one `status`
/// and `npd-check` would give, as a page carries it.
pub fn gpu_state_doc(
    open: &[IncidentSummary],
    nvml_up: bool,
    pci: Option<PciAddress>,
) -> crate::alert::gpu_state::GpuStateDoc {
    let judged = judge_one(open, nvml_up, pci);
    crate::alert::gpu_state::GpuStateDoc {
        state: judged.state.as_str().to_string(),
        reasons: judged.reasons.iter().map(|r| r.title.clone()).collect(),
        incidents: judged.incidents,
    }
}

/// The state of one GPU (`Some(pci)`) or of the host (`None`) from the open incidents, the
/// same rules as [`judge`] with a fresh status, without building the whole verdict: for the
/// state a page reports.
pub fn judge_one(open: &[IncidentSummary], nvml_up: bool, pci: Option<PciAddress>) -> Judged {
    let candidates = open
        .iter()
        .filter(|i| pci.is_none() || i.pci == pci)
        .filter_map(|i| state_of(i, nvml_up).map(|s| (s, incident_reason(i))))
        .collect();
    Judged::from(candidates)
}

/// The running daemon's own verdict (metrics, `GET /verdict`): its snapshot is fresh unless
/// its main loop has stopped beating, as `/healthz` judges it.
pub fn of_live(snap: &StatusSnapshot, now_ms: u64) -> Verdict {
    let (ok, line) = status::health(snap.heartbeat_ms, now_ms);
    let freshness = if ok {
        Freshness::Fresh
    } else {
        Freshness::Stale(format!("xidwatch is stuck: {line}"))
    };
    judge(snap, &freshness, now_ms)
}

impl Verdict {
    /// One line for people and schedulers: the host's state, then its first reason.
    pub fn line(&self) -> String {
        let state = self.host.state.as_str();
        match self.host.reasons.split_first() {
            None => {
                let n = self.gpus.len();
                format!("{state}: no GPU fault open ({n} GPU{})", plural(n))
            }
            Some((first, rest)) => {
                let more = if rest.is_empty() {
                    String::new()
                } else {
                    format!(" (+{} more)", rest.len())
                };
                format!("{state}: {}{more}", first.title)
            }
        }
    }

    /// The GPU at `pci`, if the verdict lists it.
    pub fn gpu(&self, pci: &PciAddress) -> Option<&GpuVerdict> {
        self.gpus.iter().find(|g| g.pci == *pci)
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use super::status::GpuSummary;
    use super::*;

    fn pci(s: &str) -> PciAddress {
        s.parse().expect("test address")
    }

    fn snap(nvml_up: bool, open: Vec<IncidentSummary>) -> StatusSnapshot {
        let mut s = StatusSnapshot {
            taken_ms: 10_000,
            heartbeat_ms: 9_000,
            gpus: vec![
                GpuSummary {
                    index: 0,
                    pci: pci("0000:17:00.0"),
                    uuid: Some("GPU-a".into()),
                    name: None,
                },
                GpuSummary {
                    index: 1,
                    pci: pci("0000:65:00.0"),
                    uuid: None,
                    name: None,
                },
            ],
            open_incidents_total: open.len() as u64,
            open_incidents: open,
            ..StatusSnapshot::default()
        };
        s.nvml.up = nvml_up;
        s
    }

    fn inc(
        id: &str,
        kind: FindingKind,
        sev: Severity,
        at: Option<&str>,
        first: u64,
    ) -> IncidentSummary {
        IncidentSummary {
            id: id.into(),
            title: format!("{id} title"),
            severity: sev,
            first_seen_ms: first,
            last_seen_ms: first + 1,
            count: 1,
            kind: kind.as_str().into(),
            pci: at.map(pci),
            state: crate::incident::is_state(kind),
        }
    }

    fn state(v: &Verdict, at: &str) -> GpuState {
        v.gpu(&pci(at)).expect("listed").judged.state
    }

    #[test]
    fn nothing_open_is_healthy_everywhere() {
        let v = judge(&snap(true, vec![]), &Freshness::Fresh, 1);
        assert_eq!(v.schema, VERDICT_SCHEMA);
        assert_eq!(v.host, Judged::healthy());
        assert_eq!(v.gpus.len(), 2);
        assert!(v.gpus.iter().all(|g| g.judged.state == GpuState::Healthy));
        assert_eq!(v.line(), "healthy: no GPU fault open (2 GPUs)");
        assert!(v.complete);
    }

    #[test]
    fn a_critical_incident_fails_its_gpu_and_the_host_only() {
        let open = vec![
            inc(
                "x79",
                FindingKind::Xid,
                Severity::Critical,
                Some("0000:17:00.0"),
                500,
            ),
            inc(
                "aer",
                FindingKind::PcieAer,
                Severity::Info,
                Some("0000:65:00.0"),
                400,
            ),
        ];
        let v = judge(&snap(true, open), &Freshness::Fresh, 1);
        let g = v.gpu(&pci("0000:17:00.0")).expect("listed");
        assert_eq!(g.judged.state, GpuState::Failed);
        assert_eq!(g.judged.incidents, vec!["x79".to_string()]);
        assert_eq!(g.judged.since_ms, Some(500));
        assert_eq!(g.index, Some(0));
        assert_eq!(
            state(&v, "0000:65:00.0"),
            GpuState::Healthy,
            "info changes nothing"
        );
        assert_eq!(v.host.state, GpuState::Failed);
        assert_eq!(v.host.incidents, vec!["x79".to_string()]);
        assert_eq!(v.line(), "failed: x79 title");
    }

    #[test]
    fn lost_gpu_kinds_fail_whatever_their_severity() {
        for kind in [
            FindingKind::FallenOffBus,
            FindingKind::GpuLost,
            FindingKind::GpuMissing,
        ] {
            let open = vec![inc("l", kind, Severity::Warning, Some("0000:65:00.0"), 1)];
            let v = judge(&snap(true, open), &Freshness::Fresh, 1);
            assert_eq!(state(&v, "0000:65:00.0"), GpuState::Failed, "{kind:?}");
        }
    }

    #[test]
    fn a_warning_degrades_and_the_worst_gpu_sets_the_host() {
        let open = vec![
            inc(
                "w",
                FindingKind::Xid,
                Severity::Warning,
                Some("0000:17:00.0"),
                7,
            ),
            inc(
                "i",
                FindingKind::Xid,
                Severity::Info,
                Some("0000:17:00.0"),
                3,
            ),
        ];
        let v = judge(&snap(true, open), &Freshness::Fresh, 1);
        let g = v.gpu(&pci("0000:17:00.0")).expect("listed");
        assert_eq!(g.judged.state, GpuState::Degraded);
        assert_eq!(
            g.judged.incidents,
            vec!["w".to_string()],
            "only this state's reasons"
        );
        assert_eq!(v.host.state, GpuState::Degraded);
    }

    #[test]
    fn host_level_incidents_set_the_host_state() {
        let open = vec![
            inc("fm", FindingKind::ServiceDown, Severity::Warning, None, 2),
            inc(
                "w",
                FindingKind::Xid,
                Severity::Warning,
                Some("0000:17:00.0"),
                1,
            ),
        ];
        let v = judge(&snap(true, open), &Freshness::Fresh, 1);
        assert_eq!(v.host.state, GpuState::Failed);
        assert_eq!(v.host.incidents, vec!["fm".to_string()]);
        assert_eq!(state(&v, "0000:17:00.0"), GpuState::Degraded);
        assert_eq!(state(&v, "0000:65:00.0"), GpuState::Healthy);

        let open = vec![inc(
            "d",
            FindingKind::DriverError,
            Severity::Warning,
            None,
            2,
        )];
        let v = judge(&snap(true, open), &Freshness::Fresh, 1);
        assert_eq!(v.host.state, GpuState::Degraded);
    }

    #[test]
    fn nvml_down_makes_a_health_state_unknown_but_not_a_failure() {
        let open = vec![
            inc(
                "hot",
                FindingKind::GpuTemperature,
                Severity::Warning,
                Some("0000:17:00.0"),
                1,
            ),
            inc(
                "x",
                FindingKind::Xid,
                Severity::Warning,
                Some("0000:65:00.0"),
                1,
            ),
        ];
        let v = judge(&snap(false, open.clone()), &Freshness::Fresh, 1);
        assert_eq!(state(&v, "0000:17:00.0"), GpuState::Unknown);
        assert_eq!(
            state(&v, "0000:65:00.0"),
            GpuState::Degraded,
            "an Xid needs no check"
        );
        assert_eq!(v.host.state, GpuState::Unknown);
        let v = judge(&snap(true, open), &Freshness::Fresh, 1);
        assert_eq!(state(&v, "0000:17:00.0"), GpuState::Degraded);

        let open = vec![inc(
            "c",
            FindingKind::GpuTemperature,
            Severity::Critical,
            Some("0000:17:00.0"),
            1,
        )];
        let v = judge(&snap(false, open), &Freshness::Fresh, 1);
        assert_eq!(state(&v, "0000:17:00.0"), GpuState::Failed);
    }

    #[test]
    fn a_stale_status_is_unknown_even_where_it_said_failed() {
        let open = vec![inc(
            "x79",
            FindingKind::Xid,
            Severity::Critical,
            Some("0000:17:00.0"),
            5,
        )];
        let v = judge(
            &snap(true, open),
            &Freshness::Stale("xidwatch is not running".into()),
            1,
        );
        assert_eq!(state(&v, "0000:17:00.0"), GpuState::Unknown);
        assert_eq!(state(&v, "0000:65:00.0"), GpuState::Unknown);
        assert_eq!(v.host.state, GpuState::Unknown);
        assert!(v.host.incidents.is_empty());
        let v = judge(&snap(true, vec![]), &Freshness::Stale("stuck".into()), 1);
        assert_eq!(v.host.state, GpuState::Unknown);
        assert_eq!(v.host.reasons[0].kind, "no_status");
        assert_eq!(v.host.since_ms, Some(9_000), "since the last heartbeat");
        assert_eq!(v.line(), "unknown: stuck");

        let v = no_status("xidwatch is not running", 3);
        assert_eq!(v.host.state, GpuState::Unknown);
        assert!(v.gpus.is_empty());
    }

    #[test]
    fn a_gpu_only_an_incident_names_is_listed_and_a_cut_list_is_flagged() {
        let mut s = snap(
            true,
            vec![inc(
                "x",
                FindingKind::Xid,
                Severity::Info,
                Some("0000:b3:00.0"),
                1,
            )],
        );
        s.open_incidents_total = 5;
        let v = judge(&s, &Freshness::Fresh, 1);
        assert_eq!(state(&v, "0000:b3:00.0"), GpuState::Healthy);
        assert_eq!(v.gpu(&pci("0000:b3:00.0")).and_then(|g| g.index), None);
        assert!(!v.complete);
    }

    #[test]
    fn the_document_round_trips() {
        let open = vec![inc(
            "x79",
            FindingKind::Xid,
            Severity::Critical,
            Some("0000:17:00.0"),
            5,
        )];
        let v = judge(&snap(true, open), &Freshness::Fresh, 1);
        let text = serde_json::to_string(&v).expect("serialises");
        let back: Verdict = serde_json::from_str(&text).expect("parses");
        assert_eq!(back, v);
    }
}
