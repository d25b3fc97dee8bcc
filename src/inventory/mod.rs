//! The per-boot GPU inventory: what the machine had at the start of each boot, kept in the state
//! directory (`inventory.json`: this boot's snapshot and the previous boot's), and the difference
//! between the two ("changed since last boot": a board swapped, a GPU gone, the driver changed, a
//! maximum link lower).
//!
//! A snapshot is taken once per boot, at the daemon's first start in it; a restart in the same
//! boot keeps it (and reports nothing again). The diff travels with every incident on a GPU it
//! names, as evidence. `xidwatch inventory` reads the file without the daemon.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::classify::signals;
use crate::model::{Finding, FindingKind, Origin, PciAddress};
use crate::source::nvml::health::GpuReading;
use crate::source::nvml::Opened;

/// The state file.
pub const FILE: &str = "inventory.json";

/// Largest inventory file read back.
const MAX_FILE: u64 = 4 << 20;

/// One GPU as it was at the start of a boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuRecord {
    pub index: u32,
    pub pci: PciAddress,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vbios: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_gen_max: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_width_max: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistence: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_sbe: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_dbe: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_correctable: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_uncorrectable: Option<u32>,
}

/// The machine at the start of one boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub boot_id: String,
    /// Wall-clock time it was taken, milliseconds since the Unix epoch.
    pub taken_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    pub gpu_count: usize,
    pub gpus: Vec<GpuRecord>,
}

/// What `inventory.json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    pub current: Snapshot,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<Snapshot>,
}

impl Stored {
    /// The differences between the previous boot and this one.
    pub fn diff(&self) -> Vec<Change> {
        self.previous
            .as_ref()
            .map_or_else(Vec::new, |p| diff(p, &self.current))
    }
}

/// One difference between two boots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// The GPU it is about (by this boot's address, or the gone GPU's); `None` for the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<PciAddress>,
    /// `gpu_gone`, `gpu_new`, `serial`, `uuid`, `name`, `vbios`, `driver`, `link_gen_max`,
    /// `link_width_max`, `ecc`, `persistence`, `retired_pages`, `remapped_rows`, `gpu_count`.
    pub what: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

impl Change {
    /// One line for people.
    pub fn describe(&self) -> String {
        let at = self
            .pci
            .map_or_else(|| "host".to_string(), |p| p.to_string());
        let v = |o: &Option<String>| o.clone().unwrap_or_else(|| "(none)".into());
        match self.what.as_str() {
            "gpu_gone" => format!("{at}: GPU gone (was {})", v(&self.before)),
            "gpu_new" => format!("{at}: GPU new ({})", v(&self.after)),
            w => format!(
                "{at}: {} changed from {} to {}",
                w.replace('_', " "),
                v(&self.before),
                v(&self.after)
            ),
        }
    }

    /// Changes worth a finding: a counter that grew is shown in the diff but is the health
    /// checks' business.
    fn is_finding(&self) -> bool {
        !matches!(
            self.what.as_str(),
            "retired_pages" | "remapped_rows" | "persistence"
        )
    }
}

/// Builds this boot's snapshot from NVML's init inventory, the VBIOS versions and one poll of
/// readings (all in inventory order).
pub fn snapshot(
    boot_id: &str,
    taken_ms: u64,
    opened: &Opened,
    vbios: &[Option<String>],
    readings: &[GpuReading],
) -> Snapshot {
    let gpus = opened
        .inventory
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let r = readings.iter().find(|r| r.index == g.index);
            GpuRecord {
                index: g.index,
                pci: g.pci,
                uuid: g.uuid.clone(),
                serial: g.serial.clone(),
                name: g.name.clone(),
                vbios: vbios.get(i).cloned().flatten(),
                link_gen_max: r.and_then(|r| r.link_gen_max),
                link_width_max: r.and_then(|r| r.link_width_max),
                ecc_enabled: r.and_then(|r| r.ecc_enabled),
                persistence: r.and_then(|r| r.persistence),
                retired_sbe: r.and_then(|r| r.retired_sbe),
                retired_dbe: r.and_then(|r| r.retired_dbe),
                remapped_correctable: r.and_then(|r| r.remap.map(|m| m.correctable)),
                remapped_uncorrectable: r.and_then(|r| r.remap.map(|m| m.uncorrectable)),
            }
        })
        .collect::<Vec<_>>();
    Snapshot {
        boot_id: boot_id.to_string(),
        taken_ms,
        driver_version: opened.driver_version.clone(),
        gpu_count: gpus.len() + opened.notes.len(),
        gpus,
    }
}

/// The differences from `prev` to `cur`, GPUs matched by PCI address (a swapped board keeps its
/// slot and changes its serial).
pub fn diff(prev: &Snapshot, cur: &Snapshot) -> Vec<Change> {
    let mut out = Vec::new();
    let ch =
        |pci: Option<PciAddress>, what: &str, before: Option<String>, after: Option<String>| {
            Change {
                pci,
                what: what.to_string(),
                before,
                after,
            }
        };
    if prev.driver_version != cur.driver_version {
        out.push(ch(
            None,
            "driver",
            prev.driver_version.clone(),
            cur.driver_version.clone(),
        ));
    }
    if prev.gpu_count != cur.gpu_count {
        out.push(ch(
            None,
            "gpu_count",
            Some(prev.gpu_count.to_string()),
            Some(cur.gpu_count.to_string()),
        ));
    }
    let label = |g: &GpuRecord| {
        g.serial
            .as_ref()
            .map(|s| format!("serial {s}"))
            .or_else(|| g.uuid.clone())
            .unwrap_or_else(|| format!("GPU {}", g.index))
    };
    for p in &prev.gpus {
        let Some(c) = cur.gpus.iter().find(|c| c.pci == p.pci) else {
            out.push(ch(Some(p.pci), "gpu_gone", Some(label(p)), None));
            continue;
        };
        let mut field = |what: &str, a: Option<String>, b: Option<String>| {
            // A value one boot could not read is no change.
            if a.is_some() && b.is_some() && a != b {
                out.push(ch(Some(c.pci), what, a, b));
            }
        };
        let s = |v: &Option<u32>| v.map(|n| n.to_string());
        field("serial", p.serial.clone(), c.serial.clone());
        field("uuid", p.uuid.clone(), c.uuid.clone());
        field("name", p.name.clone(), c.name.clone());
        field("vbios", p.vbios.clone(), c.vbios.clone());
        if c.link_gen_max < p.link_gen_max {
            field("link_gen_max", s(&p.link_gen_max), s(&c.link_gen_max));
        }
        if c.link_width_max < p.link_width_max {
            field("link_width_max", s(&p.link_width_max), s(&c.link_width_max));
        }
        field(
            "ecc",
            p.ecc_enabled.map(|b| on_off(b).into()),
            c.ecc_enabled.map(|b| on_off(b).into()),
        );
        field(
            "persistence",
            p.persistence.map(|b| on_off(b).into()),
            c.persistence.map(|b| on_off(b).into()),
        );
        let pages = |g: &GpuRecord| match (g.retired_sbe, g.retired_dbe) {
            (None, None) => None,
            (a, b) => Some(format!(
                "{} single-bit, {} double-bit",
                a.unwrap_or(0),
                b.unwrap_or(0)
            )),
        };
        field("retired_pages", pages(p), pages(c));
        let rows = |g: &GpuRecord| match (g.remapped_correctable, g.remapped_uncorrectable) {
            (None, None) => None,
            (a, b) => Some(format!(
                "{} correctable, {} uncorrectable",
                a.unwrap_or(0),
                b.unwrap_or(0)
            )),
        };
        field("remapped_rows", rows(p), rows(c));
    }
    for c in &cur.gpus {
        if !prev.gpus.iter().any(|p| p.pci == c.pci) {
            out.push(ch(Some(c.pci), "gpu_new", None, Some(label(c))));
        }
    }
    out
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// The "changed since last boot" findings for a diff: one per GPU (or one for the host), each
/// listing that GPU's changes.
pub fn findings(changes: &[Change]) -> Vec<Finding> {
    let mut by_gpu: Vec<(Option<PciAddress>, Vec<&Change>)> = Vec::new();
    for c in changes.iter().filter(|c| c.is_finding()) {
        match by_gpu.iter_mut().find(|(p, _)| *p == c.pci) {
            Some((_, v)) => v.push(c),
            None => by_gpu.push((c.pci, vec![c])),
        }
    }
    by_gpu
        .into_iter()
        .map(|(pci, cs)| {
            let words: Vec<String> = cs.iter().map(|c| c.describe()).collect();
            let title = match cs.iter().find(|c| c.what == "serial") {
                Some(_) => format!(
                    "Changed since last boot: board swapped at {}",
                    pci.map_or_else(|| "host".into(), |p| p.to_string())
                ),
                None => format!("Changed since last boot: {}", words.join("; ")),
            };
            let mut f = signals::finding(FindingKind::InventoryChanged, None, title);
            f.pci = pci;
            f.message = format!("changed since last boot: {}", words.join("; "));
            f.origin = Origin {
                line: 0,
                lines: u32::try_from(words.len()).unwrap_or(u32::MAX),
                raw: words.iter().map(|w| format!("inventory: {w}")).collect(),
                ..Origin::default()
            };
            f
        })
        .collect()
}

/// Reads `inventory.json` from the state directory for another process (`xidwatch inventory`);
/// `None` when there is none yet, anything but a regular file an error naming it.
pub fn load(state_dir: &Path) -> anyhow::Result<Option<Stored>> {
    load_as(state_dir, crate::state::file::Reader::Visitor)
}

/// Reads `inventory.json` in the daemon: anything but its own regular file is set aside and read
/// as none (see [`crate::state::file`]).
pub(crate) fn load_owned(state_dir: &Path) -> anyhow::Result<Option<Stored>> {
    load_as(state_dir, crate::state::file::Reader::Owner)
}

fn load_as(state_dir: &Path, who: crate::state::file::Reader) -> anyhow::Result<Option<Stored>> {
    use anyhow::Context;
    let path = state_dir.join(FILE);
    let Some(bytes) = crate::state::file::read_bounded(&path, MAX_FILE, who)? else {
        return Ok(None);
    };
    let v = serde_json::from_slice(&bytes)
        .with_context(|| format!("{}: not an inventory file", path.display()))?;
    Ok(Some(v))
}

/// Writes `inventory.json` atomically (mode 0640).
pub fn save(state_dir: &Path, stored: &Stored) -> anyhow::Result<()> {
    use anyhow::Context;
    let bytes = serde_json::to_vec_pretty(stored).context("serialising the inventory")?;
    crate::state::write_atomic(&state_dir.join(FILE), &bytes, crate::state::STATE_FILE_MODE)
        .with_context(|| format!("writing {}", state_dir.join(FILE).display()))
}

/// Takes this boot's place in the stored inventory: on a new boot the stored current becomes the
/// previous one and `fresh` the current (`true`: a new boot, report the diff); in the same boot
/// the stored one stays (`false`).
pub fn roll(stored: Option<Stored>, fresh: Snapshot) -> (Stored, bool) {
    match stored {
        Some(s) if s.current.boot_id == fresh.boot_id => (s, false),
        Some(s) => (
            Stored {
                current: fresh,
                previous: Some(s.current),
            },
            true,
        ),
        None => (
            Stored {
                current: fresh,
                previous: None,
            },
            true,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(pci: &str, serial: &str) -> GpuRecord {
        GpuRecord {
            index: 0,
            pci: PciAddress::parse(pci).unwrap(),
            uuid: None,
            serial: Some(serial.into()),
            name: None,
            vbios: None,
            link_gen_max: Some(5),
            link_width_max: Some(16),
            ecc_enabled: None,
            persistence: None,
            retired_sbe: None,
            retired_dbe: None,
            remapped_correctable: None,
            remapped_uncorrectable: None,
        }
    }

    fn snap(boot: &str, gpus: Vec<GpuRecord>) -> Snapshot {
        Snapshot {
            boot_id: boot.into(),
            taken_ms: 0,
            driver_version: Some("550.54.14".into()),
            gpu_count: gpus.len(),
            gpus,
        }
    }

    #[test]
    fn a_swapped_board_and_a_gone_gpu_are_changes() {
        let a = snap("a", vec![rec("17:00.0", "111"), rec("2a:00.0", "222")]);
        let mut b = snap("b", vec![rec("17:00.0", "333")]);
        b.gpus[0].link_width_max = Some(8);
        let d = diff(&a, &b);
        let whats: Vec<&str> = d.iter().map(|c| c.what.as_str()).collect();
        assert_eq!(
            whats,
            ["gpu_count", "serial", "link_width_max", "gpu_gone"],
            "{d:?}"
        );
        let f = findings(&d);
        assert_eq!(f.len(), 3, "{f:?}");
        assert!(f[1].title.contains("board swapped"), "{}", f[1].title);
        let (stored, new) = roll(None, a.clone());
        assert!(new);
        let (stored, new) = roll(Some(stored), b.clone());
        assert!(new);
        assert_eq!(stored.diff(), d);
        let (_, new) = roll(Some(stored), b);
        assert!(!new, "same boot");
    }
}
