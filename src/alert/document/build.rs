//! Building a page from an alert: the catalog's text, the repeat-offender line, the inventory
//! and history evidence, the runbook's steps, bounded so one alert never grows without limit.

use super::words::{duration_words, rfc3339};
use super::*;
use crate::alert::handoff::{self, HandoffConfig};
use crate::alert::input::{Alert, CatalogText};
use crate::model::{Evidence, Finding, IncidentPhase, StepStatus};

/// Assembles every page the alert stage sends, in one order and in one place: the document from
/// the alert, the note on its evidence, the host group it stands for, then the hand-off (which
/// reads the finished page). A new alert, its late evidence and `test-alert` all come here, so
/// they cannot make different pages from the same facts.
#[derive(Debug, Clone, Default)]
pub struct PageBuilder {
    /// `[handoff]`: the drain command put in pages whose guide says to drain.
    pub handoff: HandoffConfig,
}

impl PageBuilder {
    pub fn new(handoff: HandoffConfig) -> PageBuilder {
        PageBuilder { handoff }
    }

    /// The page for `alert`: `evidence_note` says why evidence is missing, `host` makes it the
    /// host page of a group.
    pub fn page(
        &self,
        alert: &Alert,
        evidence_note: Option<String>,
        host: Option<HostGroup>,
    ) -> AlertDocument {
        let mut doc = AlertDocument::build(alert);
        doc.evidence_note = evidence_note;
        if let Some(g) = host {
            doc.apply_host_group(g);
        }
        doc.handoff = handoff::suggest(&self.handoff, &doc);
        doc
    }
}

impl AlertDocument {
    /// Builds the document. Pure: the same alert always gives the same document.
    pub fn build(alert: &Alert) -> AlertDocument {
        let inc = &alert.incident;
        let gpu = gpu_doc(inc);
        let (meaning, next_steps) = meaning_and_steps(&alert.evidence, alert.catalog.as_ref());
        let mut findings: Vec<FindingDoc> = inc
            .findings
            .iter()
            .take(MAX_FINDINGS)
            .map(finding_doc)
            .collect();
        let folded = fold_init_pairs(&mut findings);
        let findings_omitted = inc.findings.len().saturating_sub(findings.len() + folded);
        let mut count = inc.count;
        if inc.kind == crate::model::FindingKind::DriverInitFailure {
            count = count.saturating_sub(folded as u64).max(1);
        }
        let meaning = match findings.first().and_then(api_versions) {
            Some(v) => format!("{v}. {meaning}"),
            None => meaning,
        };
        // An open incident's note is how it stands ("cannot verify recovery without NVML"):
        // every channel shows the meaning, so the page says it.
        let meaning = match (&inc.note, inc.phase) {
            (Some(n), IncidentPhase::Opened | IncidentPhase::Digest) => format!("{meaning} {n}."),
            _ => meaning,
        };
        AlertDocument {
            schema: SCHEMA.to_string(),
            id: inc.id.clone(),
            phase: match inc.phase {
                IncidentPhase::Opened => Phase::Opened,
                IncidentPhase::Digest => Phase::Digest,
                IncidentPhase::Resolved => Phase::Resolved,
            },
            test: inc.test,
            host: inc.host.clone(),
            boot_id: inc.boot_id.clone(),
            severity: inc.severity,
            category: inc.category,
            kind: inc.kind.as_str().to_string(),
            xid: inc.xid,
            title: inc.title.clone(),
            headline: headline(inc, escalation(&alert.evidence).as_deref()),
            gpu,
            meaning,
            next_steps,
            first_seen: rfc3339(inc.first_seen_ms),
            first_seen_ms: inc.first_seen_ms,
            last_seen: rfc3339(inc.last_seen_ms),
            last_seen_ms: inc.last_seen_ms,
            count,
            found_at_startup: inc.found_at_startup,
            dropped_alerts_before: inc.dropped_alerts_before,
            echoes: inc
                .echoes
                .iter()
                .map(|e| EchoDoc {
                    kind: e.kind.as_str().to_string(),
                    xid: e.xid,
                    count: e.count,
                })
                .collect(),
            findings_omitted,
            findings,
            catalog: alert.catalog.clone(),
            runbook_override: inc.runbook_override.clone(),
            evidence: alert.evidence.iter().map(evidence_doc).collect(),
            evidence_note: None,
            report_path: None,
            handoff: None,
            host_group: None,
            generator: Generator {
                name: "xidwatch".to_string(),
                version: env!("CARGO_PKG_VERSION").to_string(),
            },
        }
    }
}

/// `gpu-node-7: GPU 3 (0000:17:00.0) fell off the bus - Xid 79, critical`; a repeat offender's
/// `... - Xid 79 (2nd time in 30 days: replace the board), critical`, so that its page and mail
/// subject never read as a duplicate of the first one.
fn headline(inc: &Incident, escalation: Option<&str>) -> String {
    let mut s = String::new();
    if inc.test {
        s.push_str("[TEST] ");
    }
    if inc.phase == IncidentPhase::Resolved {
        s.push_str("[RESOLVED] ");
    }
    s.push_str(&inc.host);
    s.push_str(": ");
    s.push_str(&inc.title);
    s.push_str(" - ");
    match (inc.xid, escalation) {
        (Some(x), Some(e)) => s.push_str(&format!("Xid {x} ({e}), ")),
        (Some(x), None) => s.push_str(&format!("Xid {x}, ")),
        (None, Some(e)) => s.push_str(&format!("{e}, ")),
        (None, None) => {}
    }
    s.push_str(inc.severity.as_str());
    if let (IncidentPhase::Resolved, Some(note)) = (inc.phase, &inc.note) {
        // What ended it, as the engine knows it: "recovered: ... (same board)" for a lost GPU
        // verified back, "quiet for 10 min" for an event that only stopped.
        s.push_str(&format!(
            " ({note}, since {}, {} occurrence(s))",
            rfc3339(inc.last_seen_ms),
            inc.count
        ));
    } else if inc.phase == IncidentPhase::Resolved
        && inc.kind == crate::model::FindingKind::ServiceDown
    {
        // A state incident ends when the state is seen gone, not when it has been quiet.
        s.push_str(&format!(
            " (verified active again at {})",
            rfc3339(inc.last_seen_ms)
        ));
    } else if inc.phase == IncidentPhase::Resolved && crate::incident::is_state(inc.kind) {
        // A health check's incident ends only when the check passes again: say it was checked.
        s.push_str(&format!(
            " (passes again: verified at {})",
            rfc3339(inc.last_seen_ms)
        ));
    } else if inc.phase == IncidentPhase::Resolved {
        s.push_str(&format!(
            " (quiet since {}, {} occurrence(s))",
            rfc3339(inc.last_seen_ms),
            inc.count
        ));
    }
    if inc.phase == IncidentPhase::Digest {
        s.push_str(&format!(
            " ({} times in {})",
            inc.count,
            duration_words(inc.last_seen_ms.saturating_sub(inc.first_seen_ms))
        ));
        // A reminder ("still failing") or another board at a lost GPU's address.
        if let Some(note) = &inc.note {
            s.push_str(&format!(" ({note})"));
        }
    }
    s
}

/// The history runbook's escalation of a repeat offender, in headline words: "2nd time in 30
/// days: replace the board". `None` when the repeat-offender rule did not match.
fn escalation(evidence: &[Evidence]) -> Option<String> {
    let notes: Vec<&str> = evidence
        .iter()
        .filter(|e| e.runbook == "gpu-history")
        .flat_map(|e| e.steps.iter())
        .flat_map(|s| s.notes.iter().map(String::as_str))
        .collect();
    if !notes.iter().any(|n| n.starts_with("repeat offender")) {
        return None;
    }
    // "history: the 2nd Xid 79 on this board (serial 1650923017654) in 30 days"
    let times = notes.iter().find_map(|n| {
        let rest = n.strip_prefix("history: the ")?;
        let (nth, _) = rest.split_once(' ')?;
        let days = rest.rsplit_once(" in ")?.1;
        nth.starts_with(|c: char| c.is_ascii_digit())
            .then(|| format!("{nth} time in {days}"))
    });
    Some(match times {
        Some(t) => format!("{t}: replace the board"),
        None => "repeat offender: replace the board".to_string(),
    })
}

/// "the user-space driver is 535.54.03 and the kernel module 525.85.12", for an API mismatch
/// whose versions the kernel log gave: the on-call needs both to know which one to change.
fn api_versions(f: &FindingDoc) -> Option<String> {
    let d = f.detail.as_ref()?;
    let client = d.get("client_version")?.as_str().unwrap_or_default();
    let kernel = d.get("kernel_version")?.as_str().unwrap_or_default();
    let word = |v: &str| {
        if v.is_empty() {
            "not in the log".to_string()
        } else {
            v.to_string()
        }
    };
    (!client.is_empty() || !kernel.is_empty()).then(|| {
        format!(
            "The user-space driver (client) is version {} and the kernel module version {}",
            word(client),
            word(kernel)
        )
    })
}

/// `RmInitAdapter failed!` and the `rm_init_adapter failed, device minor number N` that follows
/// it are one failure reported twice by the driver: the second is folded into the first (its
/// lines kept) when it follows for the same GPU (or names none). Returns how many were folded.
fn fold_init_pairs(findings: &mut Vec<FindingDoc>) -> usize {
    let is_init = |f: &FindingDoc, what: &str| {
        f.kind == "driver_init_failure" && f.title.contains(what) && f.xid.is_none()
    };
    let mut folded = 0;
    let mut i = 1;
    while i < findings.len() {
        let (head, tail) = findings.split_at_mut(i);
        let (prev, cur) = (&mut head[i - 1], &tail[0]);
        let same_gpu = cur.pci.is_none() || cur.pci == prev.pci;
        if is_init(prev, "RmInitAdapter failed")
            && is_init(cur, "rm_init_adapter failed")
            && same_gpu
            && !prev.raw.iter().any(|l| l.contains("rm_init_adapter"))
        {
            let cur = findings.remove(i);
            let prev = &mut findings[i - 1];
            for (n, l) in cur.raw.into_iter().enumerate() {
                match (&cur.timestamp, n) {
                    (Some(ts), 0) if prev.timestamp.as_ref() != Some(ts) => {
                        prev.raw.push(format!("{ts} {l}"))
                    }
                    _ => prev.raw.push(l),
                }
            }
            prev.raw_omitted += cur.raw_omitted;
            folded += 1;
        } else {
            i += 1;
        }
    }
    folded
}

fn meaning_and_steps(evidence: &[Evidence], catalog: Option<&CatalogText>) -> (String, String) {
    let from_runbook = |f: fn(&Evidence) -> &str| {
        evidence
            .iter()
            .map(f)
            .find(|s| !s.trim().is_empty())
            .map(|s| s.trim().to_string())
    };
    let meaning = from_runbook(|e| &e.meaning)
        .or_else(|| {
            catalog
                .map(|c| c.summary.trim().to_string())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "No description is known for this fault.".to_string());
    let next = from_runbook(|e| &e.next_steps)
        .or_else(|| catalog.and_then(CatalogText::action_words))
        .unwrap_or_else(|| "Check the kernel log and the GPU's state.".to_string());
    (meaning, next)
}

fn clip_line(s: &str) -> String {
    if s.len() <= MAX_LINE_CHARS {
        return s.to_string();
    }
    let mut end = MAX_LINE_CHARS;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

fn finding_doc(f: &Finding) -> FindingDoc {
    let raw: Vec<String> = f
        .origin
        .raw
        .iter()
        .take(MAX_RAW_LINES_PER_FINDING)
        .map(|l| clip_line(l))
        .collect();
    FindingDoc {
        kind: f.kind.as_str().to_string(),
        xid: f.xid,
        pci: f.pci.map(|p| p.to_string()),
        pid: f.pid,
        process: f.process.clone(),
        severity: f.severity,
        category: f.category,
        title: f.title.clone(),
        message: clip_line(&f.message),
        caused_by: f.caused_by,
        detail: f.detail.as_ref().and_then(|d| serde_json::to_value(d).ok()),
        gpu: (!f.gpu.is_empty()).then(|| GpuDoc {
            index: f.gpu.index,
            pci: None,
            uuid: f.gpu.uuid.clone(),
            serial: f.gpu.serial.clone(),
            name: f.gpu.name.clone(),
        }),
        timestamp: f.origin.timestamp.clone(),
        seq: f.origin.seq,
        raw_omitted: f.origin.raw.len().saturating_sub(raw.len()),
        raw,
    }
}

fn evidence_doc(e: &Evidence) -> EvidenceDoc {
    EvidenceDoc {
        runbook: e.runbook.clone(),
        meaning: e.meaning.clone(),
        next_steps: e.next_steps.clone(),
        host: e.host.clone(),
        started_ms: e.started_ms,
        duration_ms: e.duration_ms,
        steps: e
            .steps
            .iter()
            .take(MAX_STEPS)
            .map(|s| {
                let (output, cut) = clip_bytes(&s.output, MAX_STEP_OUTPUT_BYTES);
                StepDoc {
                    name: s.name.clone(),
                    kind: s.kind.clone(),
                    target: s.target.clone(),
                    status: match &s.status {
                        StepStatus::Done { exit_code } => StepStatusDoc::Done {
                            exit_code: *exit_code,
                        },
                        StepStatus::TimedOut { after_ms } => StepStatusDoc::TimedOut {
                            after_ms: *after_ms,
                        },
                        StepStatus::Missing { what } => {
                            StepStatusDoc::Missing { what: what.clone() }
                        }
                        StepStatus::Skipped { reason } => StepStatusDoc::Skipped {
                            reason: reason.clone(),
                        },
                        StepStatus::Failed { error } => StepStatusDoc::Failed {
                            error: error.clone(),
                        },
                    },
                    output,
                    bytes_dropped: s.bytes_dropped + cut as u64,
                    duration_ms: s.duration_ms,
                    notes: s.notes.clone(),
                }
            })
            .collect(),
        steps_omitted: e.steps.len().saturating_sub(MAX_STEPS),
    }
}

/// Cuts `s` to at most `max` bytes on a character boundary; returns the bytes cut.
pub(crate) fn clip_bytes(s: &str, max: usize) -> (String, usize) {
    if s.len() <= max {
        return (s.to_string(), 0);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    (s[..end].to_string(), s.len() - end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_values() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_764_404_043_123), "2025-11-29T08:14:03.123Z");
    }

    /// A host page names every GPU with its incident, the port above all of them when sysfs
    /// knows it, and says the host is what to check; without sysfs it is still a host page.
    #[test]
    fn a_host_page_names_every_gpu_and_what_they_share() {
        let alert = crate::alert::synthetic_alert("node-1", 1_764_404_043_123, Vec::new());
        let mut a = alert.incident.clone();
        a.id = "a".into();
        a.pci = crate::model::PciAddress::parse("0000:19:00.0").ok();
        let mut b = a.clone();
        b.id = "b".into();
        b.pci = crate::model::PciAddress::parse("0000:1a:00.0").ok();
        let dir = tempfile::tempdir().unwrap();
        let devices = dir.path().join("bus/pci/devices");
        std::fs::create_dir_all(&devices).unwrap();
        for (name, path) in [
            (
                "0000:19:00.0",
                "pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:00.0/0000:19:00.0",
            ),
            (
                "0000:1a:00.0",
                "pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:04.0/0000:1a:00.0",
            ),
        ] {
            std::os::unix::fs::symlink(format!("../../../devices/{path}"), devices.join(name))
                .unwrap();
        }
        let g = HostGroup::new(&a, &[&b], dir.path());
        assert_eq!(g.shared_ports, vec!["0000:17:00.0", "0000:16:01.0"]);
        let ids: Vec<&str> = g.gpus.iter().map(|g| g.incident_id.as_str()).collect();
        assert_eq!(ids, vec!["a", "b"]);
        let mut doc = AlertDocument::build(&alert);
        doc.apply_host_group(g);
        assert!(
            doc.headline.contains("2 GPUs failed together (Xid 79)"),
            "{}",
            doc.headline
        );
        assert!(doc.headline.contains("0000:19:00.0") && doc.headline.contains("0000:1a:00.0"));
        assert!(
            doc.meaning.contains("the PCIe port 0000:17:00.0"),
            "{}",
            doc.meaning
        );
        assert!(
            doc.next_steps.contains("PCIe switch or riser"),
            "{}",
            doc.next_steps
        );
        let report = crate::alert::report::render(&doc);
        assert!(report.contains("incident b"), "{report}");
        assert!(
            report.contains("Shared:    PCIe 0000:17:00.0 > 0000:16:01.0"),
            "{report}"
        );

        let none = HostGroup::new(&a, &[&b], &dir.path().join("absent"));
        assert!(none.shared_ports.is_empty());
        assert!(none.shared.starts_with("the host"), "{}", none.shared);
    }

    #[test]
    fn clip_respects_char_boundaries() {
        let (s, cut) = clip_bytes("ééé", 3);
        assert_eq!(s, "é");
        assert_eq!(cut, 4);
    }
}
