//! `[health]`, `[inventory]` and `[history]` in the config: every check can be turned off, every
//! threshold set; the defaults and why they avoid false alarms are in docs/health.md.

use crate::model::ConfigIssue;
use serde::Deserialize;

/// `[health]`
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// All health checks (not the Xid watch, not the lost-GPU probe).
    pub enabled: bool,
    /// How often the readings are polled.
    pub interval_secs: u64,
    pub temperature: TemperatureCheck,
    pub throttling: ThrottlingCheck,
    pub pcie_link: PcieLinkCheck,
    pub memory_repair: Toggle,
    pub ecc: Toggle,
    pub recovery_action: Toggle,
    pub power: PowerCheck,
    pub persistence_mode: Toggle,
    pub gpu_held: GpuHeldCheck,
    pub memory_growth: MemoryGrowthCheck,
    pub fabric: FabricCheck,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            enabled: true,
            interval_secs: 30,
            temperature: TemperatureCheck::default(),
            throttling: ThrottlingCheck::default(),
            pcie_link: PcieLinkCheck::default(),
            memory_repair: Toggle::default(),
            ecc: Toggle::default(),
            recovery_action: Toggle::default(),
            power: PowerCheck::default(),
            persistence_mode: Toggle::default(),
            gpu_held: GpuHeldCheck::default(),
            memory_growth: MemoryGrowthCheck::default(),
            fabric: FabricCheck::default(),
        }
    }
}

/// `[health.gpu_held]`: a GPU busy or holding memory with no process listed, or held by a pid
/// that is gone or a zombie.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct GpuHeldCheck {
    pub enabled: bool,
    /// Utilization at or above which a GPU without processes counts as held.
    pub busy_util_percent: u32,
    /// Memory in use above which a GPU without processes counts as held (the driver keeps a few
    /// hundred MiB for itself).
    pub memory_floor_mib: u64,
    /// How long the condition must hold before a report, and be gone before the episode ends.
    pub sustain_secs: u64,
}

impl Default for GpuHeldCheck {
    fn default() -> Self {
        GpuHeldCheck {
            enabled: true,
            busy_util_percent: 50,
            memory_floor_mib: 2048,
            sustain_secs: 600,
        }
    }
}

/// `[health.memory_growth]`: one process's GPU memory rising through a whole long window. Off
/// by default: caching allocators grow for long stretches on purpose.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryGrowthCheck {
    pub enabled: bool,
    /// The window the memory must rise through without a fall.
    pub sustain_secs: u64,
    /// The least it must have grown over the window.
    pub min_growth_mib: u64,
}

impl Default for MemoryGrowthCheck {
    fn default() -> Self {
        MemoryGrowthCheck {
            enabled: false,
            sustain_secs: 3600,
            min_growth_mib: 1024,
        }
    }
}

/// `[health.fabric]`: NVSwitch / NVL fabric registration not complete, or failed.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct FabricCheck {
    pub enabled: bool,
    pub sustain_secs: u64,
}

impl Default for FabricCheck {
    fn default() -> Self {
        FabricCheck {
            enabled: true,
            sustain_secs: 300,
        }
    }
}

/// A check with no threshold: on or off.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Toggle {
    pub enabled: bool,
}

impl Default for Toggle {
    fn default() -> Self {
        Toggle { enabled: true }
    }
}

/// `[health.temperature]`
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct TemperatureCheck {
    pub enabled: bool,
    pub threshold_celsius: u32,
    /// The limit is also at most the GPU's own slowdown threshold minus this.
    pub slowdown_margin_celsius: u32,
    pub sustain_secs: u64,
}

impl Default for TemperatureCheck {
    fn default() -> Self {
        TemperatureCheck {
            enabled: true,
            threshold_celsius: 85,
            slowdown_margin_celsius: 5,
            sustain_secs: 300,
        }
    }
}

/// `[health.throttling]`
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ThrottlingCheck {
    pub enabled: bool,
    /// Polls in a row with a hardware slowdown reason active.
    pub polls: u32,
}

impl Default for ThrottlingCheck {
    fn default() -> Self {
        ThrottlingCheck {
            enabled: true,
            polls: 4,
        }
    }
}

/// `[health.pcie_link]`
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct PcieLinkCheck {
    pub enabled: bool,
    /// GPU utilization at or above which the link is judged (below it, an idle GPU may lower
    /// its link to save power).
    pub busy_util_percent: u32,
    /// Busy polls in a row below the maximum.
    pub polls: u32,
}

impl Default for PcieLinkCheck {
    fn default() -> Self {
        PcieLinkCheck {
            enabled: true,
            busy_util_percent: 30,
            polls: 2,
        }
    }
}

/// `[health.power]`
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct PowerCheck {
    pub enabled: bool,
    /// Draw must exceed the enforced limit by more than this (sensor noise and short boosts).
    pub margin_percent: u32,
    pub sustain_secs: u64,
}

impl Default for PowerCheck {
    fn default() -> Self {
        PowerCheck {
            enabled: true,
            margin_percent: 5,
            sustain_secs: 300,
        }
    }
}

/// `[inventory]`
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct InventoryConfig {
    /// GPUs this machine must have; unset: the previous boot's count (the baseline).
    pub expected_gpus: Option<usize>,
}

/// `[history]`
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct HistoryConfig {
    /// Events older than this are dropped.
    pub retention_days: u64,
    /// At most this many events are kept (the oldest go first).
    pub max_events: usize,
    /// "How often before" counts over this window.
    pub window_days: u64,
    /// The repeat-offender rule.
    pub repeat: RepeatRule,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig {
            retention_days: 90,
            max_events: 10_000,
            window_days: 30,
            repeat: RepeatRule::default(),
        }
    }
}

/// `[history.repeat]`: the same fault of at least `min_severity` `count` times within
/// `window_days` on one board raises the guidance to "replace the board / open an RMA".
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RepeatRule {
    pub enabled: bool,
    pub count: u32,
    pub window_days: u64,
    pub min_severity: crate::model::Severity,
}

impl Default for RepeatRule {
    fn default() -> Self {
        RepeatRule {
            enabled: true,
            count: 2,
            window_days: 30,
            min_severity: crate::model::Severity::Critical,
        }
    }
}

/// Checks the values that have a range; the message names the key.
pub fn validate(
    h: &HealthConfig,
    i: &InventoryConfig,
    hist: &HistoryConfig,
) -> Result<(), ConfigIssue> {
    let range = |key: &str, v: u64, lo: u64, hi: u64| {
        if v < lo || v > hi {
            Err(ConfigIssue::new(key, format!("expected {lo} to {hi}")))
        } else {
            Ok(())
        }
    };
    range("health.interval_secs", h.interval_secs, 1, 3600)?;
    range(
        "health.temperature.threshold_celsius",
        u64::from(h.temperature.threshold_celsius),
        30,
        130,
    )?;
    range(
        "health.temperature.slowdown_margin_celsius",
        u64::from(h.temperature.slowdown_margin_celsius),
        0,
        50,
    )?;
    range(
        "health.temperature.sustain_secs",
        h.temperature.sustain_secs,
        0,
        86_400,
    )?;
    range(
        "health.throttling.polls",
        u64::from(h.throttling.polls),
        1,
        1000,
    )?;
    range(
        "health.pcie_link.busy_util_percent",
        u64::from(h.pcie_link.busy_util_percent),
        1,
        100,
    )?;
    range(
        "health.pcie_link.polls",
        u64::from(h.pcie_link.polls),
        1,
        1000,
    )?;
    range(
        "health.power.margin_percent",
        u64::from(h.power.margin_percent),
        0,
        100,
    )?;
    range("health.power.sustain_secs", h.power.sustain_secs, 0, 86_400)?;
    range(
        "health.gpu_held.busy_util_percent",
        u64::from(h.gpu_held.busy_util_percent),
        1,
        100,
    )?;
    range(
        "health.gpu_held.memory_floor_mib",
        h.gpu_held.memory_floor_mib,
        0,
        16 << 20,
    )?;
    range(
        "health.gpu_held.sustain_secs",
        h.gpu_held.sustain_secs,
        0,
        86_400,
    )?;
    range(
        "health.memory_growth.sustain_secs",
        h.memory_growth.sustain_secs,
        1,
        7 * 86_400,
    )?;
    range(
        "health.memory_growth.min_growth_mib",
        h.memory_growth.min_growth_mib,
        1,
        16 << 20,
    )?;
    range(
        "health.fabric.sustain_secs",
        h.fabric.sustain_secs,
        0,
        86_400,
    )?;
    if let Some(n) = i.expected_gpus {
        range("inventory.expected_gpus", n as u64, 1, 1024)?;
    }
    range("history.retention_days", hist.retention_days, 1, 3650)?;
    range("history.max_events", hist.max_events as u64, 10, 1_000_000)?;
    range("history.window_days", hist.window_days, 1, 3650)?;
    range(
        "history.repeat.count",
        u64::from(hist.repeat.count),
        2,
        1000,
    )?;
    range(
        "history.repeat.window_days",
        hist.repeat.window_days,
        1,
        3650,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_key_is_named_when_out_of_range() {
        let text = "[health]\ninterval_secs = 0\n";
        let e = crate::config::Config::from_toml(text, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("health.interval_secs:") && !e.contains("= 0"),
            "{e}"
        );
        let text = "[health.pcie_link]\nbusy_util_percent = 101\n";
        let e = crate::config::Config::from_toml(text, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("health.pcie_link.busy_util_percent"), "{e}");
        let text = "[history.repeat]\ncount = 1\n";
        let e = crate::config::Config::from_toml(text, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("history.repeat.count"), "{e}");
        let text = "[health.temperature]\nthreshold = 80\n";
        let e = crate::config::Config::from_toml(text, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("threshold"), "unknown keys are refused: {e}");
        let text = "[health.temperature]\nenabled = false\n[inventory]\nexpected_gpus = 8\n[history.repeat]\nmin_severity = \"warning\"\n";
        let c = crate::config::Config::from_toml(text, None).unwrap();
        assert!(!c.health.temperature.enabled);
        assert_eq!(c.inventory.expected_gpus, Some(8));
        assert_eq!(
            c.history.repeat.min_severity,
            crate::model::Severity::Warning
        );
    }
}
