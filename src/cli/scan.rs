//! `xidwatch scan`: classify saved logs.
//!
//! Exit status: 0 when nothing is at warning or above, 1 when something is, 2 on an error (an
//! unreadable or truncated file), in which case whatever was readable is still reported.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{render, ScanArgs, EXIT_ERROR};
use crate::classify::{prefix, Classifier, LineOrigin};
use crate::model::{Detail, Finding, FindingKind, GpuIdentity, PciAddress, Severity};
use crate::source::file::{self, Prefilter};

/// A finding as `scan --json` prints it: the contract fields at the top level.
#[derive(Serialize)]
struct JsonFinding<'a> {
    file: &'a str,
    kind: FindingKind,
    xid: Option<u32>,
    pci: Option<PciAddress>,
    pid: Option<u32>,
    process: Option<&'a str>,
    severity: Severity,
    category: crate::model::Category,
    title: &'a str,
    line: u64,
    lines: u32,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    caused_by: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ts_usec: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seq: Option<u64>,
    #[serde(skip_serializing_if = "GpuIdentity::is_empty")]
    gpu: &'a GpuIdentity,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a Detail>,
    raw: &'a [String],
}

/// One runbook run per (kind, Xid, GPU) when `--runbooks` is given.
type SubjectKey = (FindingKind, Option<u32>, Option<PciAddress>);

/// Per-GPU tallies for the closing summary.
#[derive(Default)]
struct Tally {
    findings: u64,
    worst: Option<Severity>,
    by_what: BTreeMap<String, u64>,
    gpu: GpuIdentity,
}

struct Output<W: Write> {
    out: W,
    json: bool,
    /// Standard output went away (`| head`): stop writing, still exit normally.
    closed: bool,
    worst: Option<Severity>,
    per_gpu: BTreeMap<Option<PciAddress>, Tally>,
    counts: BTreeMap<Severity, u64>,
    /// With `--runbooks`: one subject per (kind, Xid, GPU) at warning or above.
    subjects: Option<BTreeMap<SubjectKey, crate::runbook::Subject>>,
}

impl<W: Write> Output<W> {
    fn emit(&mut self, file: &str, f: &Finding) {
        if let Some(subjects) = self.subjects.as_mut() {
            if f.severity >= Severity::Warning && subjects.len() < 64 {
                subjects.entry((f.kind, f.xid, f.pci)).or_insert_with(|| {
                    let mut s = crate::runbook::Subject::manual(f.pci, f.xid, f.pid);
                    s.kind = f.kind;
                    s.category = f.category;
                    s.severity = f.severity;
                    s.gpu_index = f.gpu.index;
                    s
                });
            }
        }
        self.worst = self.worst.max(Some(f.severity));
        *self.counts.entry(f.severity).or_default() += 1;
        if f.kind != FindingKind::GpuIdentity {
            let t = self.per_gpu.entry(f.pci).or_default();
            t.findings += 1;
            t.worst = t.worst.max(Some(f.severity));
            let what = match (f.kind, f.xid) {
                (FindingKind::Xid, Some(x)) => format!("Xid {x}"),
                (FindingKind::Sxid, Some(x)) => format!("SXid {x}"),
                (k, _) => k.as_str().to_string(),
            };
            *t.by_what.entry(what).or_default() += 1;
            if !f.gpu.is_empty() {
                t.gpu = f.gpu.clone();
            }
        }
        if self.closed {
            return;
        }
        let res = if self.json {
            let j = JsonFinding {
                file,
                kind: f.kind,
                xid: f.xid,
                pci: f.pci,
                pid: f.pid,
                process: f.process.as_deref(),
                severity: f.severity,
                category: f.category,
                title: &f.title,
                line: f.origin.line,
                lines: f.origin.lines,
                message: &f.message,
                caused_by: f.caused_by,
                timestamp: f.origin.timestamp.as_deref(),
                ts_usec: f.origin.ts_usec,
                seq: f.origin.seq,
                gpu: &f.gpu,
                detail: f.detail.as_ref(),
                raw: &f.origin.raw,
            };
            serde_json::to_writer(&mut self.out, &j)
                .map_err(io::Error::from)
                .and_then(|_| self.out.write_all(b"\n"))
        } else {
            let loc = format!("{file}:{}", f.origin.line);
            writeln!(self.out, "{}", render::finding_block(f, &loc))
        };
        if res.is_err() {
            self.closed = true;
        }
    }

    /// `files` inputs were read to the end, `unread` could not be (each already said why).
    fn summary(&mut self, files: usize, unread: usize) {
        if self.json || self.closed {
            return;
        }
        let total: u64 = self.counts.values().sum();
        let mut s = String::new();
        if total == 0 && files == 0 {
            // Nothing was read: saying "no faults found" would be a false all-clear.
            s.push_str(&format!(
                "Nothing scanned: {unread} input{} could not be read.\n",
                if unread == 1 { "" } else { "s" }
            ));
        } else if total == 0 {
            s.push_str(&format!(
                "No GPU faults found in {files} input{}{}.\n",
                if files == 1 { "" } else { "s" },
                if unread > 0 {
                    format!(" ({unread} could not be read)")
                } else {
                    String::new()
                }
            ));
        } else {
            let parts: Vec<String> = [Severity::Critical, Severity::Warning, Severity::Info]
                .iter()
                .filter_map(|sev| self.counts.get(sev).map(|n| format!("{n} {sev}")))
                .collect();
            s.push_str(&format!(
                "Summary: {total} finding{} ({})\n",
                if total == 1 { "" } else { "s" },
                parts.join(", ")
            ));
            for (pci, t) in &self.per_gpu {
                let who = match pci {
                    Some(p) => {
                        let mut w = format!("GPU {p}");
                        if let Some(u) = &t.gpu.uuid {
                            w.push_str(&format!(" {u}"));
                        }
                        if let Some(n) = &t.gpu.serial {
                            w.push_str(&format!(" serial {n}"));
                        }
                        w
                    }
                    None => "no GPU named".to_string(),
                };
                let what: Vec<String> =
                    t.by_what.iter().map(|(k, n)| format!("{k} x{n}")).collect();
                s.push_str(&format!(
                    "  {who}: {} finding{}, worst {}: {}\n",
                    t.findings,
                    if t.findings == 1 { "" } else { "s" },
                    t.worst.map_or("info", Severity::as_str),
                    what.join(", ")
                ));
            }
        }
        if self.out.write_all(s.as_bytes()).is_err() {
            self.closed = true;
        }
    }
}

/// Runs `scan`.
pub fn run(args: &ScanArgs) -> anyhow::Result<u8> {
    let stdout = io::stdout().lock();
    let mut out = Output {
        out: io::BufWriter::with_capacity(64 * 1024, stdout),
        json: args.json,
        closed: false,
        worst: None,
        per_gpu: BTreeMap::new(),
        counts: BTreeMap::new(),
        subjects: args.runbooks.as_ref().map(|_| BTreeMap::new()),
    };
    let runbook_config = match &args.runbooks {
        None => None,
        Some(p) => {
            let path = (p.as_os_str() != "-").then_some(p.as_path());
            match crate::config::Config::load(path) {
                Ok(c) => Some(c),
                Err(e) => {
                    eprintln!("xidwatch: config error: {e}");
                    return Ok(super::EXIT_CONFIG);
                }
            }
        }
    };
    let files: Vec<PathBuf> = if args.files.is_empty() {
        vec![PathBuf::from("-")]
    } else {
        args.files.clone()
    };
    let pre = Prefilter::new();
    let mut unread = 0;
    for path in &files {
        if !scan_one(path, &pre, &mut out) {
            unread += 1;
        }
    }
    let failed = unread > 0;
    out.summary(files.len() - unread, unread);
    if let (Some(cfg), Some(subjects)) = (&runbook_config, out.subjects.take()) {
        run_runbooks(cfg, subjects.into_values().collect(), &mut out)?;
    }
    let _ = out.out.flush();
    Ok(if failed {
        EXIT_ERROR
    } else if out.worst >= Some(Severity::Warning) {
        1
    } else {
        0
    })
}

/// Scans one input; false when it could not be read to the end.
fn scan_one<W: Write>(path: &Path, pre: &Prefilter, out: &mut Output<W>) -> bool {
    let name = if path == Path::new("-") {
        "<stdin>".to_string()
    } else {
        path.display().to_string()
    };
    let mut classifier = Classifier::new();
    let mut findings = Vec::new();
    let mut invalid_utf8 = 0u64;
    let mut on_line = |line_no: u64, bytes: &[u8]| {
        let text = match std::str::from_utf8(bytes) {
            Ok(t) => std::borrow::Cow::Borrowed(t),
            Err(_) => {
                invalid_utf8 += 1;
                String::from_utf8_lossy(bytes)
            }
        };
        let Some(split) = prefix::split(&text) else {
            return;
        };
        let at = LineOrigin {
            line: line_no,
            seq: split.prefix.seq,
            ts_usec: split.prefix.ts_usec,
            timestamp: split.prefix.text,
        };
        for msg in &split.messages {
            classifier.push(msg, &at, &mut findings);
        }
        for f in findings.drain(..) {
            out.emit(&name, &f);
        }
    };
    let stats = match file::open(path) {
        Ok(reader) => file::scan_lines(reader, pre, &mut on_line),
        Err(e) => {
            eprintln!("xidwatch: {name}: cannot read: {e}");
            return false;
        }
    };
    classifier.flush(&mut findings);
    for f in findings.drain(..) {
        out.emit(&name, &f);
    }
    if invalid_utf8 > 0 {
        eprintln!("xidwatch: {name}: note: {invalid_utf8} candidate line(s) held invalid UTF-8; the bad bytes were replaced and the rest classified");
    }
    for n in &stats.notes {
        match n.line {
            Some(l) => eprintln!("xidwatch: {name}:{l}: note: {}", n.text),
            None => eprintln!("xidwatch: {name}: note: {}", n.text),
        }
    }
    if let Some(e) = &stats.error {
        eprintln!(
            "xidwatch: {name}: read stopped after {} bytes ({} lines): {e}; findings above come from the readable part",
            stats.bytes, stats.lines
        );
        return false;
    }
    true
}

/// Runs the matching runbook once per (runbook, GPU) for the scanned findings. The evidence is
/// this machine's, now: the log may come from another machine or another day, and says so.
fn run_runbooks<W: Write>(
    cfg: &crate::config::Config,
    subjects: Vec<crate::runbook::Subject>,
    out: &mut Output<W>,
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let env = crate::daemon::runbook_env(cfg);
    let host = env.host.clone();
    let mut done = std::collections::BTreeSet::new();
    for subject in subjects {
        let Some(rb) = cfg.runbook_set.select(&subject) else {
            continue;
        };
        if !done.insert((rb.name().to_string(), subject.pci)) {
            continue;
        }
        let ev = rt.block_on(rb.run(&subject, &env, &cfg.runbook_limits));
        let res = if out.json {
            let j = serde_json::json!({
                "type": "evidence",
                "note": format!("gathered on {host} now, not when the log was written"),
                "pci": subject.pci,
                "xid": subject.xid,
                "evidence": ev,
            });
            serde_json::to_writer(&mut out.out, &j)
                .map_err(io::Error::from)
                .and_then(|_| out.out.write_all(b"\n"))
        } else {
            writeln!(
                out.out,
                "\n=== Evidence from THIS machine ({host}) NOW, not from when the log was written: runbook {} for {} ===\n{}",
                rb.name(),
                subject.pci.map_or("the host".to_string(), |p| p.to_string()),
                crate::runbook::render_evidence(&ev)
            )
        };
        if res.is_err() {
            break;
        }
    }
    Ok(())
}
