//! The readable text report of one alert: standard output / the journal, the email body, the
//! `.txt` attachment and the full report kept on the host.

use std::fmt::Write as _;

use super::document::{duration_words, kind_words, AlertDocument, Phase};

/// The whole report, evidence included.
pub fn render(doc: &AlertDocument) -> String {
    let mut out = summary(doc);
    out.push_str(&evidence(doc));
    out
}

/// Everything but the runbook steps' output: what the on-call reads first.
pub fn summary(doc: &AlertDocument) -> String {
    let mut o = String::new();
    o.push_str(&doc.headline);
    o.push('\n');
    o.push_str(&"-".repeat(doc.headline.chars().count().clamp(20, 100)));
    o.push('\n');
    if doc.test {
        o.push_str(
            "THIS IS A TEST ALERT sent by `xidwatch test-alert`; nothing is wrong with any GPU.\n",
        );
    }
    if doc.dropped_alerts_before > 0 {
        let _ = writeln!(
            o,
            "NOTE: {} earlier alert(s) were dropped because the alert outbox was full.",
            doc.dropped_alerts_before
        );
    }
    let _ = write!(o, "Host:      {}", doc.host);
    if let Some(b) = &doc.boot_id {
        let _ = write!(o, " (boot {b})");
    }
    o.push('\n');
    if let Some(g) = &doc.gpu {
        let mut parts = Vec::new();
        if let Some(i) = g.index {
            parts.push(format!("index {i}"));
        }
        if let Some(p) = &g.pci {
            parts.push(format!("PCI {p}"));
        }
        if let Some(u) = &g.uuid {
            parts.push(format!("UUID {u}"));
        }
        if let Some(s) = &g.serial {
            parts.push(format!("serial {s}"));
        }
        if let Some(n) = &g.name {
            parts.push(n.clone());
        }
        let _ = writeln!(o, "GPU:       {}", parts.join(", "));
    }
    if let Some(h) = &doc.host_group {
        // A host page: every GPU it stands for, each under its own incident's id, so the
        // per-GPU notices that follow can be matched to it.
        let _ = writeln!(o, "GPUs:      {} ({} together)", h.names(), h.gpus.len());
        for g in &h.gpus {
            let _ = writeln!(o, "           {}: incident {}", g.title, g.incident_id);
        }
        if !h.shared_ports.is_empty() {
            let _ = writeln!(o, "Shared:    PCIe {}", h.shared_ports.join(" > "));
        }
    }
    let mut fault = doc.fault_words();
    if let Some(c) = &doc.catalog {
        // For other kinds the catalog's mnemonic is the kind itself: not twice.
        if !c.mnemonic.is_empty() && c.mnemonic != doc.kind {
            let _ = write!(fault, " {}", c.mnemonic);
        }
    }
    let _ = writeln!(
        o,
        "Fault:     {fault} (category {}, severity {})",
        doc.category.label(),
        doc.severity
    );
    let _ = write!(o, "Seen:      {}", doc.first_seen);
    if doc.last_seen_ms != doc.first_seen_ms {
        let _ = write!(
            o,
            " .. {} ({})",
            doc.last_seen,
            duration_words(doc.last_seen_ms.saturating_sub(doc.first_seen_ms))
        );
    }
    let _ = write!(o, ", {} occurrence(s)", doc.count);
    if doc.found_at_startup {
        o.push_str(", already in the kernel log when xidwatch started");
    }
    o.push('\n');
    let _ = writeln!(
        o,
        "Incident:  {} ({})",
        doc.id,
        match doc.phase {
            Phase::Opened => "opened",
            Phase::Digest => "digest",
            Phase::Resolved => "resolved",
        }
    );
    if let Some(h) = &doc.host_page {
        let _ = writeln!(o, "Host page: {h} (this GPU's opening page)");
    }
    for s in &doc.supersedes {
        let what = s.xid.map_or(s.kind.clone(), |x| format!("Xid {x}"));
        let _ = writeln!(o, "Supersedes: incident {} ({what}), paged before", s.id);
    }
    if let Some(st) = &doc.gpu_state {
        let whose = if doc.gpu.is_some() { "GPU" } else { "Host" };
        let _ = writeln!(o, "{whose} now:   {}", st.words());
    }
    if let Some(p) = &doc.report_path {
        let _ = writeln!(o, "Report:    {p} on {}", doc.host);
    }

    section(&mut o, "What it means", &doc.meaning);
    section(&mut o, "What to do", &doc.next_steps);
    if let Some(h) = &doc.handoff {
        let _ = writeln!(o, "\nHand-off ({})", h.scheduler.as_str());
        for c in &h.commands {
            let _ = writeln!(o, "  {c}");
        }
        let _ = writeln!(o, "  ({})", h.note);
    }

    if let Some(c) = &doc.catalog {
        o.push_str("\nNVIDIA catalog\n");
        let mut kv = |k: &str, v: &str| {
            if !v.trim().is_empty() {
                let _ = writeln!(o, "  {k}: {}", v.trim());
            }
        };
        kv("mnemonic", &c.mnemonic);
        kv("summary", &c.summary);
        let bucket = |b: &Option<String>, m: &Option<String>| match (b, m) {
            (Some(b), Some(m)) => format!("{b} - {m}"),
            (Some(b), None) => b.clone(),
            (None, Some(m)) => m.clone(),
            (None, None) => String::new(),
        };
        let imm = bucket(&c.immediate_bucket, &c.immediate_meaning);
        let inv = bucket(&c.investigatory_bucket, &c.investigatory_meaning);
        if imm == inv {
            // One bucket for both steps (Xid 48, 145): said once.
            kv("immediate and investigatory action", &imm);
        } else {
            kv("immediate action", &imm);
            kv("investigatory action", &inv);
        }
        kv("causes", &c.causes);
        kv("check", &c.check);
        kv("applies to", &c.applies_to.join(", "));
        kv("source", &c.source);
    }

    let notes = doc.notes();
    if !notes.is_empty() {
        o.push_str("\nRunbook findings\n");
        for (step, note) in notes {
            let _ = writeln!(o, "  - {note} (step {step})");
        }
    }

    let lines = doc.kernel_lines();
    if !lines.is_empty() {
        o.push_str("\nKernel log\n");
        for l in lines {
            let _ = writeln!(o, "  {l}");
        }
        if doc.findings_omitted > 0 {
            let _ = writeln!(o, "  ({} more findings not shown)", doc.findings_omitted);
        }
    }

    if !doc.echoes.is_empty() {
        o.push_str("\nFolded into this incident\n");
        for e in &doc.echoes {
            let _ = writeln!(o, "  {}: {} time(s)", kind_words(&e.kind, e.xid), e.count);
        }
    }
    o
}

fn section(o: &mut String, title: &str, text: &str) {
    if text.trim().is_empty() {
        return;
    }
    let _ = writeln!(o, "\n{title}");
    for l in text.trim().lines() {
        let _ = writeln!(o, "  {l}");
    }
}

/// Every runbook step with its full (already bounded) output.
pub fn evidence(doc: &AlertDocument) -> String {
    let mut o = String::new();
    if doc.evidence.is_empty() {
        match &doc.evidence_note {
            Some(note) => {
                let _ = writeln!(o, "\nEvidence\n  {note}");
            }
            None => o.push_str("\nEvidence\n  no runbook ran for this alert\n"),
        }
        return o;
    }
    for e in &doc.evidence {
        let _ = writeln!(
            o,
            "\nEvidence: runbook {} on {} ({} step(s), {} ms)",
            e.runbook,
            e.host,
            e.steps.len(),
            e.duration_ms
        );
        for (i, s) in e.steps.iter().enumerate() {
            let _ = writeln!(
                o,
                "--- step {}: {} ({}: {}) {}, {} ms",
                i + 1,
                s.name,
                s.kind,
                s.target.join(" "),
                s.status.describe(),
                s.duration_ms
            );
            for n in &s.notes {
                let _ = writeln!(o, "    note: {n}");
            }
            for l in s.output.lines() {
                let _ = writeln!(o, "    {l}");
            }
            if s.bytes_dropped > 0 {
                let _ = writeln!(
                    o,
                    "    [... {} more bytes of output dropped]",
                    s.bytes_dropped
                );
            }
        }
        if e.steps_omitted > 0 {
            let _ = writeln!(o, "({} more steps not shown)", e.steps_omitted);
        }
    }
    o
}
