//! What survives a restart and a reboot: the open incidents as saved in the state directory
//! ([`Persisted`]), restored within a boot and carried over into the next one.

use super::*;

impl Engine {
    /// What survives a restart: open incidents with their exact counts.
    pub fn snapshot(&self) -> Vec<Persisted> {
        let mut open: Vec<&Open> = self.open.values().collect();
        open.sort_by(|a, b| {
            (a.inc.first_seen_ms, &a.inc.id).cmp(&(b.inc.first_seen_ms, &b.inc.id))
        });
        open.into_iter()
            .map(|o| Persisted {
                id: o.inc.id.clone(),
                pci: o.key.pci,
                kind: o.key.kind.as_str().to_string(),
                xid: o.key.xid,
                topic: o.key.topic,
                severity: o.inc.severity,
                category: o.inc.category,
                title: o.inc.title.clone(),
                gpu_uuid: o.inc.gpu.uuid.clone(),
                gpu_serial: o.inc.gpu.serial.clone(),
                gpu_index: o.inc.gpu.index,
                gpu_name: o.inc.gpu.name.clone(),
                first_seen_ms: o.inc.first_seen_ms,
                last_seen_ms: o.inc.last_seen_ms,
                count: o.inc.count,
                echoes: o
                    .inc
                    .echoes
                    .iter()
                    .map(|e| (e.kind.as_str().to_string(), e.xid, e.count))
                    .collect(),
                sample: o
                    .inc
                    .findings
                    .first()
                    .map(|f| f.origin.raw.clone())
                    .unwrap_or_default(),
                family: o.family,
                rank: o.rank,
                deadline_ms: o.deadline_ms,
                opened_mono_ms: o.opened_mono_ms,
                min_count: o.min_count,
                emitted: o.emitted,
                settle_until_ms: o.settle_until_ms,
                told_count: o.told_count,
                told_echoes: o.told_echoes,
                echo_total: o.echo_total,
                found_at_startup: o.inc.found_at_startup,
                before_lookback: o.inc.before_lookback,
                quiet_until_ms: None,
                supersedes: o.inc.supersedes.iter().map(SavedSuperseded::of).collect(),
                host_page: o.inc.host_page.clone(),
                paged_as: o.inc.paged_as.clone(),
                carried: o.carried,
            })
            .chain(self.quiet_snapshot())
            .collect()
    }

    /// Closed incidents waiting out their quiet period, so a restart does not lose their resolved
    /// notice.
    pub(super) fn quiet_snapshot(&self) -> Vec<Persisted> {
        let mut quiet: Vec<(&Key, &Quiet)> = self.quiet.iter().collect();
        quiet.sort_by(|(_, a), (_, b)| (a.until_ms, &a.inc.id).cmp(&(b.until_ms, &b.inc.id)));
        quiet
            .into_iter()
            .map(|(k, q)| Persisted {
                id: q.inc.id.clone(),
                pci: q.inc.pci,
                kind: q.inc.kind.as_str().to_string(),
                xid: q.inc.xid,
                topic: k.topic,
                severity: q.inc.severity,
                category: q.inc.category,
                title: q.inc.title.clone(),
                gpu_uuid: q.inc.gpu.uuid.clone(),
                gpu_serial: q.inc.gpu.serial.clone(),
                gpu_index: q.inc.gpu.index,
                gpu_name: q.inc.gpu.name.clone(),
                first_seen_ms: q.inc.first_seen_ms,
                last_seen_ms: q.inc.last_seen_ms,
                count: q.inc.count,
                echoes: q
                    .inc
                    .echoes
                    .iter()
                    .map(|e| (e.kind.as_str().to_string(), e.xid, e.count))
                    .collect(),
                sample: q
                    .inc
                    .findings
                    .first()
                    .map(|f| f.origin.raw.clone())
                    .unwrap_or_default(),
                family: Family::None,
                rank: 0,
                deadline_ms: q.until_ms,
                opened_mono_ms: 0,
                min_count: 1,
                emitted: true,
                settle_until_ms: 0,
                told_count: q.inc.count,
                told_echoes: 0,
                echo_total: 0,
                found_at_startup: q.inc.found_at_startup,
                before_lookback: q.inc.before_lookback,
                quiet_until_ms: Some(q.until_ms),
                supersedes: q.inc.supersedes.iter().map(SavedSuperseded::of).collect(),
                host_page: q.inc.host_page.clone(),
                paged_as: q.inc.paged_as.clone(),
                carried: false,
            })
            .collect()
    }

    /// Restores open incidents saved by [`Engine::snapshot`]; entries that do not make sense are
    /// skipped.
    pub fn restore(&mut self, saved: Vec<Persisted>) {
        self.changes += 1;
        for p in saved.into_iter().take(self.cfg.max_open) {
            let Some(kind) = FindingKind::parse(&p.kind) else {
                continue;
            };
            let mut f = Finding::new(kind, p.severity, p.category, p.title.clone());
            f.xid = p.xid;
            f.pci = p.pci;
            f.origin.raw = p.sample;
            f.origin.lines = f.origin.raw.len() as u32;
            let gpu = GpuIdentity {
                index: p.gpu_index,
                uuid: p.gpu_uuid,
                serial: p.gpu_serial,
                name: p.gpu_name,
            };
            f.gpu = gpu.clone();
            let echoes = p
                .echoes
                .into_iter()
                .filter_map(|(k, xid, count)| {
                    FindingKind::parse(&k).map(|kind| EchoCount { kind, xid, count })
                })
                .collect();
            let key = Key {
                pci: p.pci,
                kind,
                xid: p.xid,
                topic: p.topic,
            };
            let open = Open {
                inc: Incident {
                    id: p.id,
                    phase: IncidentPhase::Opened,
                    host: self.cfg.host.clone(),
                    boot_id: (!self.cfg.boot_id.is_empty()).then(|| self.cfg.boot_id.clone()),
                    kind,
                    xid: p.xid,
                    pci: p.pci,
                    gpu,
                    severity: p.severity,
                    category: p.category,
                    title: p.title,
                    first_seen_ms: p.first_seen_ms,
                    last_seen_ms: p.last_seen_ms,
                    count: p.count,
                    findings: vec![f],
                    echoes,
                    found_at_startup: p.found_at_startup,
                    before_lookback: p.before_lookback,
                    runbook_override: None,
                    dropped_alerts_before: 0,
                    test: false,
                    note: None,
                    supersedes: p
                        .supersedes
                        .into_iter()
                        .filter_map(|s| s.restore())
                        .collect(),
                    host_page: p.host_page,
                    paged_as: p.paged_as,
                },
                key,
                family: p.family,
                rank: p.rank,
                deadline_ms: p.deadline_ms,
                opened_mono_ms: p.opened_mono_ms,
                last_mono_ms: p.opened_mono_ms,
                min_count: p.min_count,
                emitted: p.emitted,
                settle_until_ms: p.settle_until_ms,
                told_count: p.told_count,
                told_echoes: p.told_echoes,
                echo_total: p.echo_total,
                told_other: None,
                told_mono_ms: p.opened_mono_ms,
                carried: p.carried,
            };

            match p.quiet_until_ms {
                Some(until_ms) => {
                    self.quiet.insert(
                        key,
                        Quiet {
                            inc: open.inc,
                            until_ms,
                        },
                    );
                }
                None => {
                    self.insert_open(key, open);
                }
            }
        }
    }
}

impl Engine {
    /// The previous boot's open incidents, at the first start of a new boot. A reboot ends no
    /// state by itself: a lost GPU, a driver that did not initialise, a failing check or a
    /// service down stays open, and ends only through the same checks as within a boot (the
    /// notice then says "after the reboot"). Their monotonic times start again (that clock
    /// restarts with the boot) and they have no window. An event of the previous boot (an
    /// application's Xid 13, a corrected AER) was about what the reboot ended: its resolved
    /// notice goes out now and says so, instead of never. Incidents never paged are dropped.
    pub fn carry_over(
        &mut self,
        saved: Vec<Persisted>,
        old_boot: &str,
        now: impl Into<Now>,
        out: &mut Vec<Incident>,
    ) {
        let now = now.into();
        let mut prev = Engine::new(self.cfg.clone());
        prev.restore(saved);
        self.changes += 1;
        let old_boot = (!old_boot.is_empty()).then(|| old_boot.to_string());
        let mut open: Vec<Open> = prev.open.into_values().filter(|o| o.emitted).collect();
        open.sort_by(|a, b| {
            (a.inc.first_seen_ms, &a.inc.id).cmp(&(b.inc.first_seen_ms, &b.inc.id))
        });
        for mut o in open {
            o.inc.boot_id = old_boot.clone();
            if ends_verified(o.key.kind, o.key.xid) && self.open.len() < self.cfg.max_open {
                o.carried = true;
                o.deadline_ms = NO_DEADLINE;
                o.opened_mono_ms = now.mono_ms;
                o.last_mono_ms = now.mono_ms;
                o.told_mono_ms = now.mono_ms;
                o.settle_until_ms = 0;
                o.inc.note = (probe_verified(o.key.kind, o.key.xid) && !self.can_verify)
                    .then(|| no_nvml_note(o.key.kind));
                self.insert_open(o.key, o);
                continue;
            }
            let mut inc = o.inc;
            inc.phase = IncidentPhase::Resolved;
            inc.note = Some("ended by the reboot: not seen since".to_string());
            self.stats.resolved += 1;
            out.push(inc);
        }
        let mut quiet: Vec<Quiet> = prev.quiet.into_values().collect();
        quiet.sort_by(|a, b| (a.until_ms, &a.inc.id).cmp(&(b.until_ms, &b.inc.id)));
        for q in quiet {
            let mut inc = q.inc;
            inc.boot_id = old_boot.clone();
            inc.phase = IncidentPhase::Resolved;
            inc.note = Some("ended by the reboot: not seen since".to_string());
            self.stats.resolved += 1;
            out.push(inc);
        }
    }
}

/// An open incident as saved in the state directory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Persisted {
    id: String,
    pci: Option<PciAddress>,
    kind: String,
    xid: Option<u32>,
    /// See [`topic`]; absent in files written before it existed.
    #[serde(default, skip_serializing_if = "is_zero")]
    topic: u32,
    severity: Severity,
    category: Category,
    title: String,
    gpu_uuid: Option<String>,
    gpu_serial: Option<String>,
    /// NVML's index and the board's name, as the incident's pages named them (the labels its
    /// alerts went out under); absent in files written before they were kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gpu_index: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gpu_name: Option<String>,
    first_seen_ms: u64,
    last_seen_ms: u64,
    count: u64,
    echoes: Vec<(String, Option<u32>, u64)>,
    sample: Vec<String>,
    family: Family,
    rank: u8,
    /// Monotonic (`CLOCK_BOOTTIME`): restored only within the same boot.
    deadline_ms: u64,
    #[serde(default)]
    opened_mono_ms: u64,
    min_count: u64,
    emitted: bool,
    /// Monotonic end of the settle delay of an incident whose first alert is still held.
    #[serde(default)]
    settle_until_ms: u64,
    told_count: u64,
    told_echoes: u64,
    echo_total: u64,
    found_at_startup: bool,
    /// See [`Incident::before_lookback`]; absent in files written before it existed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    before_lookback: bool,
    /// Set for a closed incident waiting out its quiet period (monotonic): restored as such, so
    /// its resolved notice still goes out after a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    quiet_until_ms: Option<u64>,
    /// See [`Incident::supersedes`]; absent in files written before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    supersedes: Vec<SavedSuperseded>,
    /// See [`Incident::host_page`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    host_page: Option<String>,
    /// See [`Incident::paged_as`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    paged_as: Vec<Severity>,
    /// Carried over from an earlier boot ([`Engine::carry_over`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    carried: bool,
}

/// A [`Superseded`] as saved: kinds as their names, so a file from a version that knew a kind
/// this one does not is read without it rather than refused.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SavedSuperseded {
    id: String,
    kind: String,
    xid: Option<u32>,
    severity: Severity,
    category: Category,
    #[serde(default)]
    gpu_uuid: Option<String>,
    #[serde(default)]
    gpu_serial: Option<String>,
    #[serde(default)]
    gpu_index: Option<u32>,
}

impl SavedSuperseded {
    fn of(s: &Superseded) -> SavedSuperseded {
        SavedSuperseded {
            id: s.id.clone(),
            kind: s.kind.as_str().to_string(),
            xid: s.xid,
            severity: s.severity,
            category: s.category,
            gpu_uuid: s.gpu.uuid.clone(),
            gpu_serial: s.gpu.serial.clone(),
            gpu_index: s.gpu.index,
        }
    }

    fn restore(self) -> Option<Superseded> {
        Some(Superseded {
            id: self.id,
            kind: FindingKind::parse(&self.kind)?,
            xid: self.xid,
            severity: self.severity,
            category: self.category,
            gpu: GpuIdentity {
                uuid: self.gpu_uuid,
                serial: self.gpu_serial,
                index: self.gpu_index,
                ..GpuIdentity::default()
            },
        })
    }
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// The checkpoint: open incidents, the lost-GPU probe's memory and the kernel log record they
/// account for, tied to the boot they belong to. Written as one file, so after a crash the
/// incidents restored and the records read again never overlap.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct SavedIncidents {
    pub boot_id: String,
    pub open: Vec<Persisted>,
    /// The last kernel log record the snapshot includes.
    #[serde(default)]
    pub last_seq: Option<u64>,
    #[serde(default)]
    pub probe: Option<crate::source::probe::Memory>,
}

/// Where the checkpoint is.
pub const CHECKPOINT: &str = "incidents.json";
