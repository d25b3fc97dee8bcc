//! Placeholder expansion for step arguments and paths (pure).
//!
//! A template is parsed once at load time into literal text and typed placeholders. At run time a
//! placeholder is replaced by a value from [`Values`], whose fields are all checked types (a
//! [`PciAddress`], an integer, a [`GpuUuid`]). Nothing in this module can turn kernel log text into
//! an argument: there is no placeholder whose value is a free string.

use std::fmt;

use crate::model::PciAddress;

use super::subject::{GpuUuid, Subject};

/// The placeholders a step may use. Every value renders from a checked type, never starts with
/// `-` and never contains `/`, `=`, whitespace or shell metacharacters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Placeholder {
    /// The GPU's PCI address, `dddd:bb:dd.f`.
    Pci,
    /// The PCI bridge or root port directly above the GPU, read from the sysfs topology.
    ParentPci,
    /// The GPU's index as the driver numbers it.
    GpuIndex,
    /// The GPU's UUID (`GPU-xxxxxxxx-...`), when the log or NVML gave one and it is well formed.
    Uuid,
    /// The Xid (or SXid) number.
    Xid,
    /// The process id the driver named.
    Pid,
    /// The systemd unit a service incident is about (one of the catalog's units).
    Unit,
}

impl Placeholder {
    pub const ALL: [Placeholder; 7] = [
        Placeholder::Pci,
        Placeholder::ParentPci,
        Placeholder::GpuIndex,
        Placeholder::Uuid,
        Placeholder::Xid,
        Placeholder::Pid,
        Placeholder::Unit,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Placeholder::Pci => "pci",
            Placeholder::ParentPci => "parent_pci",
            Placeholder::GpuIndex => "gpu_index",
            Placeholder::Uuid => "uuid",
            Placeholder::Xid => "xid",
            Placeholder::Pid => "pid",
            Placeholder::Unit => "unit",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Placeholder::ALL.into_iter().find(|p| p.name() == name)
    }

    /// What the value is, for `runbook show` and the docs.
    pub fn describe(self) -> &'static str {
        match self {
            Placeholder::Pci => "the GPU's PCI address (dddd:bb:dd.f)",
            Placeholder::ParentPci => "the PCI bridge or root port above the GPU (from sysfs)",
            Placeholder::GpuIndex => "the GPU's index",
            Placeholder::Uuid => "the GPU's UUID (GPU-...)",
            Placeholder::Xid => "the Xid or SXid number",
            Placeholder::Pid => "the process id the driver named",
            Placeholder::Unit => "the systemd unit a service incident is about",
        }
    }
}

impl fmt::Display for Placeholder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{{}}}", self.name())
    }
}

/// The values placeholders expand to, for one incident. Every field is a checked type, so no
/// code path can put raw log text here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Values {
    pub pci: Option<PciAddress>,
    pub parent_pci: Option<PciAddress>,
    pub gpu_index: Option<u32>,
    pub uuid: Option<GpuUuid>,
    pub xid: Option<u32>,
    pub pid: Option<u32>,
    pub unit: Option<super::subject::ServiceUnit>,
}

impl Values {
    /// The values of a subject; `parent_pci` comes from the sysfs topology (see
    /// [`parent_port`](super::sysfs::parent_port)).
    pub fn for_subject(s: &Subject, parent_pci: Option<PciAddress>) -> Values {
        Values {
            pci: s.pci,
            parent_pci,
            gpu_index: s.gpu_index,
            uuid: s.uuid.clone(),
            xid: s.xid,
            pid: s.pid,
            unit: s.unit.clone(),
        }
    }

    pub fn get(&self, p: Placeholder) -> Option<String> {
        match p {
            Placeholder::Pci => self.pci.map(|a| a.to_string()),
            Placeholder::ParentPci => self.parent_pci.map(|a| a.to_string()),
            Placeholder::GpuIndex => self.gpu_index.map(|n| n.to_string()),
            Placeholder::Uuid => self.uuid.as_ref().map(|u| u.as_str().to_string()),
            Placeholder::Xid => self.xid.map(|n| n.to_string()),
            Placeholder::Pid => self.pid.map(|n| n.to_string()),
            Placeholder::Unit => self.unit.as_ref().map(|u| u.as_str().to_string()),
        }
    }
}

/// An argument as a pattern's slot sees it (see [`Template::slot_part`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotPart {
    Text(String),
    One(Placeholder),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Value(Placeholder),
}

/// One argument or path with its placeholders, parsed at load time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    segments: Vec<Segment>,
}

/// Why a template did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("unknown placeholder {{{0}}} (known: {known})", known = known_list())]
    Unknown(String),
    #[error("a '{{' is not closed (write {{{{ for a literal brace)")]
    Unclosed,
    #[error("a '}}' has no '{{' (write }}}} for a literal brace)")]
    StrayClose,
}

fn known_list() -> String {
    Placeholder::ALL
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl Template {
    /// Parses `text`, where `{name}` is a placeholder and `{{` / `}}` are literal braces.
    pub fn parse(text: &str) -> Result<Template, TemplateError> {
        let mut segments = Vec::new();
        let mut lit = String::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    lit.push('{');
                }
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => name.push(c),
                            None => return Err(TemplateError::Unclosed),
                        }
                    }
                    let p = Placeholder::parse(&name)
                        .ok_or_else(|| TemplateError::Unknown(name.chars().take(40).collect()))?;
                    if !lit.is_empty() {
                        segments.push(Segment::Literal(std::mem::take(&mut lit)));
                    }
                    segments.push(Segment::Value(p));
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    lit.push('}');
                }
                '}' => return Err(TemplateError::StrayClose),
                c => lit.push(c),
            }
        }
        if !lit.is_empty() || segments.is_empty() {
            segments.push(Segment::Literal(lit));
        }
        Ok(Template { segments })
    }

    /// A template of plain text, without placeholders.
    pub fn literal(text: &str) -> Template {
        Template {
            segments: vec![Segment::Literal(text.to_string())],
        }
    }

    /// The placeholders used, in order.
    pub fn placeholders(&self) -> impl Iterator<Item = Placeholder> + '_ {
        self.segments.iter().filter_map(|s| match s {
            Segment::Value(p) => Some(*p),
            Segment::Literal(_) => None,
        })
    }

    /// The literal text, when there is no placeholder.
    pub fn as_literal(&self) -> Option<&str> {
        match self.segments.as_slice() {
            [Segment::Literal(s)] => Some(s),
            _ => None,
        }
    }

    /// The text before the first placeholder (all of it when there is none).
    pub fn literal_prefix(&self) -> &str {
        match self.segments.first() {
            Some(Segment::Literal(s)) => s,
            _ => "",
        }
    }

    /// What follows `prefix` when it is exactly one placeholder, or plain text: how a pattern's
    /// slot (`--query-gpu={gpu_fields}`, `{pci}`) sees this argument. `None` otherwise.
    pub fn slot_part(&self, prefix: &str) -> Option<SlotPart> {
        match self.segments.as_slice() {
            [Segment::Literal(s)] => s
                .strip_prefix(prefix)
                .map(|r| SlotPart::Text(r.to_string())),
            [Segment::Value(p)] if prefix.is_empty() => Some(SlotPart::One(*p)),
            [Segment::Literal(s), Segment::Value(p)] if s == prefix => Some(SlotPart::One(*p)),
            _ => None,
        }
    }

    /// The template split at every `/` of its literal text: a path's components.
    pub fn components(&self) -> Vec<Template> {
        let mut out = vec![Template {
            segments: Vec::new(),
        }];
        for seg in &self.segments {
            match seg {
                Segment::Value(_) => out
                    .last_mut()
                    .into_iter()
                    .for_each(|t| t.segments.push(seg.clone())),
                Segment::Literal(text) => {
                    for (i, part) in text.split('/').enumerate() {
                        if i > 0 {
                            out.push(Template {
                                segments: Vec::new(),
                            });
                        }
                        if let (false, Some(t)) = (part.is_empty(), out.last_mut()) {
                            t.segments.push(Segment::Literal(part.to_string()));
                        }
                    }
                }
            }
        }
        for t in &mut out {
            if t.segments.is_empty() {
                t.segments.push(Segment::Literal(String::new()));
            }
        }
        out
    }

    /// Substitutes every placeholder, or names the first one without a value.
    pub fn expand(&self, values: &Values) -> Result<String, Placeholder> {
        let mut out = String::new();
        for s in &self.segments {
            match s {
                Segment::Literal(t) => out.push_str(t),
                Segment::Value(p) => out.push_str(&values.get(*p).ok_or(*p)?),
            }
        }
        Ok(out)
    }
}

impl fmt::Display for Template {
    /// The template as people read it: placeholders as `{name}`, braces unescaped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.segments {
            match s {
                Segment::Literal(t) => f.write_str(t)?,
                Segment::Value(p) => write!(f, "{p}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> Values {
        Values {
            pci: PciAddress::parse("0000:17:00.0").ok(),
            parent_pci: PciAddress::parse("0000:16:01.0").ok(),
            gpu_index: Some(3),
            uuid: GpuUuid::parse("GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f"),
            xid: Some(79),
            pid: Some(2207),
            unit: super::super::subject::ServiceUnit::parse("nvidia-fabricmanager.service"),
        }
    }

    #[test]
    fn expands_placeholders_inside_text() {
        let t = Template::parse("/sys/bus/pci/devices/{pci}/current_link_speed").unwrap();
        assert_eq!(
            t.expand(&values()).unwrap(),
            "/sys/bus/pci/devices/0000:17:00.0/current_link_speed"
        );
        assert_eq!(
            t.to_string(),
            "/sys/bus/pci/devices/{pci}/current_link_speed"
        );
        assert_eq!(t.placeholders().collect::<Vec<_>>(), vec![Placeholder::Pci]);
        let t = Template::parse("--id={gpu_index}:{xid}:{pid}:{uuid}:{parent_pci}").unwrap();
        assert_eq!(
            t.expand(&values()).unwrap(),
            "--id=3:79:2207:GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f:0000:16:01.0"
        );
    }

    #[test]
    fn braces_escape_and_errors() {
        assert_eq!(
            Template::parse("a{{b}}c").unwrap().as_literal(),
            Some("a{b}c")
        );
        assert_eq!(Template::parse("").unwrap().as_literal(), Some(""));
        assert_eq!(
            Template::parse("{message}"),
            Err(TemplateError::Unknown("message".into()))
        );
        assert_eq!(Template::parse("{pci"), Err(TemplateError::Unclosed));
        assert_eq!(Template::parse("pci}"), Err(TemplateError::StrayClose));
        assert_eq!(
            Template::parse("{}"),
            Err(TemplateError::Unknown(String::new()))
        );
    }

    #[test]
    fn a_missing_value_is_named() {
        let t = Template::parse("/proc/{pid}/cmdline").unwrap();
        assert_eq!(t.expand(&Values::default()), Err(Placeholder::Pid));
    }

    #[test]
    fn values_are_inert_on_a_command_line() {
        // Whatever a placeholder expands to can be neither an option nor a path nor shell syntax.
        let v = values();
        for p in Placeholder::ALL {
            let s = v.get(p).unwrap();
            assert!(!s.starts_with('-'), "{p}: {s}");
            assert!(
                s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '.' | '-')),
                "{p}: {s}"
            );
        }
    }
}
