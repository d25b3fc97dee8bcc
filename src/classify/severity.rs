//! How bad an AER or SXid line is, shared by the line that opens a finding and the lines that
//! continue it (`pending`).

use super::shapes::AerStatus;
use super::sxid;
use crate::model::{Detail, Finding, Severity};

/// How bad an AER recovery status is: a GPU whose link could not be recovered is gone.
/// A failed recovery or link reset on an NVIDIA device, or on the port above one, costs the GPU.
/// On a device the log never ties to an NVIDIA GPU it is another driver's problem: when a GPU
/// is below, the nvidia driver's own "can't recover" line comes first (it has no AER callbacks)
/// and ties the port to it; without it the device that could not recover is a disk, a NIC, a
/// USB or Thunderbolt controller. Recorded, not raised.
pub(super) fn status_severity(st: AerStatus, nvidia: bool) -> Severity {
    match (st, nvidia) {
        (AerStatus::RecoveryFailed | AerStatus::CantRecover, true) => Severity::Critical,
        (_, true) => Severity::Warning,
        (_, false) => Severity::Info,
    }
}

pub(super) fn class_of(f: &Finding) -> &str {
    match &f.detail {
        Some(Detail::Aer { class, .. }) => class,
        _ => "",
    }
}

/// A fatal error takes the link down: critical on a GPU, and still a warning on a device not
/// (yet) known to be one, since the GPU may be below. A non-fatal uncorrected error loses one
/// transaction and the link stays up: a warning on a GPU, and on other devices (NVMe, NICs,
/// USB and Thunderbolt controllers) another driver's business. A later line naming the GPU
/// raises the folded finding to the GPU's severity.
pub(super) fn aer_severity(class: &str, nvidia: bool) -> Severity {
    if class.starts_with("Uncorrected (Fatal)") {
        if nvidia {
            Severity::Critical
        } else {
            Severity::Warning
        }
    } else if class.starts_with("Uncorrected") && nvidia {
        Severity::Warning
    } else {
        Severity::Info
    }
}

pub(super) fn sxid_title(sxid: u32, fatal: Option<bool>) -> String {
    let what = match fatal {
        Some(true) => "fatal",
        Some(false) => "non-fatal",
        None => "severity not in the log",
    };
    match sxid::lookup(sxid) {
        Some(e) => format!("NVSwitch SXid {sxid} {} ({what})", e.name),
        None => format!("NVSwitch SXid {sxid} ({what})"),
    }
}

/// Sets an SXid finding's severity from the line's Fatal/Non-fatal word; the catalog, when it
/// knows the SXid, may make it worse, never better.
pub(super) fn set_sxid_severity(f: &mut Finding, sxid_no: u32, fatal: bool) {
    f.severity = if fatal || sxid::lookup(sxid_no).is_some_and(|e| e.fatal) {
        Severity::Critical
    } else {
        Severity::Warning
    };
    f.title = sxid_title(sxid_no, Some(fatal)).into();
    if let Some(Detail::Sxid { fatal: fl, .. }) = f.detail.as_mut() {
        *fl = fatal;
    }
}
