//! The checks that judge one reading each: temperature, hardware throttling, the PCIe link
//! under load, memory repair, ECC, NVML's recovery action and power. Each raises its finding once
//! its condition has held for its window and reports its verified end once it has passed for that
//! window again ([`super::Clearing`]).

use super::*;

pub(super) fn temperature(
    cfg: &HealthConfig,
    st: &mut GpuState,
    r: &GpuReading,
    now: Duration,
    out: &mut Vec<Finding>,
    ends: &mut Vec<Finding>,
) {
    let Some(t) = r.temp_c else { return };
    let limit = temperature_limit(cfg, r);
    if t < limit {
        st.hot_since = None;
        let window = Duration::from_secs(cfg.temperature.sustain_secs);
        if st.hot_clear.passed(st.hot_told, now, window, 1) {
            st.hot_told = false;
            ended(FindingKind::GpuTemperature, r, ends);
        }
        return;
    }
    st.hot_clear.reset();
    let since = *st.hot_since.get_or_insert(now);
    let held = now.saturating_sub(since);
    if !st.hot_told && held >= Duration::from_secs(cfg.temperature.sustain_secs) {
        st.hot_told = true;
        let slowdown = r
            .slowdown_c
            .map_or(String::new(), |s| format!(", slowdown at {s} °C"));
        out.push(finding(
            FindingKind::GpuTemperature,
            None,
            r,
            format!("GPU at {t} °C for {} s (limit {limit} °C)", held.as_secs()),
            format!(
                "temperature {t} °C, at or above {limit} °C for {} s{slowdown}",
                held.as_secs()
            ),
        ));
    }
}

pub(super) fn throttling(
    cfg: &HealthConfig,
    st: &mut GpuState,
    r: &GpuReading,
    out: &mut Vec<Finding>,
    ends: &mut Vec<Finding>,
) {
    let Some(bits) = r.throttle else { return };
    let hw = bits & (THROTTLE_HW_SLOWDOWN | THROTTLE_HW_THERMAL | THROTTLE_HW_POWER_BRAKE);
    if hw == 0 {
        st.throttle_polls = 0;
        if st.throttle_clear.passed(
            st.throttle_told,
            Duration::ZERO,
            Duration::ZERO,
            cfg.throttling.polls,
        ) {
            st.throttle_told = false;
            ended(FindingKind::GpuThrottling, r, ends);
        }
        return;
    }
    st.throttle_clear.reset();
    st.throttle_polls += 1;
    if !st.throttle_told && st.throttle_polls >= cfg.throttling.polls {
        st.throttle_told = true;
        let mut names = Vec::new();
        if hw & THROTTLE_HW_SLOWDOWN != 0 {
            names.push("HW slowdown");
        }
        if hw & THROTTLE_HW_THERMAL != 0 {
            names.push("HW thermal slowdown");
        }
        if hw & THROTTLE_HW_POWER_BRAKE != 0 {
            names.push("HW power brake");
        }
        let names = names.join(", ");
        out.push(finding(
            FindingKind::GpuThrottling,
            None,
            r,
            format!("GPU slowed down by the hardware: {names}"),
            format!(
                "throttle reasons {bits:#x} ({names}) active for {} polls in a row",
                st.throttle_polls
            ),
        ));
    }
}

pub(super) fn pcie_link(
    cfg: &HealthConfig,
    st: &mut GpuState,
    r: &GpuReading,
    out: &mut Vec<Finding>,
    ends: &mut Vec<Finding>,
) {
    let (Some(g), Some(gm), Some(w), Some(wm)) =
        (r.link_gen, r.link_gen_max, r.link_width, r.link_width_max)
    else {
        return;
    };
    st.best_gen = st.best_gen.max(g);
    st.best_width = st.best_width.max(w);
    let busy = r
        .util_pct
        .is_some_and(|u| u >= cfg.pcie_link.busy_util_percent);
    if !busy {
        // Idle: the link may be down to save power. Neither counts nor clears.
        return;
    }
    if g >= gm && w >= wm {
        st.link_polls = 0;
        // Busy polls at the maximum, as many in a row as it took to raise it.
        if st.link_clear.passed(
            st.link_told,
            Duration::ZERO,
            Duration::ZERO,
            cfg.pcie_link.polls,
        ) {
            st.link_told = false;
            ended(FindingKind::PcieLinkDegraded, r, ends);
        }
        return;
    }
    st.link_clear.reset();
    st.link_polls += 1;
    if !st.link_told && st.link_polls >= cfg.pcie_link.polls {
        st.link_told = true;
        out.push(finding(
            FindingKind::PcieLinkDegraded,
            None,
            r,
            format!("PCIe link at Gen{g} x{w}, below its maximum Gen{gm} x{wm}, under load"),
            format!(
                "PCIe link Gen{g} x{w} of Gen{gm} x{wm} with the GPU {}% busy, for {} busy polls; highest seen since start Gen{} x{}",
                r.util_pct.unwrap_or(0),
                st.link_polls,
                st.best_gen,
                st.best_width
            ),
        ));
    }
}

pub(super) fn memory_repair(
    st: &mut GpuState,
    r: &GpuReading,
    out: &mut Vec<Finding>,
    ends: &mut Vec<Finding>,
) {
    let pending = r.remap.is_some_and(|m| m.pending);
    let failed = r.remap.is_some_and(|m| m.failed);
    let pages = r.pages_pending == Some(true);
    let now = (pending, failed, pages);
    if !pending && !failed && !pages {
        if st.repair_clear.passed(
            st.repair_told.is_some(),
            Duration::ZERO,
            Duration::ZERO,
            CLEAR_POLLS,
        ) {
            st.repair_told = None;
            ended(FindingKind::MemoryRepair, r, ends);
        }
        return;
    }
    st.repair_clear.reset();
    if st.repair_told == Some(now) {
        return;
    }
    st.repair_told = Some(now);
    let mut what = Vec::new();
    if failed {
        what.push("row remapping failed");
    }
    if pending {
        what.push("row remapping pending");
    }
    if pages {
        what.push("pages pending retirement");
    }
    let counts = r.remap.map_or(String::new(), |m| {
        format!(
            "; remapped rows: {} correctable, {} uncorrectable",
            m.correctable, m.uncorrectable
        )
    });
    out.push(finding(
        FindingKind::MemoryRepair,
        Some(Detail::MemoryRepair {
            remap_pending: pending,
            remap_failed: failed,
            pages_pending: pages,
        }),
        r,
        format!("GPU memory needs repair: {}", what.join(", ")),
        format!("{}{counts}", what.join(", ")),
    ));
}

pub(super) fn ecc(st: &mut GpuState, r: &GpuReading, out: &mut Vec<Finding>) {
    let Some(n) = r.dbe_volatile else { return };
    let before = st.dbe_last.replace(n);
    if let Some(b) = before {
        if n > b {
            out.push(finding(
                FindingKind::EccDbeIncrease,
                None,
                r,
                format!("Uncorrectable ECC errors went up by {}", n - b),
                format!("volatile double-bit ECC count {b} -> {n}"),
            ));
        }
    }
}

/// NVML's recovery action values (`nvmlDeviceGpuRecoveryAction_t`, in `nvml.h`'s order): 0 to 4
/// since the field appeared, then `NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN` (5), then
/// `NVML_GPU_RECOVERY_ACTION_BUS_RESET` (6) and `NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT` (7), added
/// in NVML v615 (NVML API change log; the numbers as NVIDIA's own generated bindings,
/// `cuda.bindings.nvml.DeviceGpuRecoveryAction`, give them). A value this version does not know
/// is kept and shown as its number, never taken for "none".
pub(super) fn recovery_of(v: u32) -> RecoveryAction {
    match v {
        0 => RecoveryAction::None,
        1 => RecoveryAction::GpuReset,
        2 => RecoveryAction::NodeReboot,
        3 => RecoveryAction::DrainP2p,
        4 => RecoveryAction::DrainAndReset,
        5 => RecoveryAction::RecoverImexDomain,
        6 => RecoveryAction::BusReset,
        7 => RecoveryAction::SystemReboot,
        other => RecoveryAction::Other(format!("recovery action {other}")),
    }
}

pub(super) fn recovery(
    st: &mut GpuState,
    r: &GpuReading,
    out: &mut Vec<Finding>,
    ends: &mut Vec<Finding>,
) {
    let Some(v) = r.recovery else { return };
    if v == 0 {
        if st.recovery_clear.passed(
            st.recovery_told.is_some(),
            Duration::ZERO,
            Duration::ZERO,
            CLEAR_POLLS,
        ) {
            st.recovery_told = None;
            ended(FindingKind::RecoveryAction, r, ends);
        }
        return;
    }
    st.recovery_clear.reset();
    if st.recovery_told == Some(v) {
        return;
    }
    st.recovery_told = Some(v);
    let to = recovery_of(v);
    let words = to.describe();
    out.push(finding(
        FindingKind::RecoveryAction,
        Some(Detail::Recovery {
            from: RecoveryAction::None,
            to,
        }),
        r,
        format!("NVML asks for a recovery action: {words}"),
        format!("GPU recovery action (field {}) = {v}: {words}", 230),
    ));
}

pub(super) fn power(
    cfg: &HealthConfig,
    st: &mut GpuState,
    r: &GpuReading,
    now: Duration,
    out: &mut Vec<Finding>,
    ends: &mut Vec<Finding>,
) {
    let (Some(p), Some(l)) = (r.power_mw, r.limit_mw) else {
        return;
    };
    let over = u64::from(l) * (100 + u64::from(cfg.power.margin_percent)) / 100;
    if u64::from(p) <= over || l == 0 {
        st.power_since = None;
        let window = Duration::from_secs(cfg.power.sustain_secs);
        if st.power_clear.passed(st.power_told, now, window, 1) {
            st.power_told = false;
            ended(FindingKind::PowerOverLimit, r, ends);
        }
        return;
    }
    st.power_clear.reset();
    let since = *st.power_since.get_or_insert(now);
    let held = now.saturating_sub(since);
    if !st.power_told && held >= Duration::from_secs(cfg.power.sustain_secs) {
        st.power_told = true;
        out.push(finding(
            FindingKind::PowerOverLimit,
            None,
            r,
            format!(
                "GPU draws {} W over its {} W limit for {} s",
                p / 1000,
                l / 1000,
                held.as_secs()
            ),
            format!(
                "power draw {p} mW above the enforced limit {l} mW (+{}%) for {} s",
                cfg.power.margin_percent,
                held.as_secs()
            ),
        ));
    }
}
