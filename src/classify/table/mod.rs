//! Shapes as data: line shapes written as table rows rather than as Rust.
//!
//! A row says which literal finds its lines, the pattern (a regex with typed slots such as
//! `{pci}` or `{pid}`) that reads them, and the finding they make: kind, severity, category and
//! title, whether explanation lines that follow fold into it, and real example lines that are its
//! tests. The built-in rows live in `shapes.toml` next to this module, compiled into the binary
//! and parsed once; a site adds or silences wordings with rows of the same form in its
//! configuration (`[[classify.shape]]`, `[[classify.silence]]`), which the configuration builds
//! into a [`Table`] and hands to the classifier.
//!
//! Rust keeps what a table cannot say well: the Xid, SXid and AER parsers (hot, and read without
//! backtracking), the multi-line machines (crash reports, hung tasks, API mismatch), the
//! nvidia-smi table, and the generic error-word verdict.
//!
//! Matching never runs every row's pattern: one Aho-Corasick search over the rows' literals
//! finds the rows whose literal the text holds, and only their patterns run, in row order.

mod pattern;
#[cfg(test)]
mod tests;

use std::sync::OnceLock;

use aho_corasick::AhoCorasick;
use regex::Regex;
use serde::Deserialize;

use crate::classify::shape_id;
use crate::model::{intern, Category, FindingKind, PciAddress, Severity};
pub use pattern::{Slot, SLOT_NAMES};

/// The built-in rows, as written.
const BUILTIN: &str = include_str!("../shapes.toml");

/// Where a row's pattern is matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    /// The message as the prefix split left it (trimmed); a site row matches anywhere in it.
    None,
    /// The body of an `NVRM: ` message after its `GPU 0000:17:00.0: ` or `GPU6 ` prefix; the
    /// prefix's address is the finding's when the pattern names none.
    Nvrm,
}

/// What follows a row's line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fold {
    /// The driver's explanation lines (`NVRM: ` lines that are no message of their own) fold in.
    Explain,
}

/// One row as written, in `shapes.toml` or under `[[classify.shape]]` / `[[classify.silence]]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RowSpec {
    pub id: Option<String>,
    pub literal: String,
    pub pattern: String,
    /// `"NVRM"`: the pattern reads the body of an `NVRM: ` message (built-in rows).
    pub tag: Option<String>,
    /// The literal starts a message wherever it is in a saved line (a line with no driver tag).
    pub anchor: bool,
    /// A driver literal every line of the row holds before its own literal (`"nvidia"` for the
    /// installer's texts about the modules, all of whose names start with it): the prefilter finds
    /// the row's lines by it, and the row's literal only starts the message. A literal of common
    /// words (`kernel module failed to build`) searched on its own costs every line of every log;
    /// under a literal already searched it costs nothing, and lines without it (another vendor's
    /// module) are not read. Built-in rows only.
    pub found_by: Option<String>,
    pub kind: Option<String>,
    pub severity: Option<String>,
    pub category: Option<String>,
    pub title: Option<String>,
    /// `"explain"`: the driver's explanation lines that follow fold into the finding.
    pub fold: Option<String>,
    /// The line is known harmless: nothing is reported for it.
    pub silence: bool,
    pub examples: Vec<String>,
}

/// The driver literals a row may be found by (`found_by`): each is one the prefilter searches on
/// its own (a test in the prefilter holds it to its hand literals; the table does not import the
/// prefilter, which is built from it).
pub const FOUND_BY: &[&str] = &["nvidia", "(EE)", "NVRM", "NVML"];

/// A compiled row.
#[derive(Debug)]
pub struct Row {
    pub id: &'static str,
    pub literal: &'static str,
    pub tag: Tag,
    pub anchor: bool,
    /// See [`RowSpec::found_by`].
    pub found_by: Option<&'static str>,
    pub silence: bool,
    pub kind: FindingKind,
    pub severity: Severity,
    pub category: Category,
    pub fold: Option<Fold>,
    pub examples: Vec<String>,
    /// The expanded pattern, compiled on first use ([`Row::re`]): a scan of a small file does not
    /// pay for compiling rows its lines never reach. Site rows are compiled when checked.
    source: String,
    re: OnceLock<Option<Regex>>,
    /// The pattern's slots, by capture group (group `i + 1` is slot `i`).
    slots: Vec<Slot>,
    title: Vec<pattern::Part>,
}

/// What a row read from a line: the finding's fields, owned (a site table may be replaced by a
/// reload while a finding that one of its rows made is still pending).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowMatch {
    pub id: &'static str,
    pub silence: bool,
    pub kind: FindingKind,
    pub severity: Severity,
    pub category: Category,
    pub title: String,
    /// The `{text}` slot, or for an untagged row the whole message; `None`: the message as the
    /// classifier words any `NVRM: ` line.
    pub message: Option<String>,
    pub pci: Option<PciAddress>,
    pub pid: Option<u32>,
    pub xid: Option<u32>,
    pub gpu: Option<u32>,
    /// The `{module}` slot: with the row's id, the key of an incident that names no GPU.
    pub module: Option<String>,
    pub fold: Option<Fold>,
}

/// A set of rows and the one search that finds their candidates.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Row>,
    /// Over the rows' distinct literals; `None` for an empty table.
    finder: Option<AhoCorasick>,
    /// Per literal of `finder`: the rows (indices into `rows`) it finds.
    by_literal: Vec<Vec<usize>>,
    /// The literals (indices into `by_literal`) all of whose rows match only where the message
    /// starts with the literal ([`starts_with_literal`]), by the literal's first byte: a message
    /// is asked about those by comparing its start, not by a search through it.
    leading: Vec<Vec<usize>>,
    /// Over the other literals, which a row's match may hold anywhere; `None` when there are none.
    anywhere: Option<AhoCorasick>,
    /// Per literal of `anywhere`: its index in `by_literal`.
    anywhere_literal: Vec<usize>,
}

/// A refused row, named by its key (`classify.shape[2].pattern`): the configuration's own kind
/// of refusal.
pub use crate::model::ConfigIssue as RowError;

impl Table {
    /// Compiles rows. `key` names them in errors (`classify.shape`): row `i`'s field `f` is
    /// `key[i].f`. Every example line must be read by its own row (not by an earlier one, and
    /// not missed), so a row that does not do what its examples say is refused here.
    pub fn build(specs: &[RowSpec], key: &str) -> Result<Table, RowError> {
        Table::build_parts(&[(specs, key)], true)
    }

    /// A site's rows: its silences first (a line an operator silenced stays silent whatever else
    /// reads it), then its shapes.
    pub fn build_site(shapes: &[RowSpec], silences: &[RowSpec]) -> Result<Table, RowError> {
        // A site row reads the whole message, wherever its pattern matches: the built-in rows'
        // `tag` and `anchor` say where in a line the built-in shapes look, which a site row
        // does not need.
        for (key, rows) in [("classify.shape", shapes), ("classify.silence", silences)] {
            for (i, r) in rows.iter().enumerate() {
                let field = match (&r.tag, r.anchor, &r.found_by) {
                    (Some(_), _, _) => "tag",
                    (None, true, _) => "anchor",
                    (None, false, Some(_)) => "found_by",
                    (None, false, None) => continue,
                };
                return Err(RowError {
                    key: format!("{key}[{i}].{field}"),
                    message: "is for the built-in rows; a site row's pattern is matched anywhere in the message".into(),
                });
            }
        }
        // A site row's findings are grouped and advised by its id: a built-in shape's id would
        // merge them into that shape's incidents.
        for (key, rows) in [("classify.shape", shapes), ("classify.silence", silences)] {
            for (i, r) in rows.iter().enumerate() {
                if let Some(id) = r.id.as_deref().filter(|id| Table::is_builtin_id(id.trim())) {
                    return Err(RowError {
                        key: format!("{key}[{i}].id"),
                        message: format!("\"{id}\" is the id of a built-in shape; a site row needs its own (such as \"site.ib-link-flap\")"),
                    });
                }
            }
        }
        let silences: Vec<RowSpec> = silences
            .iter()
            .map(|s| RowSpec {
                silence: true,
                ..s.clone()
            })
            .collect();
        Table::build_parts(
            &[(&silences, "classify.silence"), (shapes, "classify.shape")],
            true,
        )
    }

    /// Rows from several lists, in order; each list's rows are named `key[i]` in errors. With
    /// `checked`, every pattern is compiled and every example read now.
    fn build_parts(parts: &[(&[RowSpec], &str)], checked: bool) -> Result<Table, RowError> {
        let mut rows = Vec::new();
        let mut names: Vec<String> = Vec::new();
        for (specs, key) in parts {
            for (i, spec) in specs.iter().enumerate() {
                let err = |field: &str, message: String| RowError {
                    key: format!("{key}[{i}].{field}"),
                    message,
                };
                let row = compile(spec, i, key, checked, &err)?;
                if rows.iter().any(|r: &Row| r.id == row.id) {
                    return Err(err(
                        "id",
                        format!("{:?} is the id of an earlier row", row.id),
                    ));
                }
                rows.push(row);
                names.push(format!("{key}[{i}]"));
            }
        }
        let table = Table::index(rows);
        if !checked {
            return Ok(table);
        }
        for (i, row) in table.rows.iter().enumerate() {
            for (j, ex) in row.examples.iter().enumerate() {
                let err = |message: String| RowError {
                    key: format!("{}.examples[{j}]", names[i]),
                    message,
                };
                if !ex.contains(row.literal) {
                    return Err(err(format!("does not hold the literal {:?}", row.literal)));
                }
                if let Some(f) = row.found_by.filter(|f| !ex.contains(f)) {
                    return Err(err(format!(
                        "does not hold {f:?}, which finds the row's lines"
                    )));
                }
                match table.read_example(ex, row) {
                    Some((k, _)) if k == i => {}
                    Some((k, _)) => {
                        return Err(err(format!(
                            "is read by the earlier row {:?}, not by this one",
                            table.rows[k].id
                        )))
                    }
                    None => return Err(err("does not match the pattern".into())),
                }
            }
        }
        Ok(table)
    }

    fn index(rows: Vec<Row>) -> Table {
        let mut literals: Vec<&'static str> = Vec::new();
        let mut by_literal: Vec<Vec<usize>> = Vec::new();
        for (i, r) in rows.iter().enumerate() {
            match literals.iter().position(|l| *l == r.literal) {
                Some(k) => by_literal[k].push(i),
                None => {
                    literals.push(r.literal);
                    by_literal.push(vec![i]);
                }
            }
        }
        // Standard (overlapping) semantics: every literal the text holds is found, even where
        // one literal is part of another. A contiguous NFA, not the DFA the default would build
        // for this many literals: it searches single candidate lines, where the two run alike,
        // and the DFA's construction was a fiftieth of scanning an ordinary 350 MB log.
        let build = |literals: &[&'static str]| {
            (!literals.is_empty())
                .then(|| {
                    AhoCorasick::builder()
                        .kind(Some(aho_corasick::AhoCorasickKind::ContiguousNFA))
                        .build(literals)
                        .ok()
                })
                .flatten()
        };
        let finder = build(&literals);
        // Most rows read a message that starts with their literal (`^nvidia-modeset: ...`): such
        // a literal is looked for at the message's start only. The search through the message
        // for every literal was most of what reading a driver banner cost (every `nvidia-uvm:`
        // and `nvidia-modeset:` line holds `nvidia-`).
        let mut leading = vec![Vec::new(); 256];
        let mut anywhere = Vec::new();
        let mut anywhere_literal = Vec::new();
        for (k, lit) in literals.iter().enumerate() {
            let first = lit.as_bytes().first().copied();
            match first {
                Some(b)
                    if by_literal[k]
                        .iter()
                        .all(|&i| starts_with_literal(&rows[i].source, lit)) =>
                {
                    leading[usize::from(b)].push(k);
                }
                _ => {
                    anywhere.push(*lit);
                    anywhere_literal.push(k);
                }
            }
        }
        Table {
            finder,
            anywhere: build(&anywhere),
            anywhere_literal,
            leading,
            rows,
            by_literal,
        }
    }

    /// Literal `k` of `by_literal` (the literal of its rows).
    fn literal(&self, k: usize) -> &'static str {
        self.by_literal[k]
            .first()
            .map_or("", |&i| self.rows[i].literal)
    }

    /// The built-in rows, parsed and checked on first use.
    pub fn builtin() -> &'static Table {
        static T: OnceLock<Table> = OnceLock::new();
        T.get_or_init(|| {
            // The file is part of the binary and its tests build it: a bad row is a build-time
            // mistake, and the classifier carries on without the table rather than stop.
            Table::parse_builtin_with(false).unwrap_or_else(|e| {
                debug_assert!(false, "shapes.toml: {e}");
                Table::default()
            })
        })
    }

    /// Parses `shapes.toml` and checks every row against its examples (the tests do; the
    /// classifier's own copy skips the examples, which cost start-up time on every run).
    pub fn parse_builtin() -> Result<Table, RowError> {
        Table::parse_builtin_with(true)
    }

    fn parse_builtin_with(checked: bool) -> Result<Table, RowError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct File {
            shape: Vec<RowSpec>,
        }
        let file: File = toml::from_str(BUILTIN).map_err(|e| RowError {
            key: "shapes.toml".into(),
            message: e.message().to_string(),
        })?;
        Table::build_parts(&[(&file.shape, "shape")], checked)
    }

    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Whether `id` names a built-in shape: one Rust reads ([`shape_id`]) or a row of
    /// `shapes.toml`.
    pub fn is_builtin_id(id: &str) -> bool {
        shape_id::ALL.contains(&id) || Table::builtin().has_id(id)
    }

    /// Whether a row of this table has the id `id`.
    pub fn has_id(&self, id: &str) -> bool {
        self.rows.iter().any(|r| r.id == id)
    }

    /// What the prefilter must find for each row, each once: an `NVRM` row's lines hold the tag,
    /// which finds them (its own literal only picks the row); an untagged row's, its literal.
    pub fn prefilter_literals(&self) -> Vec<&'static str> {
        distinct(self.rows.iter().map(Row::prefilter_literal))
    }

    /// The literals of the untagged rows that start a message wherever they are in a saved line
    /// (message-start anchors for lines with no driver tag), in row order.
    pub fn anchors(&self) -> Vec<&'static str> {
        distinct(
            self.rows
                .iter()
                .filter(|r| r.anchor && r.tag == Tag::None)
                .map(|r| r.literal),
        )
    }

    /// The first row (in row order) of tag `tag` whose literal `text` holds and whose pattern
    /// matches it. `gpu_prefix` is the address an `NVRM: GPU ...: ` prefix named.
    pub fn read(&self, text: &str, tag: Tag, gpu_prefix: Option<PciAddress>) -> Option<RowMatch> {
        let (i, caps) = self.find(text, tag)?;
        Some(self.rows[i].read(text, &caps, gpu_prefix))
    }

    /// Where a row's pattern starts in `line`, for a line in which no built-in message starts:
    /// the earliest match of the rows whose literal it holds.
    pub fn message_start(&self, line: &str) -> Option<usize> {
        let finder = self.finder.as_ref()?;
        let mut best: Option<usize> = None;
        for m in finder.find_overlapping_iter(line) {
            for &i in &self.by_literal[m.pattern().as_usize()] {
                if let Some(at) = self.rows[i]
                    .re()
                    .and_then(|r| r.find(line))
                    .map(|m| m.start())
                {
                    best = Some(best.map_or(at, |b| b.min(at)));
                }
            }
        }
        best
    }

    fn find<'t>(&self, text: &'t str, tag: Tag) -> Option<(usize, regex::Captures<'t>)> {
        // Candidate rows, in row order: a few at most, so a sorted small vector.
        let mut cand: Vec<usize> = Vec::new();
        let mut add = |k: usize| {
            for &i in &self.by_literal[k] {
                if let Err(at) = cand.binary_search(&i) {
                    cand.insert(at, i);
                }
            }
        };
        if let Some(&b) = text.as_bytes().first() {
            for &k in &self.leading[usize::from(b)] {
                if text.as_bytes().starts_with(self.literal(k).as_bytes()) {
                    add(k);
                }
            }
        }
        if let Some(anywhere) = &self.anywhere {
            for m in anywhere.find_overlapping_iter(text) {
                add(self.anywhere_literal[m.pattern().as_usize()]);
            }
        }
        // Whether a row matches is asked before its groups: a line holding a row's literal
        // mostly does not match its pattern (every `nvidia-uvm:` line holds `nvidia-`), and
        // the match test runs without the groups' allocation and slot machinery.
        cand.into_iter()
            .filter(|&i| self.rows[i].tag == tag)
            .find_map(|i| {
                let re = self.rows[i].re()?;
                if !re.is_match(text) {
                    return None;
                }
                re.captures(text).map(|c| (i, c))
            })
    }

    /// Reads an example line of `row` as the classifier would: the message after any saved-line
    /// prefix (for a pattern anchored with `^`, from the row's literal on), and for an `NVRM` row
    /// its body.
    fn read_example(&self, ex: &str, row: &Row) -> Option<(usize, RowMatch)> {
        let tag = row.tag;
        let text = match tag {
            Tag::None if row.source.starts_with('^') => {
                let at = ex.find(row.literal)?;
                ex[at..].trim()
            }
            Tag::None => ex.trim(),
            Tag::Nvrm => {
                let at = ex.find("NVRM: ")?;
                let body = ex[at + "NVRM: ".len()..].trim_end();
                split_gpu_prefix(body).1
            }
        };
        let (i, caps) = self.find(text, tag)?;
        Some((i, self.rows[i].read(text, &caps, None)))
    }

    /// The rows whose pattern does not compile in this build, with the reason. The regex crate's
    /// features are unified with the dev-dependencies' in a test build, so a row can compile in
    /// every test and read nothing in the shipped binary (a case-insensitive group without the
    /// `unicode-case` feature did): `xidwatch check` runs this in the binary itself, and CI runs
    /// that check on the release build.
    pub fn uncompiled(&self) -> Vec<(&'static str, String)> {
        self.rows
            .iter()
            .filter_map(|r| {
                pattern::build(&r.source, r.slots.len())
                    .err()
                    .map(|e| (r.id, e))
            })
            .collect()
    }
}

impl Row {
    /// The compiled pattern; `None` only for a built-in row whose pattern does not compile, which
    /// its tests and `xidwatch check` rule out (such a row then reads nothing rather than stop
    /// the classifier).
    fn re(&self) -> Option<&Regex> {
        self.re
            .get_or_init(|| pattern::build(&self.source, self.slots.len()).ok())
            .as_ref()
    }

    /// The literal the prefilter finds this row's lines by.
    pub fn prefilter_literal(&self) -> &'static str {
        match (self.tag, self.found_by) {
            (Tag::Nvrm, _) => "NVRM",
            (Tag::None, Some(f)) => f,
            (Tag::None, None) => self.literal,
        }
    }

    fn read(
        &self,
        text: &str,
        caps: &regex::Captures<'_>,
        gpu_prefix: Option<PciAddress>,
    ) -> RowMatch {
        let value = |slot: Slot| {
            self.slots
                .iter()
                .enumerate()
                .filter(|(_, s)| **s == slot)
                .find_map(|(g, _)| caps.get(g + 1))
                .map(|m| m.as_str())
        };
        let num = |slot: Slot| value(slot).and_then(|v| v.parse::<u32>().ok());
        let pci = value(Slot::Pci)
            .and_then(|v| PciAddress::parse(v).ok())
            .or(gpu_prefix);
        let message = value(Slot::Text)
            .map(|t| t.trim_end().to_string())
            .or_else(|| (self.tag == Tag::None).then(|| text.trim().to_string()));
        let mut title = String::new();
        for part in &self.title {
            match part {
                pattern::Part::Text(t) => title.push_str(t),
                pattern::Part::Slot(s) => {
                    let v = value(*s).unwrap_or("(not in the log)");
                    // A word is unbounded in the pattern ([`pattern::WORD_MAX`]).
                    title.push_str(match s {
                        Slot::Word => crate::classify::trim::chars(v, pattern::WORD_MAX),
                        _ => v,
                    });
                }
            }
        }
        RowMatch {
            module: value(Slot::Module).map(str::to_string),
            id: self.id,
            silence: self.silence,
            kind: self.kind,
            severity: self.severity,
            category: self.category,
            title,
            message,
            pci,
            pid: num(Slot::Pid),
            xid: num(Slot::Xid),
            gpu: num(Slot::Gpu),
            fold: self.fold,
        }
    }
}

/// Whether every match of the regex `pattern` starts where `literal` does, at the start of the
/// text: the pattern is `^` and then the literal's characters (the regex syntax's own escaped),
/// with no quantifier on the last of them and no alternation outside a group. Conservative: a
/// pattern it cannot tell about is read as holding its literal anywhere, which is always right.
pub(crate) fn starts_with_literal(pattern: &str, literal: &str) -> bool {
    let Some(mut p) = pattern.strip_prefix('^') else {
        return false;
    };
    if literal.is_empty() {
        return false;
    }
    for c in literal.chars() {
        let mut it = p.chars();
        let ok = match it.next() {
            // An escaped character stands for itself only when it is no letter or digit (`\d`,
            // `\w` and `\b` are classes and assertions).
            Some('\\') => it.next().is_some_and(|e| e == c && !e.is_alphanumeric()),
            Some(x) => x == c && !"\\.+*?()|[]{}^$".contains(x),
            None => false,
        };
        if !ok {
            return false;
        }
        p = it.as_str();
    }
    !p.starts_with(['?', '*', '+', '{']) && !alternation_outside_groups(pattern)
}

/// Whether `pattern` has a `|` outside every group and class.
fn alternation_outside_groups(pattern: &str) -> bool {
    let mut depth = 0usize;
    let mut class = false;
    let mut it = pattern.chars();
    while let Some(c) = it.next() {
        match c {
            '\\' => {
                it.next();
            }
            ']' if class => class = false,
            _ if class => {}
            '[' => class = true,
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            '|' if depth == 0 => return true,
            _ => {}
        }
    }
    // An unclosed class or group: say yes, which keeps the row on the search.
    class || depth != 0
}

/// Splits `GPU 0000:17:00.0: text` into the address and the text, and drops a `GPU6 ` index
/// prefix (the driver's GPU instance number, not an address). Here rather than with the `NVRM`
/// shapes because `NVRM` rows read the body it leaves, and the table imports no shape.
pub fn split_gpu_prefix(m: &str) -> (Option<PciAddress>, &str) {
    let Some(rest) = m.strip_prefix("GPU") else {
        return (None, m);
    };
    if let Some(r) = rest.strip_prefix(' ') {
        if let Some((a, body)) = r.split_once(": ") {
            if let Ok(p) = PciAddress::parse(a) {
                return (Some(p), body);
            }
        }
        return (None, m);
    }
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits > 0 && rest[digits..].starts_with(' ') {
        return (None, &rest[digits + 1..]);
    }
    (None, m)
}

/// Each string once, in the order first seen.
fn distinct(all: impl Iterator<Item = &'static str>) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for s in all {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// Checks and compiles one row.
fn compile(
    spec: &RowSpec,
    i: usize,
    key: &str,
    checked: bool,
    err: &dyn Fn(&str, String) -> RowError,
) -> Result<Row, RowError> {
    let id = match spec.id.as_deref().map(str::trim) {
        Some(id) if !id.is_empty() => id.to_string(),
        Some(_) => return Err(err("id", "is empty".into())),
        // A silence row may go unnamed: its key names it.
        None if spec.silence || key.ends_with("silence") => format!("{key}[{i}]"),
        None => {
            return Err(err(
                "id",
                "missing (a name such as \"site.ib-link-flap\")".into(),
            ))
        }
    };
    if id.len() > 64 || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(err(
            "id",
            "expected at most 64 printable characters without spaces".into(),
        ));
    }
    let literal = spec.literal.as_str();
    if literal.len() < 4 || literal.len() > 128 {
        return Err(err(
            "literal",
            "expected from 4 to 128 bytes (the prefilter searches for it in every line)".into(),
        ));
    }
    if literal.starts_with(char::is_whitespace) || literal.contains(['\n', '\r']) {
        return Err(err(
            "literal",
            "must not start with a space or hold a line break".into(),
        ));
    }
    let tag = match spec.tag.as_deref() {
        None => Tag::None,
        Some("NVRM") => Tag::Nvrm,
        Some(t) => return Err(err("tag", format!("unknown tag {t:?} (known: \"NVRM\")"))),
    };
    let (source, slots) = pattern::expand(&spec.pattern).map_err(|m| err("pattern", m))?;
    let re = OnceLock::new();
    if checked {
        let compiled = pattern::build(&source, slots.len()).map_err(|m| err("pattern", m))?;
        let _ = re.set(Some(compiled));
    }
    let silence = spec.silence || key.ends_with("silence");
    let field = |name: &str, v: &Option<String>| -> Result<Option<String>, RowError> {
        match v {
            Some(v) if silence => Err(err(
                name,
                format!("a silence row reports nothing, so it takes no {name} ({v:?})"),
            )),
            v => Ok(v.clone()),
        }
    };
    let kind_s = field("kind", &spec.kind)?;
    let severity_s = field("severity", &spec.severity)?;
    let category_s = field("category", &spec.category)?;
    let title_s = field("title", &spec.title)?;
    let kind = match kind_s.as_deref() {
        Some(k) => FindingKind::parse(k)
            .filter(|k| LINE_KINDS.contains(k))
            .ok_or_else(|| {
                err(
                    "kind",
                    format!(
                        "unknown kind {k:?} (known: {})",
                        LINE_KINDS.map(FindingKind::as_str).join(", ")
                    ),
                )
            })?,
        None if silence => FindingKind::DriverError,
        None => return Err(err("kind", "missing".into())),
    };
    let severity = match severity_s.as_deref() {
        Some(s) => Severity::parse(s).ok_or_else(|| {
            err(
                "severity",
                format!("unknown severity {s:?} (known: info, warning, critical)"),
            )
        })?,
        None if silence => Severity::Info,
        None => return Err(err("severity", "missing".into())),
    };
    let category = match category_s.as_deref() {
        Some(c) => Category::parse(c).ok_or_else(|| {
            err(
                "category",
                format!(
                    "unknown category {c:?} (known: {})",
                    Category::ALL.map(Category::as_str).join(", ")
                ),
            )
        })?,
        None => Category::Driver,
    };
    let title = match title_s.as_deref() {
        Some(t) if !t.trim().is_empty() => {
            pattern::template(t, &slots).map_err(|m| err("title", m))?
        }
        Some(_) => return Err(err("title", "is empty".into())),
        None if silence => Vec::new(),
        None => return Err(err("title", "missing".into())),
    };
    let fold = match spec.fold.as_deref() {
        None | Some("none") => None,
        Some("explain") => Some(Fold::Explain),
        Some(f) => {
            return Err(err(
                "fold",
                format!("unknown fold {f:?} (known: \"explain\", \"none\")"),
            ))
        }
    };
    let found_by = match spec.found_by.as_deref() {
        None => None,
        Some(f) if FOUND_BY.contains(&f) && spec.anchor => {
            Some(intern(f))
        }
        Some(f) => {
            return Err(err(
                "found_by",
                format!(
                    "{f:?} is not a driver literal the prefilter searches on its own, or the row has no `anchor` (known: {})",
                    FOUND_BY.join(", ")
                ),
            ))
        }
    };
    if spec.examples.is_empty() {
        return Err(err(
            "examples",
            "at least one real line the row reads is needed (its test)".into(),
        ));
    }
    Ok(Row {
        id: intern(&id),
        literal: intern(literal),
        tag,
        anchor: spec.anchor,
        found_by,
        silence,
        kind,
        severity,
        category,
        fold,
        examples: spec.examples.clone(),
        source,
        re,
        slots,
        title,
    })
}

/// The kinds a single log line can make (the others come from NVML, probes and the daemon).
const LINE_KINDS: [FindingKind; 5] = [
    FindingKind::DriverError,
    FindingKind::DriverInitFailure,
    FindingKind::FallenOffBus,
    FindingKind::ApiMismatch,
    FindingKind::PcieAer,
];
