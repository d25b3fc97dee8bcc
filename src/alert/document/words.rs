//! Wording shared by every rendering of a page (the report, Slack, email, Alertmanager): kinds,
//! durations and times (the clock's), in one place so they read the same everywhere.

/// A finding kind in words for pages ("PCIe AER error", not `pcie_aer`); the JSON keeps the
/// stable kind names for programs.
pub fn kind_words(kind: &str, xid: Option<u32>) -> String {
    match (kind, xid) {
        ("xid", Some(x)) => return format!("Xid {x}"),
        ("sxid", Some(x)) => return format!("SXid {x}"),
        _ => {}
    }
    let words = match kind {
        "xid" => "Xid",
        "sxid" => "SXid",
        "fallen_off_bus" => "GPU fell off the bus",
        "driver_init_failure" => "driver initialisation failure",
        "api_mismatch" => "driver API mismatch",
        "driver_error" => "driver error",
        "pcie_aer" => "PCIe AER error",
        "gpu_identity" => "GPU identity",
        "kmsg_overrun" => "kernel log records lost",
        "kmsg_sequence" => "kernel log sequence gap",
        "ecc_error" => "ECC error",
        "gpu_lost" => "GPU lost",
        "gpu_missing" => "GPU missing",
        "nvml_unavailable" => "NVML unavailable",
        "config_rejected" => "config refused",
        "driver_unresponsive" => "driver not responding",
        "gpu_temperature" => "GPU temperature",
        "gpu_throttling" => "GPU clocks slowed down",
        "pcie_link_degraded" => "PCIe link degraded",
        "memory_repair" => "GPU memory repair",
        "ecc_dbe_increase" => "uncorrectable ECC errors rising",
        "recovery_action" => "GPU recovery action",
        "power_over_limit" => "power over the limit",
        "persistence_mode_off" => "persistence mode off",
        "inventory_changed" => "GPU inventory changed",
        "service_down" => "GPU service down",
        other => return other.replace('_', " "),
    };
    words.to_string()
}

// Durations and times belong to the clock, which every room may read.
pub use crate::clock::{duration_words, rfc3339};
