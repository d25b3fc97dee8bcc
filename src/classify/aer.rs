//! PCIe AER findings: which device an AER line is about, and how bad it is.

use super::pending::Pending;
use super::severity::{aer_severity, status_severity};
use super::shape_id as id;
use super::shapes::{AerLine, AerStatus};
use super::{base, Classifier, LineOrigin};
use crate::model::{Category, Detail, Finding, FindingKind, PciAddress};

impl Classifier {
    pub(super) fn aer(&mut self, a: AerLine, msg: &str, at: &LineOrigin, out: &mut Vec<Finding>) {
        let near = |last: Option<(PciAddress, u64)>| {
            last.filter(|(_, l)| at.line == 0 || at.line <= l + 8)
                .map(|(p, _)| p)
        };
        if a.driver == "nvidia" {
            self.note_nvidia(a.reporter);
            // A port's AER lines just before the GPU's own: the port is above this GPU.
            if let Some(port) = near(self.last_port_aer) {
                self.port_gpu.entry(port).or_insert(a.reporter);
            }
            self.last_nvidia_aer = Some((a.reporter, at.line));
        } else {
            if let Some(gpu) = near(self.last_nvidia_aer) {
                self.port_gpu.entry(a.reporter).or_insert(gpu);
            }
            if let Some(src) = a.source.filter(|s| *s != a.reporter) {
                if self.nvidia_devices.contains(&src) || a.nvidia_device {
                    self.port_gpu.entry(a.reporter).or_insert(src);
                }
            }
            self.last_port_aer = Some((a.reporter, at.line));
        }
        if a.nvidia_device {
            self.note_nvidia(a.source.unwrap_or(a.reporter));
        }
        // The device the line is about: the named source, else the GPU below the reporting port,
        // else the reporter itself.
        let gpu_below = self.port_gpu.get(&a.reporter).copied();
        let device = match a.source {
            Some(s) if s != a.reporter => s,
            _ => gpu_below.unwrap_or(a.reporter),
        };
        let nvidia = self.nvidia_devices.contains(&device);
        if let Some(st) = a.status {
            let mut f = base(
                id::AER_STATUS,
                FindingKind::PcieAer,
                status_severity(st, nvidia),
                Category::Pcie,
                &format!(
                    "PCIe AER: {} on {device}",
                    match st {
                        AerStatus::RecoveryFailed => "device recovery failed",
                        AerStatus::LinkReset => "link reset",
                        AerStatus::CantRecover => "the driver cannot recover from the error",
                    }
                ),
                msg,
                at,
            );
            f.pci = Some(device);
            f.message = a.text;
            f.detail = Some(Detail::Aer {
                reporter: (a.reporter != device).then_some(a.reporter),
                class: match st {
                    AerStatus::RecoveryFailed => "recovery failed",
                    AerStatus::LinkReset => "link reset",
                    AerStatus::CantRecover => "no recovery (the driver has no error handler)",
                }
                .into(),
            });
            out.push(self.enrich(f));
            return;
        }
        if a.source.is_none() && a.class.is_none() {
            // A detail line with no "error received" before it: nothing to attach to.
            return;
        }
        let class = a.class.clone().unwrap_or_else(|| "unspecified".into());
        let mut f = base(
            id::AER,
            FindingKind::PcieAer,
            aer_severity(&class, nvidia),
            Category::Pcie,
            &format!(
                "PCIe AER: {} error on {}",
                class.to_ascii_lowercase(),
                device
            ),
            msg,
            at,
        );
        f.pci = Some(device);
        f.message = a.text;
        f.detail = Some(Detail::Aer {
            reporter: (a.reporter != device).then_some(a.reporter),
            class,
        });
        self.pending = Some(Pending::Aer {
            finding: f,
            reporter: a.reporter,
            last_line: at.line,
        });
    }
}
