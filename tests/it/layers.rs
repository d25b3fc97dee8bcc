//! The crate's layering, checked over its source: no import circle between files, and no lower
//! room (top-level module) importing a higher one.
//!
//! What counts as an import: every `crate::` path in the code (in `use` items, grouped ones like
//! `use crate::{a::b, c::{d, e}}` included, and inline ones like `crate::x::y(...)`), and every
//! `super::` path, resolved from the module it is written in. A path is mapped to the deepest
//! module file it names (`crate::alert::outbox::Outbox` is `src/alert/outbox.rs`); an item of a
//! `mod.rs` maps to that `mod.rs`. Comments, string literals and `#[cfg(test)]` items are left
//! out: a test may build its fixtures from any room. `src/main.rs` is its own crate (it imports
//! `xidwatch::`, not `crate::`) and stands at the top with `cli`. Plain relative paths (a
//! `mod.rs` naming its own child, `dispatch::Thing`) are not followed: without name resolution
//! they cannot be told from external crates.
//!
//! The rooms, lower first ([`ROOMS`]); a room may import its own files, its rank and any lower
//! rank. `config` reads the configuration of the stages it configures (`alert`, `classify`,
//! `health`, `runbook`, `source`) and is read by `daemon` and `cli` only, so it sits just above
//! `alert`, the highest stage it configures, and below `verdict`.
//!
//! [`ALLOWED`] lists today's violations, each by the file pair it concerns. It must shrink to
//! empty: the test fails on a violation not in the list, and on a listed one that no longer
//! exists, so the list stays honest as circles are broken.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Rooms by rank, lower first; rooms of one rank may import each other.
const ROOMS: &[(&str, u32)] = &[
    ("model", 0),
    ("clock", 0),
    ("host", 0),
    ("files", 0),
    ("state", 0),
    ("process_guard", 0),
    ("decimal", 0),
    ("classify", 1),
    ("runbook", 1),
    ("source", 1),
    ("health", 1),
    ("inventory", 1),
    ("history", 1),
    ("incident", 2),
    ("alert", 3),
    // Above the stages it configures (see the module doc).
    ("config", 4),
    ("verdict", 5),
    // The daemon's status side: serves the verdict, is recorded into by the daemon.
    ("status", 6),
    ("daemon", 7),
    ("cli", 8),
];

/// What a violation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// The first file imports the second, and the second reaches the first again.
    Circle,
    /// The first file's room is lower than the second's.
    Upward,
}

/// Today's violations: (kind, importing file, imported file), paths under `src/`. Remove an
/// entry when its import goes; never add one.
const ALLOWED: &[(Kind, &str, &str)] = &[];

#[test]
fn no_import_circle_and_no_room_imports_a_higher_one() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = Graph::read(&src);
    let found = graph.violations();
    let allowed: BTreeSet<(Kind, String, String)> = ALLOWED
        .iter()
        .map(|(k, a, b)| (*k, a.to_string(), b.to_string()))
        .collect();
    println!(
        "{} files, {} file-to-file imports, {} violations ({} allowed for now):",
        graph.files.len(),
        graph.edges.values().map(BTreeSet::len).sum::<usize>(),
        found.len(),
        ALLOWED.len()
    );
    for (kind, a, b) in &found {
        let mark = if allowed.contains(&(*kind, a.clone(), b.clone())) {
            "allowed"
        } else {
            "NEW"
        };
        let what = match kind {
            Kind::Circle => "on a circle",
            Kind::Upward => "lower room imports a higher one",
        };
        println!("  [{mark}] src/{a} -> src/{b}: {what}");
    }
    let new: Vec<_> = found.difference(&allowed).collect();
    let stale: Vec<_> = allowed.difference(&found).collect();
    assert!(
        new.is_empty() && stale.is_empty(),
        "layering: {} new violation(s) {new:?}; {} allowed one(s) no longer found (remove them \
         from ALLOWED in tests/it/layers.rs) {stale:?}",
        new.len(),
        stale.len()
    );
}

/// The import reader on a made-up file: grouped and inline paths, `super::` from a file and from
/// an inline module, and what must not count (comments, strings, tests, `pub(crate)`).
#[test]
fn the_reader_finds_grouped_inline_and_relative_paths_only_in_code() {
    let text = r##"
use crate::{alert::outbox::{self, Outbox}, model::Incident as I};
use super::sibling::Thing;
// use crate::cli::nothing;
/* crate::daemon::neither /* nested */ */
const S: &str = "crate::verdict::not_this";
const R: &str = r#"crate::verdict::nor_this"#;
const C: char = '"';
pub(crate) fn f<'a>(x: &'a str) -> usize { crate::files::read(x); 0 }
mod inner {
    use super::super::other::Y;
}
#[cfg(test)]
mod tests {
    use crate::cli::only_in_tests;
}
"##;
    let paths = crate_paths(text, &["runbook".to_string(), "exec".to_string()]);
    let want: Vec<Vec<&str>> = vec![
        vec!["alert", "outbox"],
        vec!["alert", "outbox", "Outbox"],
        vec!["model", "Incident"],
        vec!["runbook", "sibling", "Thing"],
        vec!["files", "read"],
        vec!["runbook", "other", "Y"],
    ];
    assert_eq!(paths, want);
}

struct Graph {
    /// File (relative to src/) -> its module path.
    files: BTreeMap<String, Vec<String>>,
    edges: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    fn read(src: &Path) -> Graph {
        let mut texts = BTreeMap::new();
        walk(src, src, &mut texts);
        // Files of `#[cfg(test)] mod name;` are tests too.
        let test_only: BTreeSet<Vec<String>> = texts
            .iter()
            .flat_map(|(f, text)| {
                let module = module_of(f);
                test_modules(text).into_iter().map(move |name| {
                    let mut m = module.clone();
                    m.push(name);
                    m
                })
            })
            .collect();
        let files: BTreeMap<String, Vec<String>> = texts
            .keys()
            .filter(|f| *f != "main.rs")
            .map(|f| (f.clone(), module_of(f)))
            .filter(|(_, m)| !test_only.iter().any(|t| m.starts_with(t)))
            .collect();
        let by_module: BTreeMap<&[String], &str> = files
            .iter()
            .map(|(f, m)| (m.as_slice(), f.as_str()))
            .collect();
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (file, module) in &files {
            if file == "lib.rs" {
                continue;
            }
            for path in crate_paths(&texts[file], module) {
                let target = (1..=path.len())
                    .rev()
                    .find_map(|n| by_module.get(&path[..n]).copied());
                // `crate::x` for an item of the crate root, or a name this reader cannot place.
                let Some(target) = target else { continue };
                if target != file && target != "lib.rs" {
                    edges
                        .entry(file.clone())
                        .or_default()
                        .insert(target.to_string());
                }
            }
        }
        Graph { files, edges }
    }

    fn violations(&self) -> BTreeSet<(Kind, String, String)> {
        let mut out = BTreeSet::new();
        let component = self.components();
        for (a, targets) in &self.edges {
            for b in targets {
                if component[a] == component[b] {
                    out.insert((Kind::Circle, a.clone(), b.clone()));
                }
                let (ra, rb) = (rank(a), rank(b));
                if ra < rb {
                    out.insert((Kind::Upward, a.clone(), b.clone()));
                }
            }
        }
        out
    }

    /// Strongly connected components (Tarjan): two files share one when each reaches the other.
    fn components(&self) -> BTreeMap<String, usize> {
        struct Tarjan<'g> {
            edges: &'g BTreeMap<String, BTreeSet<String>>,
            index: BTreeMap<&'g str, usize>,
            low: BTreeMap<&'g str, usize>,
            stack: Vec<&'g str>,
            on_stack: BTreeSet<&'g str>,
            component: BTreeMap<String, usize>,
            next: usize,
        }
        impl<'g> Tarjan<'g> {
            fn visit(&mut self, v: &'g str) {
                self.index.insert(v, self.next);
                self.low.insert(v, self.next);
                self.next += 1;
                self.stack.push(v);
                self.on_stack.insert(v);
                for w in self.edges.get(v).into_iter().flatten() {
                    let w = w.as_str();
                    if !self.index.contains_key(w) {
                        self.visit(w);
                        let lw = self.low[w];
                        let lv = self.low.get_mut(v).unwrap();
                        *lv = (*lv).min(lw);
                    } else if self.on_stack.contains(w) {
                        let iw = self.index[w];
                        let lv = self.low.get_mut(v).unwrap();
                        *lv = (*lv).min(iw);
                    }
                }
                if self.low[v] == self.index[v] {
                    let id = self.index[v];
                    loop {
                        let w = self.stack.pop().unwrap();
                        self.on_stack.remove(w);
                        self.component.insert(w.to_string(), id);
                        if w == v {
                            break;
                        }
                    }
                }
            }
        }
        let mut t = Tarjan {
            edges: &self.edges,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            component: BTreeMap::new(),
            next: 0,
        };
        for f in self.files.keys() {
            if !t.index.contains_key(f.as_str()) {
                t.visit(f);
            }
        }
        t.component
    }
}

/// The rank of the room a file (relative to src/) is in.
fn rank(file: &str) -> u32 {
    let room = file.split('/').next().unwrap().trim_end_matches(".rs");
    ROOMS
        .iter()
        .find(|(r, _)| *r == room)
        .map(|(_, n)| *n)
        .unwrap_or_else(|| panic!("src/{file}: room `{room}` has no rank in ROOMS (layers.rs)"))
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.insert(rel, std::fs::read_to_string(&path).unwrap());
        }
    }
}

/// `alert/mod.rs` -> `[alert]`, `alert/outbox.rs` -> `[alert, outbox]`, `lib.rs` -> `[]`.
fn module_of(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// A token of the code: a word, `::`, or one other character. Comments and literals are gone.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Word(String),
    Path,
    Punct(char),
}

fn tokens(text: &str) -> Vec<Tok> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let word_char = |ch: char| ch.is_alphanumeric() || ch == '_';
    while i < c.len() {
        let rest = |k: usize| c.get(i + k).copied();
        match c[i] {
            '/' if rest(1) == Some('/') => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '/' if rest(1) == Some('*') => {
                let mut depth = 0;
                while i < c.len() {
                    if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                        depth += 1;
                        i += 2;
                    } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            '"' => {
                i += 1;
                while i < c.len() && c[i] != '"' {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
                out.push(Tok::Punct('"'));
            }
            '\'' => {
                // A char literal ('x', '\n', '\u{1F600}'), or else a lifetime.
                if rest(1) == Some('\\') {
                    i += 2;
                    while i < c.len() && c[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                } else if rest(2) == Some('\'') {
                    i += 3;
                } else {
                    i += 1;
                }
                out.push(Tok::Punct('\''));
            }
            ch if word_char(ch) => {
                let start = i;
                while i < c.len() && word_char(c[i]) {
                    i += 1;
                }
                let word: String = c[start..i].iter().collect();
                // Raw strings and byte strings: r"..", r#".."#, b"..", br#".."#.
                let raw = matches!(word.as_str(), "r" | "br");
                if (raw && matches!(c.get(i), Some('"' | '#')))
                    || (word == "b" && c.get(i) == Some(&'"'))
                {
                    let mut hashes = 0;
                    while c.get(i) == Some(&'#') {
                        hashes += 1;
                        i += 1;
                    }
                    if c.get(i) == Some(&'"') {
                        i += 1;
                        if raw {
                            let end: Vec<char> = std::iter::once('"')
                                .chain(std::iter::repeat_n('#', hashes))
                                .collect();
                            while i < c.len() && !c[i..].starts_with(&end) {
                                i += 1;
                            }
                            i += end.len();
                        } else {
                            while i < c.len() && c[i] != '"' {
                                i += if c[i] == '\\' { 2 } else { 1 };
                            }
                            i += 1;
                        }
                        out.push(Tok::Punct('"'));
                        continue;
                    }
                }
                out.push(Tok::Word(word));
            }
            ':' if rest(1) == Some(':') => {
                out.push(Tok::Path);
                i += 2;
            }
            ch if ch.is_whitespace() => i += 1,
            ch => {
                out.push(Tok::Punct(ch));
                i += 1;
            }
        }
    }
    out
}

/// The `#[cfg(test)] mod name;` declarations of a file, by name.
fn test_modules(text: &str) -> Vec<String> {
    let toks = tokens(text);
    let attr = cfg_test();
    let mut out = Vec::new();
    for (i, _) in toks.iter().enumerate() {
        if !toks[i..].starts_with(&attr) {
            continue;
        }
        let mut j = i + attr.len();
        // `pub`, `pub(crate)`, `pub(super)`.
        if toks.get(j) == Some(&Tok::Word("pub".into())) {
            j += 1;
            if toks.get(j) == Some(&Tok::Punct('(')) {
                j += 3;
            }
        }
        if let (Some(Tok::Word(m)), Some(Tok::Word(name)), Some(Tok::Punct(';'))) =
            (toks.get(j), toks.get(j + 1), toks.get(j + 2))
        {
            if m == "mod" {
                out.push(name.clone());
            }
        }
    }
    out
}

/// The tokens of `#[cfg(test)]`.
fn cfg_test() -> Vec<Tok> {
    ["#", "[", "cfg", "(", "test", ")", "]"]
        .iter()
        .map(|s| match *s {
            "cfg" | "test" => Tok::Word(s.to_string()),
            p => Tok::Punct(p.chars().next().unwrap()),
        })
        .collect()
}

/// Drops every item under `#[cfg(test)]`: up to its `;` or its closing brace.
fn without_tests(toks: Vec<Tok>) -> Vec<Tok> {
    let attr = cfg_test();
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if toks[i..].starts_with(&attr) {
            i += attr.len();
            let mut depth = 0;
            while i < toks.len() {
                match &toks[i] {
                    Tok::Punct('{') => depth += 1,
                    Tok::Punct('}') => {
                        depth -= 1;
                        if depth == 0 {
                            i += 1;
                            break;
                        }
                    }
                    Tok::Punct(';') if depth == 0 => {
                        i += 1;
                        break;
                    }
                    _ => {}
                }
                i += 1;
            }
        } else {
            out.push(toks[i].clone());
            i += 1;
        }
    }
    out
}

/// Every `crate::` and `super::` path in `text`, as module paths from the crate root, for a file
/// whose module is `module`.
fn crate_paths(text: &str, module: &[String]) -> Vec<Vec<String>> {
    let toks = without_tests(tokens(text));
    let mut out = Vec::new();
    // Open braces, each marked with whether it opens an inline `mod name { .. }`.
    let mut braces: Vec<bool> = Vec::new();
    let word = |i: usize| match toks.get(i) {
        Some(Tok::Word(w)) => Some(w.as_str()),
        _ => None,
    };
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Punct('{') => {
                let inline_mod = i >= 2 && word(i - 2) == Some("mod") && word(i - 1).is_some();
                braces.push(inline_mod);
            }
            Tok::Punct('}') => {
                braces.pop();
            }
            Tok::Word(w)
                if (w == "crate" || w == "super") && toks.get(i + 1) == Some(&Tok::Path) =>
            {
                // Not the tail of a longer path (`super::super::x` is read from its first word).
                let continues = i > 0 && toks[i - 1] == Tok::Path;
                if !continues {
                    let mut base: Vec<String> = if w == "crate" {
                        Vec::new()
                    } else {
                        // `super` from inside inline modules first leaves them.
                        let inline = braces.iter().filter(|m| **m).count();
                        let mut ups = 0usize;
                        let mut j = i;
                        while word(j) == Some("super") && toks.get(j + 1) == Some(&Tok::Path) {
                            ups += 1;
                            j += 2;
                        }
                        let file_ups = ups.saturating_sub(inline);
                        let keep = module.len().saturating_sub(file_ups);
                        i = j - 2;
                        module[..keep].to_vec()
                    };
                    let mut j = i + 2;
                    expand(&toks, &mut j, &mut base, &mut out);
                    i = j;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Reads the path after a `::` at `toks[*i]`, one name or a `{..}` group, into `out`.
fn expand(toks: &[Tok], i: &mut usize, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match toks.get(*i) {
        Some(Tok::Punct('{')) => {
            *i += 1;
            loop {
                match toks.get(*i) {
                    None => return,
                    Some(Tok::Punct('}')) => {
                        *i += 1;
                        return;
                    }
                    Some(Tok::Punct(',')) => *i += 1,
                    Some(_) => {
                        let mut p = prefix.clone();
                        expand(toks, i, &mut p, out);
                        // `as name` after a member.
                        if matches!(toks.get(*i), Some(Tok::Word(w)) if w == "as") {
                            *i += 2;
                        }
                    }
                }
            }
        }
        Some(Tok::Word(w)) => {
            let w = w.clone();
            *i += 1;
            if w == "self" {
                out.push(prefix.clone());
                return;
            }
            prefix.push(w);
            if toks.get(*i) == Some(&Tok::Path) {
                *i += 1;
                expand(toks, i, prefix, out);
            } else {
                out.push(prefix.clone());
            }
        }
        // `*`, or something this reader does not know: the path so far.
        _ => out.push(prefix.clone()),
    }
}
