//! The health loop and the per-boot inventory, on the source side: values in, values out.
//!
//! - [`take_inventory`]: at start, this boot's inventory through the NVML worker; on a new boot it
//!   is stored and compared with the previous boot's ("changed since last boot" findings).
//! - [`health_loop`]: on its own task, like the lost-GPU probe: polls the readings through the
//!   worker (off the runtime thread, under the call deadline), judges them (`crate::health`) and
//!   checks the GPU count against the expected one; each round that says something reaches the
//!   pipeline as one [`HealthRound`]. A check that passes again is a verified end there, which
//!   ends its incident with a resolved notice.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::health::{count_findings, Checks, HealthConfig};
use crate::inventory::Stored;
use crate::model::{Finding, PciAddress};
use crate::source::nvml::NvmlWorker;
use crate::source::probe::Probe;

/// One health round, as the pipeline receives it.
#[derive(Debug)]
pub struct HealthRound {
    /// Checks that failed (for their window) and GPUs missing from the expected count.
    pub found: Vec<Finding>,
    /// Verified ends: checks that pass again, whose incidents end.
    pub ended: Vec<Finding>,
    pub gauges: HealthGauges,
}

/// The health values worth a gauge: the GPU count against the expected one, and which checks
/// are failing now on which GPU. Readings themselves (temperatures, clocks) are left to the
/// exporters built for them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HealthGauges {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_gpus: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub present_gpus: Option<u64>,
    /// `(check, pci)`: the finding kind whose condition holds now, and the GPU.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failing: Vec<(String, String)>,
}

impl HealthGauges {
    pub fn is_empty(&self) -> bool {
        *self == HealthGauges::default()
    }
}

/// This boot's inventory through the worker; stored on a new boot. Returns what is stored now
/// and the "changed since last boot" findings (only on a new boot, so a restart says nothing
/// again). Blocking: call it on a blocking thread.
pub fn take_inventory(
    worker: &NvmlWorker,
    state_dir: &std::path::Path,
    boot_hex: &str,
) -> (Option<Stored>, Vec<Finding>) {
    let stored = match crate::inventory::load_owned(state_dir) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("{e:#}; the inventory starts again from this boot");
            None
        }
    };
    if stored
        .as_ref()
        .is_some_and(|s| s.current.boot_id == boot_hex)
    {
        return (stored, Vec::new());
    }
    let (opened, vbios) = match worker.inventory() {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!("inventory: {e}; not taken this start");
            return (stored, Vec::new());
        }
    };
    let readings = worker.health_readings().unwrap_or_default();
    let fresh = crate::inventory::snapshot(boot_hex, now_ms(), &opened, &vbios, &readings);
    let (stored, new_boot) = crate::inventory::roll(stored, fresh);
    if !new_boot {
        return (Some(stored), Vec::new());
    }
    if let Err(e) = crate::inventory::save(state_dir, &stored) {
        crate::state::log_write_error("inventory", &format!("{e:#}"));
    }
    let diff = stored.diff();
    tracing::info!(
        "inventory of this boot: {} GPU(s); {} change(s) since the previous boot",
        stored.current.gpu_count,
        diff.len()
    );
    (Some(stored), crate::inventory::findings(&diff))
}

/// What the count check compares against: how many GPUs, and the addresses the baseline knew.
#[derive(Debug, Clone, Default)]
pub struct Expected {
    pub count: Option<usize>,
    pub known: Vec<PciAddress>,
}

impl Expected {
    /// `[inventory] expected_gpus`, else the previous boot's count; the addresses of the
    /// previous boot (and this one's) name the GPUs that are gone.
    pub fn from(configured: Option<usize>, stored: Option<&Stored>) -> Expected {
        let prev = stored.and_then(|s| s.previous.as_ref());
        let mut known: Vec<PciAddress> = prev
            .map(|p| p.gpus.iter().map(|g| g.pci).collect())
            .unwrap_or_default();
        if let Some(s) = stored {
            for g in &s.current.gpus {
                if !known.contains(&g.pci) {
                    known.push(g.pci);
                }
            }
        }
        Expected {
            count: configured.or_else(|| prev.map(|p| p.gpu_count)),
            known,
        }
    }
}

/// The verified end of a host-wide GPU shortfall (a `gpu_missing` naming no address): the
/// count check sees the expected number again.
fn count_back(present: usize) -> crate::model::Finding {
    let mut f = crate::model::Finding::new(
        crate::model::FindingKind::GpuMissing,
        crate::model::Severity::Info,
        crate::model::Category::Pcie,
        format!("{present} GPUs present again"),
    );
    f.message = format!("GPU count back: {present} present");
    f
}

/// The state file of the health task: what it told, for a restart in the same boot.
pub const MEMORY_FILE: &str = "health.json";

/// Where the health task keeps its memory.
#[derive(Debug, Clone)]
pub struct Keep {
    pub state_dir: PathBuf,
    pub boot_hex: String,
}

impl Keep {
    /// What an earlier run told, and whether it was of this boot (an unreadable file is said,
    /// and is nothing).
    fn load(&self) -> Option<(crate::health::Memory, bool)> {
        let path = self.state_dir.join(MEMORY_FILE);
        let text = match crate::state::file::read_bounded(
            &path,
            4 << 20,
            crate::state::file::Reader::Owner,
        ) {
            Ok(Some(t)) => t,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!("{e}; health checks start afresh");
                return None;
            }
        };
        match serde_json::from_slice::<crate::health::Memory>(&text) {
            Ok(m) => {
                let same = m.boot_id == self.boot_hex;
                Some((m, same))
            }
            Err(e) => {
                tracing::warn!("{}: {e}; health checks start afresh", path.display());
                None
            }
        }
    }

    fn save(&self, m: &crate::health::Memory) {
        let written = serde_json::to_vec(m)
            .map_err(std::io::Error::from)
            .and_then(|b| {
                crate::state::write_atomic(
                    &self.state_dir.join(MEMORY_FILE),
                    &b,
                    crate::state::STATE_FILE_MODE,
                )
            });
        if let Err(e) = written {
            crate::state::log_write_error("health", &e);
        }
    }
}

/// The health task: polls every `cfg.interval_secs`, judges, and checks the count.
pub async fn health_loop(
    cfg: HealthConfig,
    worker: Option<NvmlWorker>,
    expected: Expected,
    sysfs_root: PathBuf,
    keep: Keep,
    tx: mpsc::Sender<HealthRound>,
) {
    let mut timer = tokio::time::interval(Duration::from_secs(cfg.interval_secs));
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let start = Instant::now();
    let enabled = cfg.enabled;
    let mut checks = Checks::new(cfg);
    let mut told_missing: Vec<Option<PciAddress>> = Vec::new();
    let k = keep.clone();
    let mut saved = match tokio::task::spawn_blocking(move || k.load())
        .await
        .ok()
        .flatten()
    {
        Some((m, true)) => m,
        Some((m, false)) => {
            // A new boot: what the previous one reported goes on until it passes.
            checks.carry_over(&m);
            crate::health::Memory {
                missing: m.missing,
                ..crate::health::Memory::default()
            }
        }
        None => crate::health::Memory::default(),
    };
    checks.restore(&saved);
    told_missing.clone_from(&saved.missing);
    let mut last_gauges = HealthGauges::default();
    loop {
        timer.tick().await;
        let w = worker.clone();
        let root = sysfs_root.clone();
        let polled = tokio::task::spawn_blocking(move || {
            let readings = match (&w, enabled) {
                (Some(w), true) => w.health_readings().ok(),
                _ => None,
            };
            // What is there now: NVML's view when it answers, else the bus.
            let present: Option<Vec<PciAddress>> = match w.as_ref().map(|w| w.reachable_gpus()) {
                Some(Ok(v)) => Some(v),
                _ => Probe::new(root)
                    .gpus_on_bus()
                    .ok()
                    .map(|s| s.into_iter().collect()),
            };
            (readings, present)
        })
        .await;
        let Ok((readings, present)) = polled else {
            return;
        };
        // Without readings (NVML off, not loaded, or not answering) nothing is verified: the
        // checks' incidents stay open rather than end on silence.
        let mut found = match readings {
            Some(r) => checks.observe(&r, start.elapsed()),
            None => Vec::new(),
        };
        let mut ended = checks.take_ended();
        let gauges = HealthGauges {
            expected_gpus: expected.count.map(|c| c as u64),
            present_gpus: present.as_ref().map(|p| p.len() as u64),
            failing: checks
                .failing()
                .into_iter()
                .map(|(k, pci)| {
                    (
                        k.as_str().to_string(),
                        pci.map_or_else(String::new, |p| p.to_string()),
                    )
                })
                .collect(),
        };
        if let (Some(count), Some(present)) = (expected.count, present) {
            let missing = count_findings(count, &expected.known, &present);
            let now: Vec<Option<PciAddress>> = missing.iter().map(|f| f.pci).collect();
            for f in missing {
                if !told_missing.contains(&f.pci) {
                    found.push(f);
                }
            }
            // The count is back for a host-wide shortfall: its verified end (a lost GPU named
            // by address ends only when the probe sees the same board back).
            if told_missing.contains(&None) && !now.contains(&None) {
                ended.push(count_back(present.len()));
            }
            // A GPU that came back may be reported again if it goes.
            told_missing = now;
        }
        let mut memory = checks.memory(&keep.boot_hex);
        memory.missing.clone_from(&told_missing);
        if memory != saved {
            let (k, m) = (keep.clone(), memory.clone());
            // Before the findings go out: a crash after the page must not page again.
            let _ = tokio::task::spawn_blocking(move || k.save(&m)).await;
            saved = memory;
        }
        if found.is_empty() && ended.is_empty() && gauges == last_gauges {
            continue;
        }
        last_gauges = gauges.clone();
        if tx
            .send(HealthRound {
                found,
                ended,
                gauges,
            })
            .await
            .is_err()
        {
            return;
        }
    }
}

fn now_ms() -> u64 {
    crate::clock::wall_ms()
}
