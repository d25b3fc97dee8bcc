//! The lost-GPU probe: compares the NVIDIA GPUs on the PCI bus (sysfs) with what NVML reaches.
//!
//! A GPU can vanish without a word in the kernel log we would recognise (the log overran, the
//! driver wedged). Reading sysfs is cheap and needs no privileges. What NVML reaches is asked of
//! the NVML worker by the caller (`daemon::nvml`), off the pipeline's task; this module only
//! compares, and `classify::signals` rates what it finds.

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::classify::signals;
use crate::model::{Finding, FindingKind, PciAddress};

pub struct Probe {
    root: PathBuf,
    last_on_bus: Option<BTreeSet<PciAddress>>,
    reported: BTreeSet<PciAddress>,
}

impl Probe {
    /// `root` is the sysfs mount, `/sys` in production.
    pub fn new(root: PathBuf) -> Probe {
        Probe {
            root,
            last_on_bus: None,
            reported: BTreeSet::new(),
        }
    }

    /// NVIDIA display/3D controllers (vendor 0x10de, class 0x0300xx or 0x0302xx) on the bus.
    pub fn gpus_on_bus(&self) -> std::io::Result<BTreeSet<PciAddress>> {
        let mut out = BTreeSet::new();
        for entry in std::fs::read_dir(self.root.join("bus/pci/devices"))? {
            let entry = entry?;
            let name = entry.file_name();
            let Ok(pci) = PciAddress::parse(&name.to_string_lossy()) else {
                continue;
            };
            let read = |f: &str| std::fs::read_to_string(entry.path().join(f)).unwrap_or_default();
            let vendor = read("vendor");
            let class = read("class");
            if vendor.trim() == "0x10de"
                && (class.starts_with("0x0300") || class.starts_with("0x0302"))
            {
                out.insert(pci);
            }
        }
        Ok(out)
    }

    /// One probe round. `reachable`: what NVML can reach now, or `None` when NVML is not up.
    pub fn check(&mut self, reachable: Option<&[PciAddress]>) -> Vec<Finding> {
        let mut out = Vec::new();
        let Ok(on_bus) = self.gpus_on_bus() else {
            return out;
        };
        if let Some(prev) = &self.last_on_bus {
            for p in prev.difference(&on_bus) {
                out.push(missing(
                    *p,
                    format!("GPU {p} is missing: it left the PCI bus"),
                ));
            }
        }
        if let Some(reach) = reachable {
            for p in &on_bus {
                let seen = reach.iter().any(|r| r == p);
                if !seen && self.reported.insert(*p) {
                    out.push(missing(
                        *p,
                        format!("GPU {p} is missing: on the PCI bus but NVML cannot reach it"),
                    ));
                } else if seen {
                    self.reported.remove(p);
                }
            }
        }
        self.last_on_bus = Some(on_bus);
        out
    }
}

/// What the probe remembers between rounds, saved with the daemon's checkpoint: a GPU that stays
/// missing across a restart is not reported (and paged) again.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Memory {
    pub on_bus: Option<BTreeSet<PciAddress>>,
    pub reported: BTreeSet<PciAddress>,
}

impl Probe {
    /// What to save.
    pub fn memory(&self) -> Memory {
        Memory {
            on_bus: self.last_on_bus.clone(),
            reported: self.reported.clone(),
        }
    }

    /// Takes back what an earlier run of this boot saved.
    pub fn restore(&mut self, m: Memory) {
        self.last_on_bus = m.on_bus;
        self.reported = m.reported;
    }
}

fn missing(pci: PciAddress, title: String) -> Finding {
    let mut f = signals::finding(FindingKind::GpuMissing, None, title);
    f.pci = Some(pci);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(root: &std::path::Path, name: &str, vendor: &str, class: &str) {
        let d = root.join("bus/pci/devices").join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("vendor"), vendor).unwrap();
        std::fs::write(d.join("class"), class).unwrap();
    }

    #[test]
    fn finds_unreachable_and_departed_gpus() {
        let t = tempfile::tempdir().unwrap();
        dev(t.path(), "0000:17:00.0", "0x10de\n", "0x030200\n");
        dev(t.path(), "0000:2a:00.0", "0x10de\n", "0x030000\n");
        dev(t.path(), "0000:17:00.1", "0x10de\n", "0x040300\n");
        dev(t.path(), "0000:00:1f.6", "0x8086\n", "0x020000\n");
        let mut p = Probe::new(t.path().to_path_buf());
        assert_eq!(p.gpus_on_bus().unwrap().len(), 2);
        let a = PciAddress::parse("0000:17:00.0").unwrap();
        let f = p.check(Some(&[a]));
        assert_eq!(f.len(), 1);
        assert!(f[0].title.contains("0000:2a:00.0 is missing"));
        assert!(p.check(Some(&[a])).is_empty(), "said once");
        std::fs::remove_dir_all(t.path().join("bus/pci/devices/0000:17:00.0")).unwrap();
        let f = p.check(None);
        assert_eq!(f.len(), 1);
        assert!(f[0].title.contains("left the PCI bus"));
    }
}
