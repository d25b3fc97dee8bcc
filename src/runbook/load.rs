//! From runbook files to checked [`Runbook`]s. Every problem is collected and reported with its
//! file, step and line; a runbook with one refused step is refused whole.

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::model::{Category, FindingKind, Severity};

use super::excerpt::{KmsgSpec, Window};
use super::format::{KmsgFile, LimitsFile, MatchFile, RunbookFile, StepFile};
use super::matcher::MatchRule;
use super::nvml::NvmlQuery;
use super::safety::{self, Catalog};
use super::template::Template;
use super::{Action, Limits, LoadError, LoadErrorKind, Runbook, RunbookSet, Step, StepRef};

/// Runbook files larger than this are refused unread.
const MAX_FILE_BYTES: u64 = 1024 * 1024;
const MAX_STEPS: usize = 64;
const MAX_TIMEOUT_SECS: f64 = 600.0;
const MAX_BUDGET_SECS: f64 = 3600.0;
const MAX_OUTPUT_BYTES: u64 = 16 * 1024 * 1024;
const MAX_CONCURRENCY: u64 = 32;
const MAX_KMSG_LINES: u64 = 10_000;
const MAX_KMSG_SECS: u64 = 86_400;

/// Every runbook that loaded, and every problem. A runbook with a problem is not in the set.
pub(super) fn load_dirs(dirs: &[PathBuf], catalog: &Catalog) -> (RunbookSet, Vec<LoadError>) {
    let mut errors = Vec::new();
    let mut loaded = Vec::new();
    for dir in dirs {
        if dir.as_os_str() == super::EMBEDDED_DIR {
            for (name, text) in super::EMBEDDED {
                let path = dir.join(name);
                match parse_runbook(&path, text, catalog) {
                    Ok(rb) => loaded.push(rb),
                    Err(es) => errors.extend(es),
                }
            }
            continue;
        }
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) => {
                errors.push(io_error(
                    dir,
                    format!("cannot read the runbook directory: {e}"),
                ));
                continue;
            }
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension().is_some_and(|x| x == "toml")
                    && !p
                        .file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with('.'))
            })
            .collect();
        files.sort();
        for path in files {
            match read_capped(&path) {
                Ok(text) => match parse_runbook(&path, &text, catalog) {
                    Ok(rb) => loaded.push(rb),
                    Err(es) => errors.extend(es),
                },
                Err(e) => errors.push(e),
            }
        }
    }
    assemble(loaded, errors)
}

/// Builds the set: later runbooks replace earlier ones of the same name; at most one fallback.
pub(super) fn assemble(
    loaded: Vec<Runbook>,
    mut errors: Vec<LoadError>,
) -> (RunbookSet, Vec<LoadError>) {
    let mut runbooks: BTreeMap<String, Runbook> = BTreeMap::new();
    for mut rb in loaded {
        if let Some(old) = runbooks.remove(&rb.name) {
            rb.overrides = old.overrides;
            rb.overrides.push(old.path);
        }
        runbooks.insert(rb.name.clone(), rb);
    }
    // One fallback: the first by name stays, any other is reported and left out.
    let fallbacks: Vec<String> = runbooks
        .values()
        .filter(|r| r.fallback)
        .map(|r| r.name.clone())
        .collect();
    if let [first, rest @ ..] = fallbacks.as_slice() {
        let kept = runbooks
            .get(first)
            .map(|r| r.path.clone())
            .unwrap_or_default();
        for name in rest {
            if let Some(rb) = runbooks.remove(name) {
                errors.push(LoadError {
                    path: rb.path,
                    step: None,
                    line: None,
                    kind: LoadErrorKind::Conflict,
                    message: format!(
                        "a second fallback runbook: {} is already the fallback; only one may be",
                        kept.display()
                    ),
                });
            }
        }
    }
    (RunbookSet { runbooks }, errors)
}

fn io_error(path: &Path, message: String) -> LoadError {
    LoadError {
        path: path.to_path_buf(),
        step: None,
        line: None,
        kind: LoadErrorKind::Io,
        message,
    }
}

fn read_capped(path: &Path) -> Result<String, LoadError> {
    let meta = std::fs::metadata(path).map_err(|e| io_error(path, format!("cannot read: {e}")))?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(io_error(
            path,
            format!(
                "{} bytes is too large for a runbook (limit {MAX_FILE_BYTES})",
                meta.len()
            ),
        ));
    }
    std::fs::read_to_string(path).map_err(|e| io_error(path, format!("cannot read: {e}")))
}

fn line_of(text: &str, span: Range<usize>) -> usize {
    text.get(..span.start)
        .map_or(0, |t| t.matches('\n').count())
        + 1
}

/// Collects errors for one file.
struct Errors<'a> {
    path: &'a Path,
    list: Vec<LoadError>,
}

impl Errors<'_> {
    fn push(
        &mut self,
        step: Option<StepRef>,
        line: Option<usize>,
        kind: LoadErrorKind,
        message: String,
    ) {
        self.list.push(LoadError {
            path: self.path.to_path_buf(),
            step,
            line,
            kind,
            message,
        });
    }
    fn invalid(&mut self, line: Option<usize>, message: String) {
        self.push(None, line, LoadErrorKind::Invalid, message);
    }
}

pub(super) fn parse_runbook(
    path: &Path,
    text: &str,
    catalog: &Catalog,
) -> Result<Runbook, Vec<LoadError>> {
    let mut errs = Errors {
        path,
        list: Vec::new(),
    };
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default()
        .to_string();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
    {
        errs.invalid(
            None,
            format!("the file name {name:?} is the runbook's name: use lowercase letters, digits, '-' and '_'"),
        );
    }
    let file: RunbookFile = match toml::from_str(text) {
        Ok(f) => f,
        Err(e) => {
            let line = e.span().map(|s| line_of(text, s));
            // toml's message carries the line, column and the offending text.
            errs.push(
                None,
                line,
                LoadErrorKind::Syntax,
                e.to_string().trim_end().to_string(),
            );
            return Err(errs.list);
        }
    };

    let title = file.title.trim().to_string();
    if title.is_empty() || title.contains('\n') {
        errs.invalid(None, "title must be one non-empty line".into());
    }
    let meaning = file.guide.meaning.trim().to_string();
    let next_steps = file.guide.next_steps.trim().to_string();
    if meaning.is_empty() || next_steps.is_empty() {
        errs.invalid(
            None,
            "[guide] meaning and next_steps must both say something".into(),
        );
    }

    let mut rules = Vec::new();
    for m in &file.matches {
        let line = Some(line_of(text, m.span()));
        if let Some(rule) = match_rule(m.get_ref(), line, &mut errs) {
            rules.push(rule);
        }
    }
    if file.matches.is_empty() && !file.fallback {
        errs.invalid(
            None,
            "the runbook matches nothing: add a [[match]] table or set fallback = true".into(),
        );
    }

    let limits = limits(&file.limits, &mut errs);

    if file.steps.is_empty() {
        errs.invalid(None, "the runbook has no [[step]]".into());
    }
    if file.steps.len() > MAX_STEPS {
        errs.invalid(
            None,
            format!(
                "{} steps is more than the limit of {MAX_STEPS}",
                file.steps.len()
            ),
        );
    }
    let mut steps = Vec::new();
    let mut names = HashSet::new();
    for (i, s) in file.steps.iter().enumerate() {
        let line = Some(line_of(text, s.span()));
        if let Some(step) = step(i + 1, s.get_ref(), line, catalog, &mut errs) {
            if !names.insert(step.name.clone()) {
                errs.push(
                    Some(StepRef {
                        index: i + 1,
                        name: Some(step.name.clone()),
                    }),
                    line,
                    LoadErrorKind::Invalid,
                    "two steps have this name; give each a distinct `name`".into(),
                );
            }
            steps.push(step);
        }
    }

    if !errs.list.is_empty() {
        return Err(errs.list);
    }
    Ok(Runbook {
        name,
        path: path.to_path_buf(),
        title,
        fallback: file.fallback,
        priority: file.priority,
        rules,
        meaning,
        next_steps,
        limits,
        steps,
        overrides: Vec::new(),
    })
}

fn match_rule(m: &MatchFile, line: Option<usize>, errs: &mut Errors) -> Option<MatchRule> {
    let mut ok = true;
    let mut rule = MatchRule::default();
    for k in m.kinds.iter().flatten() {
        match FindingKind::parse(k) {
            Some(kind) => rule.kinds.push(kind),
            None => {
                ok = false;
                let known: Vec<&str> = FindingKind::ALL.iter().map(|k| k.as_str()).collect();
                errs.invalid(
                    line,
                    format!("unknown kind {k:?} (known: {})", known.join(", ")),
                );
            }
        }
    }
    for c in m.categories.iter().flatten() {
        match Category::parse(c) {
            Some(cat) => rule.categories.push(cat),
            None => {
                ok = false;
                let known: Vec<&str> = Category::ALL.iter().map(|c| c.as_str()).collect();
                errs.invalid(
                    line,
                    format!("unknown category {c:?} (known: {})", known.join(", ")),
                );
            }
        }
    }
    if let Some(s) = &m.min_severity {
        match Severity::parse(s) {
            Some(sev) => rule.min_severity = Some(sev),
            None => {
                ok = false;
                errs.invalid(
                    line,
                    format!("unknown severity {s:?} (info, warning, critical)"),
                );
            }
        }
    }
    rule.xids = m.xids.clone().unwrap_or_default();
    rule.sxids = m.sxids.clone().unwrap_or_default();
    if m.xids.as_ref().is_some_and(|v| v.is_empty())
        || m.sxids.as_ref().is_some_and(|v| v.is_empty())
    {
        ok = false;
        errs.invalid(line, "an empty xids or sxids list matches nothing".into());
    }
    if !rule.xids.is_empty() && !rule.sxids.is_empty() {
        ok = false;
        errs.invalid(
            line,
            "one [[match]] cannot hold both xids and sxids: use two tables".into(),
        );
    }
    let needs = |kind: FindingKind, list_empty: bool| {
        list_empty || rule.kinds.is_empty() || rule.kinds.contains(&kind)
    };
    if !needs(FindingKind::Xid, rule.xids.is_empty())
        || !needs(FindingKind::Sxid, rule.sxids.is_empty())
    {
        ok = false;
        errs.invalid(
            line,
            "xids only match kind \"xid\" and sxids kind \"sxid\": this table can never match"
                .into(),
        );
    }
    if rule.is_empty() && ok {
        ok = false;
        errs.invalid(
            line,
            "an empty [[match]] would match everything: use fallback = true for that".into(),
        );
    }
    ok.then_some(rule)
}

fn secs(v: Option<f64>, key: &str, max: f64, errs: &mut Errors) -> Option<Duration> {
    let v = v?;
    if !(v.is_finite() && v > 0.0 && v <= max) {
        errs.invalid(
            None,
            format!("{key} = {v}: give seconds above 0 and at most {max}"),
        );
        return None;
    }
    Some(Duration::from_secs_f64(v))
}

fn bytes(v: Option<u64>, key: &str, errs: &mut Errors) -> Option<usize> {
    let v = v?;
    if v == 0 || v > MAX_OUTPUT_BYTES {
        errs.invalid(
            None,
            format!("{key} = {v}: give 1 to {MAX_OUTPUT_BYTES} bytes"),
        );
        return None;
    }
    usize::try_from(v).ok()
}

fn limits(l: &LimitsFile, errs: &mut Errors) -> Limits {
    let d = Limits::default();
    let concurrency = match l.concurrency {
        Some(c) if c == 0 || c > MAX_CONCURRENCY => {
            errs.invalid(
                None,
                format!("concurrency = {c}: give 1 to {MAX_CONCURRENCY}"),
            );
            d.concurrency
        }
        Some(c) => c as usize,
        None => d.concurrency,
    };
    Limits {
        budget: secs(l.budget_secs, "budget_secs", MAX_BUDGET_SECS, errs).unwrap_or(d.budget),
        step_timeout: secs(
            l.step_timeout_secs,
            "step_timeout_secs",
            MAX_TIMEOUT_SECS,
            errs,
        )
        .unwrap_or(d.step_timeout),
        max_output_bytes: bytes(l.max_output_bytes, "max_output_bytes", errs)
            .unwrap_or(d.max_output_bytes),
        concurrency,
    }
}

fn step(
    index: usize,
    s: &StepFile,
    line: Option<usize>,
    catalog: &Catalog,
    errs: &mut Errors,
) -> Option<Step> {
    // Errors name the step by its `name`, or else by what it runs or reads.
    let label = s.name.clone().or_else(|| {
        let words = s.run.as_ref().or(s.read.as_ref().map(|r| &r.0))?;
        Some(shorten(words.join(" ")))
    });
    let at = || {
        Some(StepRef {
            index,
            name: label.clone(),
        })
    };
    let given = [
        s.run.is_some(),
        s.read.is_some(),
        s.kmsg.is_some(),
        s.nvml.is_some(),
    ]
    .iter()
    .filter(|x| **x)
    .count();
    if given != 1 {
        errs.push(
            at(),
            line,
            LoadErrorKind::Invalid,
            "a step needs exactly one of run, read, kmsg or nvml".into(),
        );
        return None;
    }
    let fail = |errs: &mut Errors, kind: LoadErrorKind, msg: String| {
        errs.push(at(), line, kind, msg);
        None
    };
    let parse_all = |items: &[String]| -> Result<Vec<Template>, String> {
        items
            .iter()
            .map(|t| Template::parse(t).map_err(|e| format!("{t:?}: {e}")))
            .collect()
    };
    let mut pattern = None;
    let action = if let Some(argv) = &s.run {
        let argv = match parse_all(argv) {
            Ok(a) => a,
            Err(e) => return fail(errs, LoadErrorKind::Invalid, e),
        };
        match catalog.check_run(&argv) {
            Ok(p) => pattern = Some(p),
            Err(r) => return fail(errs, LoadErrorKind::Refused(r.rule), r.reason),
        }
        Action::Run(argv)
    } else if let Some(paths) = &s.read {
        if paths.0.is_empty() || paths.0.len() > 32 {
            return fail(
                errs,
                LoadErrorKind::Invalid,
                "read needs 1 to 32 paths".into(),
            );
        }
        let paths = match parse_all(&paths.0) {
            Ok(p) => p,
            Err(e) => return fail(errs, LoadErrorKind::Invalid, e),
        };
        for p in &paths {
            if let Err(r) = safety::check_read(p) {
                return fail(errs, LoadErrorKind::Refused(r.rule), r.reason);
            }
        }
        Action::Read(paths)
    } else if let Some(k) = &s.kmsg {
        match kmsg(k) {
            Ok(spec) => Action::Kmsg(spec),
            Err(e) => return fail(errs, LoadErrorKind::Invalid, e),
        }
    } else {
        let q = s.nvml.as_deref().unwrap_or_default();
        match NvmlQuery::parse(q) {
            Some(q) => Action::Nvml(q),
            None => {
                let known: Vec<&str> = NvmlQuery::ALL.iter().map(|q| q.as_str()).collect();
                return fail(
                    errs,
                    LoadErrorKind::Invalid,
                    format!("unknown nvml query {q:?} (known: {})", known.join(", ")),
                );
            }
        }
    };
    let before = errs.list.len();
    let timeout = secs(s.timeout_secs, "timeout_secs", MAX_TIMEOUT_SECS, errs);
    let max_output_bytes = bytes(s.max_output_bytes, "max_output_bytes", errs);
    for e in &mut errs.list[before..] {
        e.step = at();
        e.line = line;
    }
    let name = match &s.name {
        Some(n) if !n.trim().is_empty() && !n.contains('\n') => n.trim().to_string(),
        Some(_) => {
            return fail(
                errs,
                LoadErrorKind::Invalid,
                "a step name must be one non-empty line".into(),
            )
        }
        None => default_name(&action),
    };
    Some(Step {
        name,
        action,
        timeout,
        max_output_bytes,
        pattern,
    })
}

fn default_name(a: &Action) -> String {
    let words = match a {
        Action::Run(ts) | Action::Read(ts) => ts.iter().map(|t| t.to_string()).collect(),
        Action::Kmsg(_) => vec!["kernel log".to_string()],
        Action::Nvml(q) => vec![format!("nvml {q}")],
    };
    shorten(words.join(" "))
}

/// At most 80 bytes, for a name.
fn shorten(mut s: String) -> String {
    if s.len() > 80 {
        let mut cut = 77;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

fn kmsg(k: &KmsgFile) -> Result<KmsgSpec, String> {
    let lines = k.lines_before.is_some() || k.lines_after.is_some();
    let secs = k.seconds_before.is_some() || k.seconds_after.is_some();
    let window = match (lines, secs) {
        (true, true) => {
            return Err(
                "kmsg takes lines_before/lines_after or seconds_before/seconds_after, not both"
                    .into(),
            )
        }
        (false, false) => {
            return Err(
                "kmsg needs lines_before/lines_after or seconds_before/seconds_after".into(),
            )
        }
        (true, false) => {
            let (b, a) = (k.lines_before.unwrap_or(0), k.lines_after.unwrap_or(0));
            if b > MAX_KMSG_LINES || a > MAX_KMSG_LINES {
                return Err(format!(
                    "kmsg windows are limited to {MAX_KMSG_LINES} lines"
                ));
            }
            Window::Lines {
                before: b as usize,
                after: a as usize,
            }
        }
        (false, true) => {
            let (b, a) = (k.seconds_before.unwrap_or(0), k.seconds_after.unwrap_or(0));
            if b > MAX_KMSG_SECS || a > MAX_KMSG_SECS {
                return Err(format!(
                    "kmsg windows are limited to {MAX_KMSG_SECS} seconds"
                ));
            }
            Window::Seconds {
                before: b,
                after: a,
            }
        }
    };
    if k.grep.iter().any(|g| g.is_empty()) {
        return Err("an empty grep string matches every line; remove it".into());
    }
    Ok(KmsgSpec {
        window,
        grep: k.grep.clone(),
        this_gpu: k.this_gpu,
    })
}
