//! Text rendering of findings for people, shared by `scan` and the daemon's standard output.

use std::fmt::Write as _;

use crate::classify::guidance;
use crate::model::{Detail, Finding, FindingKind, Incident, Severity};

/// What to call the device a finding names: an SXid comes from an NVSwitch, not a GPU.
pub fn device_label(f: &Finding) -> &'static str {
    if f.kind == FindingKind::Sxid {
        "nvswitch"
    } else {
        "gpu"
    }
}

/// One block per incident for `scan`: the cause's block, then what was folded into it (repeats
/// of the cause and echoes, with exact counts), so one fault reads as one story.
pub fn incident_block(inc: &Incident, location: &str) -> String {
    let Some(cause) = inc.findings.first() else {
        return String::new();
    };
    let mut s = finding_block(cause, location);
    if inc.count > 1 {
        let _ = writeln!(s, "  repeats  {} times in all in this window", inc.count);
    }
    if !inc.echoes.is_empty() {
        let parts: Vec<String> = inc
            .echoes
            .iter()
            .map(|e| format!("{} x{}", what(e.kind, e.xid), e.count))
            .collect();
        let _ = writeln!(
            s,
            "  echoes   {} (follow-on messages of this fault, folded in)",
            parts.join(", ")
        );
        for f in inc.findings.iter().skip(1).take(4) {
            let _ = writeln!(
                s,
                "           {}",
                f.origin.raw.first().map_or("", |r| r.as_str())
            );
        }
    }
    s
}

/// `Xid 79`, `SXid 20034`, or the kind's name.
pub fn what(kind: FindingKind, xid: Option<u32>) -> String {
    match (kind, xid) {
        (FindingKind::Xid, Some(x)) => format!("Xid {x}"),
        (FindingKind::Sxid, Some(x)) => format!("SXid {x}"),
        (k, _) => k.as_str().to_string(),
    }
}

/// One block per finding: headline, GPU, process, meaning, action, NVIDIA's buckets, the log.
pub fn finding_block(f: &Finding, location: &str) -> String {
    let mut s = String::new();
    let sev = match f.severity {
        Severity::Critical => "CRITICAL",
        Severity::Warning => "WARNING ",
        Severity::Info => "info    ",
    };
    let _ = write!(s, "{sev} {}", f.title);
    if !location.is_empty() {
        let _ = write!(s, "   ({location}");
        if let Some(t) = &f.origin.timestamp {
            let _ = write!(s, " {t}");
        }
        s.push(')');
    }
    s.push('\n');
    if let Some(p) = f.pci {
        let _ = write!(s, "  {:<9}{p}", device_label(f));
        if let Some(i) = f.gpu.index {
            let _ = write!(s, "  index {i}");
        }
        if let Some(u) = &f.gpu.uuid {
            let _ = write!(s, "  {u}");
        }
        if let Some(n) = &f.gpu.serial {
            let _ = write!(s, "  serial {n}");
        }
        s.push('\n');
    }
    if f.pid.is_some() || f.process.is_some() {
        let _ = writeln!(
            s,
            "  process  {} (pid {})",
            f.process.as_deref().unwrap_or("?"),
            f.pid.map_or("?".to_string(), |p| p.to_string())
        );
    }
    if let Some(c) = f.caused_by {
        let _ = writeln!(s, "  cause    follows Xid {c} (an echo of it)");
    }
    if let Some(d) = detail_line(f) {
        let _ = writeln!(s, "  detail   {d}");
    }
    if f.severity > Severity::Info {
        let g = guidance::for_finding(f);
        let _ = writeln!(s, "  meaning  {}", g.meaning);
        let _ = writeln!(s, "  action   {}", g.action);
        for n in &g.nvidia {
            let _ = writeln!(s, "  nvidia   {n}");
        }
    }
    for (i, raw) in f.origin.raw.iter().enumerate() {
        let _ = writeln!(s, "  {}   {raw}", if i == 0 { "log  " } else { "     " });
    }
    if f.origin.lines as usize > f.origin.raw.len() {
        let _ = writeln!(
            s,
            "           ... {} more lines",
            f.origin.lines as usize - f.origin.raw.len()
        );
    }
    s
}

fn detail_line(f: &Finding) -> Option<String> {
    Some(match f.detail.as_ref()? {
        Detail::GraphicsException { gpc, tpc, sm } => format!("GPC {gpc}, TPC {tpc}, SM {sm}"),
        Detail::NvlinkError { link, registers } => format!(
            "NVLink {link}, registers {}",
            registers
                .iter()
                .map(|r| format!("{r:#010x}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        Detail::Nvlink5 {
            unit,
            link,
            intr_info,
            error_status,
            decode,
        } => format!(
            "unit {unit}{}, IntrInfo {intr_info:#010x}, Error Status {error_status:#010x}{}",
            link.map_or(String::new(), |l| format!(", link {l}")),
            if decode.is_empty() {
                " (no row of the decode table matches)"
            } else {
                ""
            }
        ),
        Detail::Service {
            unit,
            active_state,
            sub_state,
            result,
            restarts,
            ..
        } => format!(
            "{unit}: {active_state}/{sub_state}, result {result}{}",
            restarts.map_or(String::new(), |n| format!(", {n} restart(s)"))
        ),
        Detail::Recovery { from, to } => {
            format!(
                "recovery action changed from {} to {}",
                from.describe(),
                to.describe()
            )
        }
        Detail::ApiMismatch {
            client_version,
            kernel_version,
        } => {
            format!("client {client_version}, kernel module {kernel_version}")
        }
        Detail::Sxid {
            fatal,
            link,
            continuation,
        } => format!(
            "{}{}{}",
            if *fatal { "fatal" } else { "non-fatal" },
            link.map_or(String::new(), |l| format!(", link {l}")),
            if continuation.is_empty() {
                String::new()
            } else {
                format!("; {}", continuation.join("; "))
            }
        ),
        Detail::MemoryRepair {
            remap_pending,
            remap_failed,
            pages_pending,
        } => format!(
            "row remap pending: {remap_pending}, row remap failed: {remap_failed}, pages pending retirement: {pages_pending}"
        ),
        Detail::InitFailure { code } => code.as_ref().map(|c| format!("status {c}"))?,
        Detail::Aer { reporter, class } => format!(
            "{class}{}",
            reporter.map_or(String::new(), |r| format!(", reported by {r}"))
        ),
        Detail::Overrun { lost } => format!("{lost} records lost"),
        Detail::Ecc { double_bit } => if *double_bit {
            "double-bit (uncorrectable)"
        } else {
            "single-bit (corrected)"
        }
        .to_string(),
        Detail::DriverUnresponsive {
            call,
            waited_ms,
            blocked,
            blocked_omitted,
        } => format!(
            "{call} had not returned after {} ms; {} task(s) in D state",
            waited_ms,
            blocked.len() + blocked_omitted
        ),
    })
}
