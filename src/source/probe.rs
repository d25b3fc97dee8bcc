//! The lost-GPU probe: compares the NVIDIA GPUs on the PCI bus (sysfs) with what NVML reaches.
//!
//! A GPU can vanish without a word in the kernel log we would recognise (the log overran, the
//! driver wedged). Reading sysfs is cheap and needs no privileges. [`probe_loop`] runs the probe
//! on its own task and asks the NVML worker what it reaches (on a blocking thread, under the
//! call deadline), so the pipeline only ever receives values: one [`ProbeRound`] per round that
//! found something or that NVML answered. `classify::signals` rates what it finds.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::classify::signals;
use crate::model::{Finding, FindingKind, PciAddress};
use crate::source::nvml::NvmlWorker;

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

/// One probe round, as the pipeline receives it.
#[derive(Debug)]
pub struct ProbeRound {
    /// GPUs missing from NVML's view or gone from the bus.
    pub found: Vec<Finding>,
    /// What the probe remembers after the round (saved with the daemon's checkpoint).
    pub memory: Memory,
    /// The round as evidence for ending lost-GPU incidents, when NVML answered it.
    pub verified: Option<crate::model::Verification>,
}

/// How often the worker is looked at for a call that overran its limit with nobody waiting for
/// it (an event wait that never returns): the probe may run only every few minutes.
const STUCK_CHECK: Duration = Duration::from_secs(1);

/// The lost-GPU probe, on its own task: NVML's answer is awaited here (on a blocking thread that
/// returns within the call deadline), never on the pipeline. Also looks at the worker every
/// [`STUCK_CHECK`].
pub async fn probe_loop(
    mut probe: Probe,
    worker: Option<NvmlWorker>,
    every: Duration,
    tx: mpsc::Sender<ProbeRound>,
    rounds: Arc<AtomicU64>,
) {
    let mut timer = tokio::time::interval(every);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = probe.memory();
    let mut stuck_check = tokio::time::interval(STUCK_CHECK);
    stuck_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = timer.tick() => {}
            _ = stuck_check.tick(), if worker.is_some() => {
                let w = worker.clone();
                // A report scans procfs: not on the runtime thread.
                let _ = tokio::task::spawn_blocking(move || w.map(|w| w.check())).await;
                rounds.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        }
        let w = worker.clone();
        let round = tokio::task::spawn_blocking(move || {
            // Taken before NVML is asked: a finding after this is not answered by this round.
            let at_mono_ms = crate::clock::Now::read().mono_ms;
            // A stuck or failing NVML says nothing about which GPUs are reachable: only the bus
            // is compared then (the stuck driver is its own finding), and nothing is verified.
            let reached = w.and_then(|w| w.reached_gpus().ok());
            let reachable: Option<Vec<_>> =
                reached.as_ref().map(|r| r.iter().map(|g| g.pci).collect());
            let found = probe.check(reachable.as_deref());
            let verified = reached.and_then(|reached| {
                let on_bus = probe.gpus_on_bus().ok()?.into_iter().collect();
                Some(crate::model::Verification {
                    at_mono_ms,
                    on_bus,
                    reached,
                })
            });
            (probe, found, verified)
        })
        .await;
        let Ok((back, found, verified)) = round else {
            return;
        };
        probe = back;
        let memory = probe.memory();
        // Every round NVML answered goes to the pipeline: it is what ends a lost GPU's incident.
        if (!found.is_empty() || memory != last || verified.is_some())
            && tx
                .send(ProbeRound {
                    found,
                    memory: memory.clone(),
                    verified,
                })
                .await
                .is_err()
        {
            return;
        }
        // Counted once the pipeline has the round: a status reader that sees the count grow
        // knows the rounds before it were handed over.
        rounds.fetch_add(1, Ordering::Relaxed);
        last = memory;
    }
}

/// Which PCIe port sits above which GPU (from sysfs), for the ports with exactly one GPU below:
/// an AER error the kernel reports on a root or switch port is then tied to that GPU, and an
/// error on a port above several cannot be pinned on one of them.
pub fn ports_of_single_gpus(sysfs_root: &std::path::Path) -> Vec<(PciAddress, PciAddress)> {
    let Ok(gpus) = Probe::new(sysfs_root.to_path_buf()).gpus_on_bus() else {
        return Vec::new();
    };
    let mut below: std::collections::BTreeMap<PciAddress, Vec<PciAddress>> = Default::default();
    for gpu in &gpus {
        for port in crate::runbook::sysfs::ports_above(sysfs_root, *gpu) {
            below.entry(port).or_default().push(*gpu);
        }
    }
    below
        .into_iter()
        .filter_map(|(port, gpus)| match gpus[..] {
            [gpu] => Some((port, gpu)),
            _ => None,
        })
        .collect()
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
