//! NVSwitch findings: SXid lines and Fabric Manager's errors.

use super::pending::Pending;
use super::severity::{set_sxid_severity, sxid_title};
use super::shape_id as id;
use super::shapes::SxidLine;
use super::xid::link_number;
use super::{base, fabricmanager, Classifier, LineOrigin};
use crate::model::{Category, Detail, Finding, FindingKind, Severity};

impl Classifier {
    pub(super) fn sxid(&mut self, s: SxidLine, msg: &str, at: &LineOrigin) {
        let mut f = base(
            id::SXID,
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
                f.title = sxid_title(s.sxid, None).into();
            }
        }
        f.message = s.rest;
        self.pending = Some(Pending::Sxid {
            finding: f,
            switch: s.switch,
            severity_known: s.fatal.is_some(),
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
        let (shape, title) = match ev {
            FmEvent::SwitchError {
                fatal,
                sxid: no,
                switch,
                physical_id,
                port,
            } => {
                let mut f = base(
                    id::FM_SXID,
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
                f.title = format!("{}{where_}, reported by Fabric Manager", f.title).into();
                return self.enrich(f);
            }
            FmEvent::Aborted { topology: true } => (
                id::FM_ABORTED_TOPOLOGY,
                "Fabric Manager aborted: the NVSwitch topology it found is not one it supports",
            ),
            FmEvent::Aborted { topology: false } => (id::FM_ABORTED, "Fabric Manager aborted"),
            FmEvent::GpuHandleMissing => (
                id::FM_GPU_HANDLE,
                "Fabric Manager cannot find a GPU of the job's NVLink multicast team",
            ),
            FmEvent::SwitchDriverRequestFailed => (
                id::FM_SWITCH_DRIVER,
                "Fabric Manager's request to the NVSwitch driver failed",
            ),
            FmEvent::OtherError => (id::FM_ERROR, "Fabric Manager error"),
        };
        let sev = if matches!(ev, FmEvent::OtherError) {
            Severity::Warning
        } else {
            Severity::Critical
        };
        base(
            shape,
            FindingKind::DriverError,
            sev,
            Category::Nvlink,
            title,
            msg,
            at,
        )
    }
}
