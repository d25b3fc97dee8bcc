//! A row's pattern: a regex in which `{name}` is a typed slot, as a runbook's argument patterns
//! type theirs (`{pci}`, `{pid}`): the slot says what its text is, the table turns it into the
//! value (an address, a number) and the finding's field, and a slot name no one knows is refused
//! rather than read as text.

use regex::Regex;

/// A typed slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// A PCI address (`0000:17:00.0`, `17:00.0`): the finding's GPU.
    Pci,
    /// An Xid number: the finding's Xid.
    Xid,
    /// A process id: the finding's pid.
    Pid,
    /// A GPU index (`GPU6`): the finding's GPU index.
    Gpu,
    /// A kernel module name (`nvidia_uvm`, `mlx5_core`).
    Module,
    /// A number, for titles (`failed for {int} device(s)`).
    Int,
    /// One word without spaces.
    Word,
    /// Free text to the end of the match: the finding's message.
    Text,
}

/// The most characters of a `{word}` slot a title takes: a word is a name (a kernel release, a
/// device, a package), and a longer run of text without spaces is cut there rather than carried
/// whole into every alert.
pub const WORD_MAX: usize = 128;

/// The slot names, as written in patterns.
pub const SLOT_NAMES: &[&str] = &["pci", "xid", "pid", "gpu", "module", "int", "word", "text"];

impl Slot {
    fn parse(name: &str) -> Option<Slot> {
        Some(match name {
            "pci" => Slot::Pci,
            "xid" => Slot::Xid,
            "pid" => Slot::Pid,
            "gpu" => Slot::Gpu,
            "module" => Slot::Module,
            "int" => Slot::Int,
            "word" => Slot::Word,
            "text" => Slot::Text,
            _ => return None,
        })
    }

    /// The text a slot takes. Numbers are ASCII digits, bounded (a value parses as a `u32`);
    /// a word is unbounded here and cut where it is used ([`WORD_MAX`]). What a slot compiles
    /// to is paid by every process the first time a line reaches its row: a counted repetition
    /// of a Unicode class is a copy of that class's automaton per count, and `\S{1,128}` (250 KB
    /// of automaton, 1.3 ms to build) or Unicode `\d{1,10}` (50 KB) made a row cost more to build
    /// than a whole small log costs to read. The regex engine is linear in the line whatever the
    /// repetition, so the bounds were never what kept a hostile line cheap.
    fn regex(self) -> &'static str {
        match self {
            Slot::Pci => r"[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}(?:\.[0-7])?",
            Slot::Xid => r"[0-9]{1,10}",
            Slot::Pid => r"[0-9]{1,7}",
            Slot::Gpu => r"[0-9]{1,4}",
            Slot::Module => r"[A-Za-z0-9_-]{1,64}",
            Slot::Int => r"-?[0-9]{1,10}",
            Slot::Word => r"\S+",
            Slot::Text => r".*",
        }
    }
}

/// A piece of a title: text, or a slot's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Text(String),
    Slot(Slot),
}

/// The `{name}` references in `s`: (start, end, name). A brace not followed by a lower-case name
/// and `}` (a regex repetition `{1,4}`, an escaped `\{`) is not a slot.
fn refs(s: &str) -> Vec<(usize, usize, &str)> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'{' && (i == 0 || b[i - 1] != b'\\') {
            let name_len = b[i + 1..]
                .iter()
                .take_while(|c| c.is_ascii_lowercase() || **c == b'_')
                .count();
            if name_len > 0 && b.get(i + 1 + name_len) == Some(&b'}') {
                out.push((i, i + name_len + 2, &s[i + 1..i + 1 + name_len]));
                i += name_len + 2;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// The pattern as a regex (each slot a capture group; the pattern's own groups must not capture,
/// written `(?:...)`, so group `i + 1` is slot `i`), and its slots; not yet compiled.
pub fn expand(pattern: &str) -> Result<(String, Vec<Slot>), String> {
    if pattern.trim().is_empty() {
        return Err("is empty".into());
    }
    if pattern.len() > 1024 {
        return Err("is longer than 1024 bytes".into());
    }
    let mut re = String::with_capacity(pattern.len() + 64);
    let mut slots = Vec::new();
    let mut last = 0;
    for (start, end, name) in refs(pattern) {
        let slot = Slot::parse(name).ok_or_else(|| {
            format!(
                "unknown slot {{{name}}} (known: {})",
                SLOT_NAMES
                    .iter()
                    .map(|n| format!("{{{n}}}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
        re.push_str(&pattern[last..start]);
        re.push('(');
        re.push_str(slot.regex());
        re.push(')');
        slots.push(slot);
        last = end;
    }
    re.push_str(&pattern[last..]);
    Ok((re, slots))
}

/// Compiles an expanded pattern of `slots` slots.
pub fn build(re: &str, slots: usize) -> Result<Regex, String> {
    let compiled = regex::RegexBuilder::new(re)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| format!("not a valid pattern: {}", first_line(&e.to_string())))?;
    if compiled.captures_len() != slots + 1 {
        return Err("a group of its own captures: write (?:...) so that only slots capture".into());
    }
    Ok(compiled)
}

/// A title: text with `{slot}` references to the pattern's slots.
pub fn template(title: &str, slots: &[Slot]) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut last = 0;
    for (start, end, name) in refs(title) {
        let slot = Slot::parse(name)
            .filter(|s| slots.contains(s))
            .ok_or_else(|| format!("names {{{name}}}, which is not a slot of the pattern"))?;
        if start > last {
            parts.push(Part::Text(title[last..start].to_string()));
        }
        parts.push(Part::Slot(slot));
        last = end;
    }
    if last < title.len() {
        parts.push(Part::Text(title[last..].to_string()));
    }
    Ok(parts)
}

fn first_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or(s)
        .to_string()
}
