//! NVSwitch findings: SXid lines and Fabric Manager's errors.

use super::pending::Pending;
use super::shapes::SxidLine;
use super::xid::link_number;
use super::{base, fabricmanager, sxid, Classifier, LineOrigin};
use crate::model::{Category, Detail, Finding, FindingKind, Severity};

impl Classifier {
    pub(super) fn sxid(&mut self, s: SxidLine, msg: &str, at: &LineOrigin) {
        let mut f = base(
            FindingKind::Sxid,
            Severity::Warning,
            Category::Nvlink,
            "",
            msg,
            at,
        );
        f.xid = Some(s.sxid);
        f.pci = s.pci;
        f.detail = Some(Detail::Sxid {
            fatal: s.fatal.unwrap_or(false),
            link: link_number(&s.rest),
            continuation: Vec::new(),
        });
        match s.fatal {
            Some(fatal) => set_sxid_severity(&mut f, s.sxid, fatal),
            None => {
                f.title = sxid_title(s.sxid, None);
            }
        }
        f.message = s.rest;
        self.pending = Some(Pending::Sxid {
            finding: f,
            switch: s.switch,
            last_line: at.line,
        });
    }

    /// A Fabric Manager error. Its NVSwitch errors are SXids (named from the SXid catalog, the
    /// switch as the finding's device, the port as its link); its own failures stop every CUDA
    /// job on an NVSwitch system, so they are critical though no Xid follows.
    pub(super) fn fabric_manager(
        &mut self,
        ev: fabricmanager::FmEvent,
        msg: &str,
        at: &LineOrigin,
    ) -> Finding {
        use fabricmanager::FmEvent;
        let title = match ev {
            FmEvent::SwitchError {
                fatal,
                sxid: no,
                switch,
                physical_id,
                port,
            } => {
                let mut f = base(
                    FindingKind::Sxid,
                    Severity::Warning,
                    Category::Nvlink,
                    "",
                    msg,
                    at,
                );
                f.xid = Some(no);
                f.pci = switch;
                f.detail = Some(Detail::Sxid {
                    fatal,
                    link: port,
                    continuation: Vec::new(),
                });
                set_sxid_severity(&mut f, no, fatal);
                let mut where_ = String::new();
                if let Some(p) = physical_id {
                    where_ += &format!(" switch {p}");
                }
                if let Some(p) = port {
                    where_ += &format!(" port {p}");
                }
                f.title = format!("{}{where_}, reported by Fabric Manager", f.title);
                return self.enrich(f);
            }
            FmEvent::Aborted { topology: true } => {
                "Fabric Manager aborted: the NVSwitch topology it found is not one it supports"
            }
            FmEvent::Aborted { topology: false } => "Fabric Manager aborted",
            FmEvent::GpuHandleMissing => {
                "Fabric Manager cannot find a GPU of the job's NVLink multicast team"
            }
            FmEvent::SwitchDriverRequestFailed => {
                "Fabric Manager's request to the NVSwitch driver failed"
            }
            FmEvent::OtherError => "Fabric Manager error",
        };
        let sev = if matches!(ev, FmEvent::OtherError) {
            Severity::Warning
        } else {
            Severity::Critical
        };
        base(
            FindingKind::DriverError,
            sev,
            Category::Nvlink,
            title,
            msg,
            at,
        )
    }
}

pub(super) fn finding_sxid_unknown(f: &Finding) -> bool {
    f.title.ends_with("(severity not in the log)")
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
    f.title = sxid_title(sxid_no, Some(fatal));
    if let Some(Detail::Sxid { fatal: fl, .. }) = f.detail.as_mut() {
        *fl = fatal;
    }
}
