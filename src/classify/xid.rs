//! Xid findings: the catalog's name and severity, and the per-Xid fields.

use super::catalog::Nvlink5Layout;
use super::shape_id as id;
use super::shapes::XidLine;
use super::{base_owned, catalog, Classifier, LineOrigin};
use crate::model::{Category, Detail, Finding, FindingKind, RecoveryAction, Severity};

impl Classifier {
    pub(super) fn xid_finding(&mut self, x: XidLine, msg: &str, at: &LineOrigin) -> Finding {
        if let Some(p) = x.pci {
            self.note_nvidia(p);
            self.last_xid = Some((x.xid, p));
        }
        let entry = catalog::lookup(x.xid);
        let (sev, cat, title) = match entry {
            Some(e) => (
                e.severity,
                e.category,
                std::borrow::Cow::Borrowed(catalog::title(x.xid).unwrap_or(e.mnemonic)),
            ),
            None => (
                Severity::Warning,
                Category::Driver,
                std::borrow::Cow::Owned(format!(
                    "unknown Xid {} (the catalog may be older than the driver)",
                    x.xid
                )),
            ),
        };
        let caused = caused_by(&x.rest);
        let detail = xid_detail(x.xid, &x.rest, self.driver_version.as_deref());
        let mut f = base_owned(
            id::XID,
            Finding::new(FindingKind::Xid, sev, cat, title),
            x.rest,
            msg,
            at,
        );
        f.caused_by = caused;
        f.detail = detail;
        f.xid = Some(x.xid);
        f.pci = x.pci;
        f.pid = x.pid;
        f.process = x.process;
        match &f.detail {
            Some(Detail::Recovery { to, .. }) => f.severity = to.severity(),
            Some(Detail::Nvlink5 { decode, .. }) if !decode.is_empty() => {
                let fatal = decode.iter().any(|d| {
                    d.severity.starts_with("Fatal") || d.severity.starts_with("Link Fatal")
                });
                // The decode table is the authority once a row matches.
                let ignorable = decode.iter().all(|d| d.immediate == "IGNORE");
                f.severity = if fatal {
                    Severity::Critical
                } else if ignorable {
                    Severity::Info
                } else {
                    Severity::Warning
                };
            }
            _ => {}
        }
        // In place: the finding is a few hundred bytes, and `enrich` moved it twice.
        if let Some(id) = f.pci.and_then(|p| self.gpus.get(&p)) {
            super::merge_identity(&mut f.gpu, id);
        }
        f
    }
}

pub(super) fn caused_by(rest: &str) -> Option<u32> {
    static F: std::sync::OnceLock<memchr::memmem::Finder<'static>> = std::sync::OnceLock::new();
    let i = F
        .get_or_init(|| memchr::memmem::Finder::new(b"caused by previous Xid "))
        .find(rest.as_bytes())?;
    let n = &rest[i + "caused by previous Xid ".len()..];
    let end = n.find(|c: char| !c.is_ascii_digit()).unwrap_or(n.len());
    n[..end].parse().ok()
}

pub(super) fn link_number(rest: &str) -> Option<u32> {
    let i = rest.find("Link ")?;
    let n = &rest[i + 5..];
    let end = n.find(|c: char| !c.is_ascii_digit()).unwrap_or(n.len());
    n[..end].parse().ok()
}

pub(super) fn parse_num_after(hay: &str, key: &str) -> Option<u32> {
    let i = crate::classify::find::find(hay.as_bytes(), key.as_bytes())?;
    let n = hay[i + key.len()..].trim_start();
    let end = n.find(|c: char| !c.is_ascii_digit()).unwrap_or(n.len());
    n[..end].parse().ok()
}

pub(super) fn hex_u32(s: &str) -> Option<u32> {
    let t = s.trim().trim_end_matches(',');
    let t = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    u32::from_str_radix(t, 16).ok()
}

/// Extracts the per-Xid fields: 13 location, 74 link and registers, 144-150 decode, 154 action.
pub(super) fn xid_detail(xid: u32, rest: &str, driver: Option<&str>) -> Option<Detail> {
    match xid {
        13 => {
            let at = crate::classify::find::find(rest.as_bytes(), b"GPC ")?;
            let loc = &rest[at..];
            let gpc = parse_num_after(loc, "GPC ")?;
            let tpc = parse_num_after(loc, "TPC ")?;
            let sm = parse_num_after(loc, "SM ")?;
            Some(Detail::GraphicsException { gpc, tpc, sm })
        }
        74 => {
            let i = rest.find("on link ")?;
            let after = &rest[i + "on link ".len()..];
            let end = after
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after.len());
            let link = after[..end].parse().ok()?;
            let registers = after[end..]
                .strip_prefix('(')
                .and_then(|r| r.split(')').next())
                .map(|r| r.split([',', ' ']).filter_map(hex_u32).collect())
                .unwrap_or_default();
            Some(Detail::NvlinkError { link, registers })
        }
        144..=150 => {
            let unit = rest.split_whitespace().next()?.to_string();
            let open = rest.find('(')?;
            let mut regs =
                rest[open + 1..].split(|c: char| c.is_whitespace() || c == ')' || c == ',');
            let mut next_hex = || regs.by_ref().find(|s| !s.is_empty()).and_then(hex_u32);
            let intr_info = next_hex()?;
            let error_status = next_hex()?;
            let layout = driver.and_then(Nvlink5Layout::for_driver);
            Some(Detail::Nvlink5 {
                unit,
                link: link_number(rest),
                intr_info,
                error_status,
                decode: catalog::decode_nvlink5(xid, intr_info, error_status, layout),
            })
        }
        154 => {
            let i = rest.find("changed from ")?;
            let s = &rest[i + "changed from ".len()..];
            let (from, to) = s.split_once(" to ")?;
            Some(Detail::Recovery {
                from: action(from),
                to: action(to),
            })
        }
        _ => None,
    }
}

/// `0x1 (GPU Reset Required)` -> the action; a bare value without words is kept as text.
pub(super) fn action(s: &str) -> RecoveryAction {
    let s = s.trim().trim_end_matches('.');
    match (s.find('('), s.rfind(')')) {
        (Some(a), Some(b)) if b > a => RecoveryAction::from_text(&s[a + 1..b]),
        _ => RecoveryAction::Other(s.to_string()),
    }
}
