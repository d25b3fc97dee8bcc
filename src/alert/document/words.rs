//! Wording shared by every rendering of a page (the report, Slack, email, Alertmanager): kinds,
//! durations and times, in one place so they read the same everywhere.

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

/// "42 s", "5 min", "3 h".
pub fn duration_words(ms: u64) -> String {
    let s = ms / 1000;
    if s < 120 {
        format!("{s} s")
    } else if s < 2 * 3600 {
        format!("{} min", s / 60)
    } else {
        format!("{} h", s / 3600)
    }
}

/// Milliseconds since the Unix epoch as RFC 3339 UTC with milliseconds.
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let millis = ms % 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}
