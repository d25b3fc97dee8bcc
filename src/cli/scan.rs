//! `xidwatch scan`: classify saved logs.
//!
//! Exit status: 0 when nothing is at warning or above, 1 when something is, 2 on an error (an
//! unreadable or truncated file), in which case whatever was readable is still reported.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

#[cfg(test)]
use serde::Serialize;

use super::{render, ScanArgs, EXIT_ERROR};
use crate::classify::saved::SavedLog;
use crate::incident::{Engine, EngineConfig, Origin as FindingOrigin};
#[cfg(test)]
use crate::model::Detail;
use crate::model::{Finding, FindingKind, GpuIdentity, Incident, PciAddress, Severity};
use crate::source::file::{self, Prefilter};

/// A finding as `scan --json` prints it: the contract fields at the top level. The writer in
/// `cli::json` writes exactly this, faster; this type is the reference its test compares with.
#[cfg(test)]
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
    #[serde(skip_serializing_if = "Option::is_none")]
    shape: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    module: Option<&'a str>,
    raw: &'a [String],
}

/// One runbook run per (kind, Xid, GPU) when `--runbooks` is given.
type SubjectKey = (FindingKind, Option<u32>, Option<PciAddress>);

/// Per-device tallies for the closing summary.
#[derive(Default)]
struct Tally {
    findings: u64,
    worst: Option<Severity>,
    by_what: BTreeMap<(FindingKind, Option<u32>), u64>,
    gpu: GpuIdentity,
}

/// The device a summary line is about: a GPU, an NVSwitch, or none named.
type Device = (bool, Option<PciAddress>);

/// Groups one input's findings into incidents with the daemon's engine, its clock driven by the
/// records' own timestamps, so a fault and its echoes read as one block led by the cause.
struct Grouper {
    /// Engine 0 takes every finding that names a device (the engine's key is GPU, kind, Xid).
    /// Findings that name none are grouped per title in engines of their own: "nvidia-modeset
    /// error" and "GSP firmware crash report" are different problems even without an address.
    engines: Vec<Engine>,
    by_title: HashMap<String, usize>,
    now_ms: u64,
    /// Latest version of every incident, in the order they opened.
    incidents: Vec<Incident>,
    index: HashMap<(usize, String), usize>,
    out: Vec<Incident>,
}

/// Bound on the per-title engines; past it, findings share engine 0.
const MAX_TITLE_ENGINES: usize = 256;

fn new_engine() -> Engine {
    let d = crate::config::IncidentsConfig::default();
    Engine::new(EngineConfig {
        window_ms: d.window_secs.saturating_mul(1000),
        max_open: d.max_open,
        nvml_match_ms: d.nvml_match_ms,
        host: String::new(),
        boot_id: String::new(),
        overrides: crate::classify::XidOverrides::default(),
        // A saved log is read whole: nothing to wait for, nothing to resolve.
        settle_ms: 0,
        quiet_ms: 0,
        remind_ms: 0,
    })
}

impl Grouper {
    fn new() -> Self {
        Grouper {
            engines: vec![new_engine()],
            by_title: HashMap::new(),
            now_ms: 0,
            incidents: Vec::new(),
            index: HashMap::new(),
            out: Vec::new(),
        }
    }

    fn push(&mut self, f: Finding) {
        // Kernel timestamps drive the windows; a line without one shares the last time seen.
        if let Some(ms) = f.origin.ts_usec.map(|u| u / 1000) {
            if ms > self.now_ms {
                self.now_ms = ms;
                for e in 0..self.engines.len() {
                    self.engines[e].tick(ms, &mut self.out);
                    self.collect(e);
                }
            }
        }
        let e = if f.pci.is_none() && f.kind != FindingKind::Xid {
            match self.by_title.get(f.title.as_ref()) {
                Some(&e) => e,
                None if self.engines.len() <= MAX_TITLE_ENGINES => {
                    self.engines.push(new_engine());
                    let e = self.engines.len() - 1;
                    self.by_title.insert(f.title.to_string(), e);
                    e
                }
                None => 0,
            }
        } else {
            0
        };
        self.engines[e].push(f, FindingOrigin::Kmsg, self.now_ms, false, &mut self.out);
        self.collect(e);
    }

    fn collect(&mut self, engine: usize) {
        for inc in self.out.drain(..) {
            match self.index.get(&(engine, inc.id.clone())) {
                Some(&i) => self.incidents[i] = inc,
                None => {
                    self.index
                        .insert((engine, inc.id.clone()), self.incidents.len());
                    self.incidents.push(inc);
                }
            }
        }
    }

    /// Every incident, final counts, in log order; one superseded by a worse cause on the same
    /// GPU (an AER warning before the Xid 79) is shown inside its successor, not on its own.
    fn finish(mut self) -> Vec<Incident> {
        for e in 0..self.engines.len() {
            self.engines[e].close_all(&mut self.out);
            self.collect(e);
        }
        let key = |f: &Finding| (f.origin.line, f.kind, f.xid, f.pci);
        let absorbed: std::collections::HashSet<_> = self
            .incidents
            .iter()
            .flat_map(|i| i.findings.iter().skip(1).map(key))
            .collect();
        let mut v: Vec<Incident> = self
            .incidents
            .into_iter()
            .filter(|i| {
                i.findings
                    .first()
                    .is_none_or(|c| !absorbed.contains(&key(c)))
            })
            .collect();
        v.sort_by_key(|i| i.findings.first().map(|f| f.origin.line));
        v
    }
}

/// The `--json` chunk: the output writer's buffer size, so a chunk is written past it.
const JSON_CHUNK: usize = 64 * 1024;

struct Output<W: Write> {
    out: W,
    json: bool,
    /// Standard output went away (`| head`): stop writing, still exit normally.
    closed: bool,
    /// `--json`: findings written and not yet handed to `out`, up to [`JSON_CHUNK`] bytes, then
    /// handed over in one write. One write per finding copied each line a second time, into the
    /// writer's buffer; a chunk the size of that buffer goes past it.
    line: Vec<u8>,
    /// `--json`: the input's name and that name as a JSON string, written once per input.
    file_json: (String, Vec<u8>),
    worst: Option<Severity>,
    per_gpu: BTreeMap<Device, Tally>,
    /// Findings per severity, indexed by `Severity as usize` (a map lookup per finding showed in
    /// the storm scan's profile).
    counts: [u64; 3],
    /// Inputs that could not be read to the end.
    failed: usize,
    /// Lines a reader failed on (a defect of xidwatch's, caught): skipped, said, and the scan
    /// went on.
    unread_lines: u64,
    /// With `--runbooks`: one subject per (kind, Xid, GPU) at warning or above.
    subjects: Option<BTreeMap<SubjectKey, crate::runbook::Subject>>,
}

impl<W: Write> Output<W> {
    /// Output to `w`: JSON Lines or text blocks, and with `runbooks` the subjects to run them for.
    fn new(w: W, json: bool, runbooks: bool) -> Self {
        Output {
            out: w,
            json,
            closed: false,
            line: Vec::with_capacity(if json { JSON_CHUNK + 4096 } else { 0 }),
            file_json: (String::new(), b"\"\"".to_vec()),
            worst: None,
            per_gpu: BTreeMap::new(),
            counts: [0; 3],
            failed: 0,
            unread_lines: 0,
            subjects: runbooks.then(BTreeMap::new),
        }
    }

    /// Counts a finding and, for `--json`, prints it. Text output is per incident instead.
    fn emit(&mut self, file: &str, f: &Finding) {
        self.worst = self.worst.max(Some(f.severity));
        self.counts[f.severity as usize] += 1;
        // The per-device tallies feed the text summary alone: `--json` prints none, and their
        // two map updates per finding were a part of a storm scan's time.
        if !self.json && f.kind != FindingKind::GpuIdentity {
            let t = self
                .per_gpu
                .entry((f.kind == FindingKind::Sxid, f.pci))
                .or_default();
            t.findings += 1;
            t.worst = t.worst.max(Some(f.severity));
            *t.by_what.entry((f.kind, f.xid)).or_default() += 1;
            if !f.gpu.is_empty() && t.gpu != f.gpu {
                t.gpu = f.gpu.clone();
            }
        }
        if self.closed || !self.json {
            return;
        }
        if self.file_json.0 != file {
            self.file_json.0 = file.to_string();
            self.file_json.1.clear();
            super::json::string(&mut self.file_json.1, file);
        }
        super::json::write_finding_from(&mut self.line, &self.file_json.1, f);
        if self.line.len() >= JSON_CHUNK {
            self.flush_json();
        }
    }

    /// Hands the findings written so far to `out`; before anything else is written there, and
    /// at the end.
    fn flush_json(&mut self) {
        if !self.line.is_empty() && !self.closed && self.out.write_all(&self.line).is_err() {
            self.closed = true;
        }
        self.line.clear();
    }

    /// With `--runbooks`: a subject for each incident's cause, as the daemon runs a runbook per
    /// incident. A finding folded into another's incident (the Xid 45 cleanup after an Xid 79, an
    /// echo) is evidence of that fault, not a fault of its own, and runs nothing by itself.
    fn subjects_from(&mut self, incidents: &[Incident]) {
        let Some(subjects) = self.subjects.as_mut() else {
            return;
        };
        for f in incidents.iter().filter_map(|i| i.findings.first()) {
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
    }

    /// Prints one input's incidents, one block each.
    fn incidents(&mut self, file: &str, incidents: &[Incident]) {
        for inc in incidents {
            if self.closed {
                return;
            }
            let Some(cause) = inc.findings.first() else {
                continue;
            };
            let loc = format!("{file}:{}", cause.origin.line);
            if writeln!(self.out, "{}", render::incident_block(inc, &loc)).is_err() {
                self.closed = true;
            }
        }
    }

    fn summary(&mut self, files: usize) {
        if self.json || self.closed {
            return;
        }
        let total: u64 = self.counts.iter().sum();
        let inputs = |n: usize| format!("{n} input{}", if n == 1 { "" } else { "s" });
        let mut s = String::new();
        if total == 0 {
            if self.failed == 0 && self.unread_lines > 0 {
                s.push_str(&format!(
                    "No GPU faults found in what could be read; {} line(s) could not be read (see the errors above), so faults may be missing.\n",
                    self.unread_lines
                ));
            } else if self.failed == 0 {
                s.push_str(&format!("No GPU faults found in {}.\n", inputs(files)));
            } else if self.failed == files {
                // Nothing was read: saying "no faults found" would be a false all-clear.
                s.push_str(&format!(
                    "Nothing scanned: {} could not be read.\n",
                    inputs(self.failed)
                ));
            } else {
                // Never "no faults" for what could not be read.
                s.push_str(&format!(
                    "No GPU faults found in what could be read; {} of {} could not be read to the end (see the errors above), so faults may be missing.\n",
                    inputs(self.failed),
                    inputs(files)
                ));
            }
        } else {
            let parts: Vec<String> = [Severity::Critical, Severity::Warning, Severity::Info]
                .iter()
                .filter_map(|&sev| {
                    let n = self.counts[sev as usize];
                    (n > 0).then(|| format!("{n} {sev}"))
                })
                .collect();
            s.push_str(&format!(
                "Summary: {total} finding{} ({})\n",
                if total == 1 { "" } else { "s" },
                parts.join(", ")
            ));
            if self.failed > 0 {
                s.push_str(&format!(
                    "  ({} could not be read to the end; faults in the unread part are missing)\n",
                    inputs(self.failed)
                ));
            }
            if self.unread_lines > 0 {
                s.push_str(&format!(
                    "  ({} line(s) could not be read, see the errors above; faults in them are missing)\n",
                    self.unread_lines
                ));
            }
            // Worst first, then the busiest.
            let mut rows: Vec<(&Device, &Tally)> = self.per_gpu.iter().collect();
            rows.sort_by(|a, b| {
                (b.1.worst, b.1.findings)
                    .cmp(&(a.1.worst, a.1.findings))
                    .then(a.0.cmp(b.0))
            });
            for ((nvswitch, pci), t) in rows {
                let who = match pci {
                    Some(p) => {
                        let mut w = format!("{} {p}", if *nvswitch { "NVSwitch" } else { "GPU" });
                        if let Some(u) = &t.gpu.uuid {
                            w.push_str(&format!(" {u}"));
                        }
                        if let Some(n) = &t.gpu.serial {
                            w.push_str(&format!(" serial {n}"));
                        }
                        w
                    }
                    None => "no device named".to_string(),
                };
                let what: Vec<String> = t
                    .by_what
                    .iter()
                    .map(|((k, x), n)| format!("{} x{n}", render::what(*k, *x)))
                    .collect();
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
    let mut out = Output::new(
        io::BufWriter::with_capacity(JSON_CHUNK, io::stdout().lock()),
        args.json,
        args.runbooks.is_some(),
    );
    let runbook_config = match &args.runbooks {
        None => None,
        Some(p) => {
            let path = (p.as_os_str() != "-").then_some(p.as_path());
            match super::load_config_sending_nothing(path) {
                Ok(c) => Some(c),
                Err(code) => return Ok(code),
            }
        }
    };
    // The site's own rows: from `--config`, else from the `--runbooks` config.
    let site = match &args.config {
        Some(p) => {
            let path = (p.as_os_str() != "-").then_some(p.as_path());
            match super::load_config_sending_nothing(path) {
                Ok(c) => Some(c.site_shapes),
                Err(code) => return Ok(code),
            }
        }
        None => runbook_config.as_ref().map(|c| c.site_shapes.clone()),
    }
    .filter(|t| !t.is_empty());
    let files: Vec<PathBuf> = if args.files.is_empty() {
        vec![PathBuf::from("-")]
    } else {
        args.files.clone()
    };
    // The process's one prefilter (the classifier asks the same one, `prefix::message_start`),
    // unless the site's literals join the built-in ones: a line the prefilter drops is never read.
    let own;
    let pre = match &site {
        Some(t) => {
            own = Prefilter::with_literals(&crate::classify::prefilter::with_table_literals(
                crate::classify::prefilter::candidate_literals(),
                t.prefilter_literals().into_iter(),
            ));
            &own
        }
        None => Prefilter::shared(),
    };
    let mut failed = false;
    for path in &files {
        if !scan_one(path, pre, site.as_ref(), &mut out) {
            failed = true;
            out.failed += 1;
        }
    }
    // A line skipped for a defect may have held a fault: the exit status says an error.
    failed |= out.unread_lines > 0;
    out.flush_json();
    out.summary(files.len());
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
fn scan_one<W: Write>(
    path: &Path,
    pre: &Prefilter,
    site: Option<&std::sync::Arc<crate::classify::table::Table>>,
    out: &mut Output<W>,
) -> bool {
    let name = if path == Path::new("-") {
        "<stdin>".to_string()
    } else {
        path.display().to_string()
    };
    let mut reader = SavedLog::new(site.cloned());
    let mut findings = Vec::new();
    // Grouped for the text blocks, and for `--runbooks` (one run per incident) in either form.
    let mut grouper = (!out.json || out.subjects.is_some()).then(Grouper::new);
    let mut invalid_utf8 = 0u64;
    // Lines a reader failed on, and the first of them.
    let mut unread = (0u64, 0u64);
    let mut on_line = |line_no: u64, bytes: &[u8]| {
        let text = match std::str::from_utf8(bytes) {
            Ok(t) => std::borrow::Cow::Borrowed(t),
            Err(_) => {
                invalid_utf8 += 1;
                String::from_utf8_lossy(bytes)
            }
        };
        // A panic here can only be a defect of a reader's; it costs the line, not the rest of
        // the log (the daemon guards its lines the same way). What the line had pushed before
        // failing is dropped with it.
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            reader.line(line_no, &text, &mut findings)
        }));
        if read.is_err() {
            if unread.0 == 0 {
                unread.1 = line_no;
            }
            unread.0 += 1;
            findings.clear();
            return;
        }
        // Printed where they lie, moved out only when the grouper keeps them: a finding is a
        // few hundred bytes, and with `--json` alone each move was a copy for nothing.
        for f in &findings {
            out.emit(&name, f);
        }
        match grouper.as_mut() {
            Some(g) => findings.drain(..).for_each(|f| g.push(f)),
            None => findings.clear(),
        }
    };
    let stats = match file::scan_path(path, pre, &mut on_line) {
        Ok(stats) => stats,
        Err(e) => {
            eprintln!("xidwatch: {name}: cannot read: {e}");
            return false;
        }
    };
    reader.finish(&mut findings);
    for f in findings.drain(..) {
        out.emit(&name, &f);
        if let Some(g) = grouper.as_mut() {
            g.push(f);
        }
    }
    if let Some(g) = grouper.take() {
        let incidents = g.finish();
        out.subjects_from(&incidents);
        if !out.json {
            out.incidents(&name, &incidents);
        }
    }
    if invalid_utf8 > 0 {
        eprintln!("xidwatch: {name}: note: {invalid_utf8} candidate line(s) held invalid UTF-8; the bad bytes were replaced and the rest classified");
    }
    if unread.0 > 0 {
        eprintln!(
            "xidwatch: {name}:{}: error: xidwatch failed to read {} line(s), this the first (a defect: please report it with the line); they were skipped and the lines after them read",
            unread.1, unread.0
        );
        out.unread_lines += unread.0;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast writer prints exactly what serializing the contract type would, byte for byte,
    /// for every finding of the sample log and of the corpus of real lines.
    #[test]
    fn json_writer_matches_the_contract_type() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut texts =
            vec![std::fs::read_to_string(root.join("fixtures/logs/mixed.log")).unwrap()];
        for e in std::fs::read_dir(root.join("fixtures/corpus")).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "log") {
                let t = std::fs::read_to_string(&p).unwrap();
                texts.push(
                    t.lines()
                        .filter_map(|l| l.split_once(" | ").map(|(_, r)| r))
                        .collect::<Vec<_>>()
                        .join("\n"),
                );
            }
        }
        let mut n = 0;
        for text in texts {
            let mut log = SavedLog::default();
            let mut fs = Vec::new();
            for (i, line) in text.lines().enumerate() {
                log.line(i as u64 + 1, line, &mut fs);
            }
            log.finish(&mut fs);
            for f in &fs {
                let j = JsonFinding {
                    file: "a \"file\".log",
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
                    shape: f.shape,
                    module: f.module.as_deref(),
                    raw: &f.origin.raw,
                };
                let mut mine = Vec::new();
                super::super::json::write_finding(&mut mine, "a \"file\".log", f);
                let want = serde_json::to_string(&j).unwrap() + "\n";
                assert_eq!(String::from_utf8(mine).unwrap(), want);
                n += 1;
            }
        }
        assert!(n > 200, "{n} findings compared");
    }

    /// A line a reader fails on (the unit tests' classifier panics on a marked one, as a reader
    /// with a defect would) costs that line: the fault on the line after it is still found and
    /// printed, the failure is counted for the summary and the exit status, and what the line
    /// had pushed is not printed.
    #[test]
    fn a_line_a_reader_fails_on_costs_the_line_not_the_scan() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kern.log");
        let poison = crate::classify::POISON_FOR_TESTS;
        std::fs::write(
            &path,
            format!(
                "[  10.000000] NVRM: Xid (PCI:0000:17:00): 48, pid=3112, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU.\n\
                 [  10.100000] NVRM: {poison}\n\
                 [  10.200000] NVRM: Xid (PCI:0000:2a:00): 79, pid=2207, name=python3, GPU has fallen off the bus.\n"
            ),
        )
        .unwrap();
        let mut out = Output::new(io::BufWriter::new(Vec::new()), true, false);
        assert!(scan_one(&path, Prefilter::shared(), None, &mut out));
        out.flush_json();
        assert_eq!(out.unread_lines, 1);
        let printed = String::from_utf8(out.out.into_inner().unwrap()).unwrap();
        let xids: Vec<u64> = printed
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["xid"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(xids, [48, 79], "{printed}");
        assert!(!printed.contains(poison));
    }
}
