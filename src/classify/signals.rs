//! Severity and category of the findings xidwatch's own sources raise: NVML events and failures,
//! the lost-GPU probe, a wedged driver, lost kernel log records, a refused config.
//!
//! Kernel-log findings get theirs from the line shapes and the Xid catalog; these have no line to
//! read, so the kind (and its typed detail) decides. Deciding here, in one table, means a source
//! only says what it saw, and a change of policy is one edit that `scan` and the daemon share.

use crate::model::{Category, Detail, Finding, FindingKind, Severity};

use super::catalog;

/// Sets `f`'s severity and category from its kind. Findings built from kernel-log lines are left
/// as the classifier made them; an Xid from NVML gets the catalog's verdict, as the same Xid in
/// the log would.
pub fn rate(f: &mut Finding) {
    use FindingKind as K;
    let (severity, category) = match f.kind {
        K::Xid => match f.xid {
            Some(_) => {
                catalog::apply_to(f);
                return;
            }
            // NVML's "unknown Xid": something went wrong, nothing says how badly.
            None => (Severity::Warning, Category::Driver),
        },
        K::EccError => match f.detail {
            Some(Detail::Ecc { double_bit: true }) => (Severity::Critical, Category::Memory),
            _ => (Severity::Warning, Category::Memory),
        },
        // No GPU, no work: each of these takes a GPU (or all of them) away from the jobs.
        K::GpuLost | K::GpuMissing => (Severity::Critical, Category::Pcie),
        K::NvmlUnavailable | K::DriverUnresponsive => (Severity::Critical, Category::Driver),
        K::KmsgOverrun | K::KmsgSequence | K::ConfigRejected => {
            (Severity::Warning, Category::Informational)
        }
        // Health checks. Sustained heat and hardware slowdown cost speed, not jobs: a warning.
        K::GpuTemperature | K::GpuThrottling | K::PowerOverLimit => {
            (Severity::Warning, Category::ThermalPower)
        }
        K::PcieLinkDegraded => (Severity::Warning, Category::Pcie),
        // A failed row remap means the memory can no longer be repaired in place: the board
        // needs service. Pending repairs only need the next reset.
        K::MemoryRepair => match f.detail {
            Some(Detail::MemoryRepair {
                remap_failed: true, ..
            }) => (Severity::Critical, Category::Memory),
            _ => (Severity::Warning, Category::Memory),
        },
        K::EccDbeIncrease => (Severity::Critical, Category::Memory),
        // The driver's own verdict: a reset or reboot is critical, draining P2P a warning.
        K::RecoveryAction => match &f.detail {
            Some(Detail::Recovery { to, .. }) => (to.severity(), Category::Driver),
            _ => (Severity::Critical, Category::Driver),
        },
        K::PersistenceModeOff => (Severity::Info, Category::Informational),
        K::InventoryChanged => (Severity::Warning, Category::Informational),
        // A held GPU is healthy hardware that no job can use: a warning, and the cause is a
        // process (the application side), not the board.
        K::GpuHeldNoProcess | K::GpuHeldByGoneProcess | K::GpuMemoryGrowth => {
            (Severity::Warning, Category::Application)
        }
        // Without its fabric registration a GPU on an NVSwitch system cannot start CUDA work.
        K::FabricNotRegistered => (Severity::Critical, Category::Nvlink),
        // Without Fabric Manager (or IMEX) an NVSwitch system's GPUs cannot run CUDA work at
        // all; without the persistence daemon or DCGM the GPUs still work.
        K::ServiceDown => match &f.detail {
            Some(Detail::Service { unit, .. }) if unit.starts_with("nvidia-fabricmanager") => {
                (Severity::Critical, Category::Nvlink)
            }
            Some(Detail::Service { unit, .. }) if unit.starts_with("nvidia-imex") => {
                (Severity::Critical, Category::Driver)
            }
            _ => (Severity::Warning, Category::Driver),
        },
        K::Sxid
        | K::FallenOffBus
        | K::DriverInitFailure
        | K::ApiMismatch
        | K::DriverError
        | K::PcieAer
        | K::GpuIdentity => return,
    };
    f.severity = severity;
    f.category = category;
}

/// A finding of `kind` rated by [`rate`]: what a source builds instead of choosing a severity.
pub fn finding(kind: FindingKind, detail: Option<Detail>, title: String) -> Finding {
    let mut f = Finding::new(kind, Severity::Info, Category::Informational, title);
    f.detail = detail;
    rate(&mut f);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_decides() {
        let sev = |k, d| finding(k, d, String::new()).severity;
        assert_eq!(
            sev(FindingKind::DriverUnresponsive, None),
            Severity::Critical
        );
        assert_eq!(sev(FindingKind::GpuMissing, None), Severity::Critical);
        assert_eq!(
            sev(
                FindingKind::EccError,
                Some(Detail::Ecc { double_bit: false })
            ),
            Severity::Warning
        );
        assert_eq!(
            sev(
                FindingKind::EccError,
                Some(Detail::Ecc { double_bit: true })
            ),
            Severity::Critical
        );
        let mut x = finding(FindingKind::Xid, None, "Xid".into());
        assert_eq!(
            (x.severity, x.category),
            (Severity::Warning, Category::Driver)
        );
        x.xid = Some(79);
        rate(&mut x);
        assert_eq!(
            (x.severity, x.category),
            (Severity::Critical, Category::Pcie)
        );
    }
}
