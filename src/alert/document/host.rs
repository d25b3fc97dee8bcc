//! The host page: one page for several GPUs that opened the same critical fault together.

use super::{gpu_doc, AlertDocument, HostGpu, HostGroup};
use crate::model::{Incident, IncidentPhase};

impl HostGroup {
    /// The group for `lead` and `others`, with the ports above all of them read under
    /// `sysfs_root` (missing or unreadable sysfs: no shared port, still a host page).
    pub fn new(lead: &Incident, others: &[&Incident], sysfs_root: &std::path::Path) -> HostGroup {
        let all: Vec<&Incident> = std::iter::once(lead)
            .chain(others.iter().copied())
            .collect();
        let mut shared: Option<Vec<crate::model::PciAddress>> = None;
        for inc in &all {
            let ports = inc
                .pci
                .map(|p| crate::runbook::sysfs::ports_above(sysfs_root, p))
                .unwrap_or_default();
            shared = Some(match shared {
                None => ports,
                Some(s) => s.into_iter().filter(|p| ports.contains(p)).collect(),
            });
        }
        let shared_ports: Vec<String> = shared
            .unwrap_or_default()
            .iter()
            .map(|p| p.to_string())
            .collect();
        let shared = match shared_ports.first() {
            Some(p) => format!("the PCIe port {p} above all of them"),
            None => "the host (sysfs names no common PCIe port)".to_string(),
        };
        HostGroup {
            gpus: all
                .iter()
                .map(|i| HostGpu {
                    incident_id: i.id.clone(),
                    gpu: gpu_doc(i).unwrap_or_default(),
                    title: i.title.clone(),
                })
                .collect(),
            shared_ports,
            shared,
        }
    }

    /// "GPU 0 (0000:17:00.0), GPU 1 (0000:18:00.0)".
    pub fn names(&self) -> String {
        self.gpus
            .iter()
            .map(|g| {
                let pci = g.gpu.pci.as_deref().unwrap_or("unknown PCI address");
                match g.gpu.index {
                    Some(i) => format!("GPU {i} ({pci})"),
                    None => format!("GPU {pci}"),
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl AlertDocument {
    /// Makes this opening page the host page for `group`: the headline names every GPU, and
    /// the advice is about what they share, not about one card, which is what a simultaneous
    /// failure points to.
    pub fn apply_host_group(&mut self, group: HostGroup) {
        let n = group.gpus.len();
        let what = match self.xid {
            Some(x) => format!("Xid {x}"),
            None => self.kind.clone(),
        };
        self.title = format!("{n} GPUs failed together ({what}): {}", group.names());
        self.headline = format!(
            "{}{}: {} - {}",
            if self.test { "[TEST] " } else { "" },
            self.host,
            self.title,
            self.severity.as_str()
        );
        self.meaning = format!(
            "{n} GPUs reported {what} within the settle delay: {}. They share {}. A fault on several GPUs at once usually lies in what they share, not in each card. Each GPU keeps its own incident. {}",
            group.names(),
            group.shared,
            self.meaning
        );
        self.next_steps = format!(
            "Treat it as a host fault: check the PCIe switch or riser above them ({}), the power to that slot group (PSU, cabling, power events in the BMC log), and the driver (dmesg around the first error) before replacing any card. Drain the host; reseat or replace the shared part rather than each GPU.",
            if group.shared_ports.is_empty() {
                "sysfs names none".to_string()
            } else {
                group.shared_ports.join(" > ")
            }
        );
        self.host_group = Some(group);
    }
}

/// What an opening incident is in a host page.
pub enum HostRole {
    /// It carries the host page, and the other GPUs' incidents, whose runbooks run with its own.
    Lead(HostGroup, Vec<Incident>),
    /// Its opening page is folded into the host page with this incident id.
    Folded(String),
}

/// The host pages of a batch, as the engine marked them ([`Incident::host_page`]: the same
/// critical fault opening on several GPUs together): the lead carries the group, the others
/// fold into it. Keyed by incident id. A member whose lead is not in the batch (which the engine
/// never does) is paged on its own rather than lost.
pub fn host_roles(
    incidents: &[Incident],
    sysfs_root: &std::path::Path,
) -> std::collections::HashMap<String, HostRole> {
    let opened = |i: &&Incident| i.phase == IncidentPhase::Opened && !i.test;
    let mut members: std::collections::BTreeMap<&str, Vec<&Incident>> = Default::default();
    for inc in incidents.iter().filter(opened) {
        if let Some(lead) = &inc.host_page {
            members.entry(lead.as_str()).or_default().push(inc);
        }
    }
    let mut out = std::collections::HashMap::new();
    for (lead_id, others) in members {
        let Some(lead) = incidents.iter().filter(opened).find(|i| i.id == lead_id) else {
            continue;
        };
        for o in &others {
            out.insert(o.id.clone(), HostRole::Folded(lead.id.clone()));
        }
        let g = HostGroup::new(lead, &others, sysfs_root);
        let others = others.into_iter().cloned().collect();
        out.insert(lead.id.clone(), HostRole::Lead(g, others));
    }
    out
}
