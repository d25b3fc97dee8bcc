//! The hand-off: for a page whose fault takes the GPU out of service, the exact command that drains this node in
//! the site's scheduler, for the on-call to run. Suggest-only: xidwatch never runs it, and no
//! code path here starts a process.
//!
//! Every part of the command comes from a checked value (an Xid number, a PCI address, a finding
//! kind, the hex incident id, a node name of letters, digits, `.`, `_` and `-`), never from log
//! text, so what the on-call pastes is exactly what is shown.

use crate::model::ConfigIssue;
use serde::Deserialize;

use super::document::{AlertDocument, Phase};
use crate::model::Severity;

// The page's part of the hand-off is a document type; named here as it always was.
pub use super::document::{HandoffDoc, Scheduler};

/// `[handoff]`: which scheduler the node belongs to, and its name there.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct HandoffConfig {
    pub scheduler: Scheduler,
    /// The node's name in the scheduler; the alert's host name when unset.
    pub node: Option<String>,
}

impl HandoffConfig {
    /// Checks the node name: it goes into a command line.
    pub fn validate(&self) -> Result<(), ConfigIssue> {
        match &self.node {
            Some(n) if !node_name_ok(n) => Err(ConfigIssue::new(
                "handoff.node",
                "expected a node name of letters, digits, '.', '_' and '-'",
            )),
            _ => Ok(()),
        }
    }
}

fn node_name_ok(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && !n.starts_with('-')
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// NVIDIA's immediate actions that concern the application only: the GPU and the node stay in
/// service, so nothing to drain.
const APPLICATION_ONLY: &[&str] = &["RESTART_APP", "IGNORE"];

/// Whether the fault takes this node's GPU out of service, decided from typed facts, never from
/// the guide's prose: a critical fault (not the application's own, not a resolved notice) whose
/// NVIDIA resolution bucket asks for more than restarting the application (a GPU reset, a
/// reboot, a drain, a workflow, support), or that has no bucket (a lost GPU, a driver that did
/// not initialise, a service the GPUs need: critical by xidwatch's own rules).
fn takes_gpu_out(doc: &AlertDocument) -> bool {
    if doc.severity != Severity::Critical
        || doc.phase == Phase::Resolved
        || doc.category == crate::model::Category::Application
    {
        return false;
    }
    match doc
        .catalog
        .as_ref()
        .and_then(|c| c.immediate_bucket.as_deref())
    {
        Some(bucket) => !APPLICATION_ONLY
            .iter()
            .any(|b| bucket.trim().eq_ignore_ascii_case(b)),
        None => true,
    }
}

/// The hand-off for `doc`, or `None` (no scheduler, a fault that leaves the GPU in service
/// ([`takes_gpu_out`]), or a host name that cannot be put in a command).
pub fn suggest(cfg: &HandoffConfig, doc: &AlertDocument) -> Option<HandoffDoc> {
    if cfg.scheduler == Scheduler::None || !takes_gpu_out(doc) {
        return None;
    }
    let node = cfg.node.clone().unwrap_or_else(|| doc.host.clone());
    if !node_name_ok(&node) {
        return None;
    }
    let never = "Suggested for a person to run after reading this page; xidwatch never runs it.";
    if doc.test {
        return Some(HandoffDoc {
            scheduler: cfg.scheduler,
            node,
            commands: Vec::new(),
            note: format!(
                "Test alert: no command. A real page for this fault carries the {} drain command here. {never}",
                cfg.scheduler.as_str()
            ),
        });
    }
    let fault = match doc.xid {
        Some(x) if doc.kind == "xid" => format!("Xid {x}"),
        Some(x) => format!("{} {x}", doc.kind),
        None => doc.kind.clone(),
    };
    let on = doc
        .gpu
        .as_ref()
        .and_then(|g| g.pci.as_deref())
        .map(|p| format!(" on {p}"))
        .unwrap_or_default();
    // The id is hex, the kind snake_case, the address checked: nothing here can close the quote.
    let id: String = doc
        .id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
        .collect();
    let commands = match cfg.scheduler {
        Scheduler::Slurm => vec![format!(
            "scontrol update NodeName={node} State=DRAIN Reason=\"xidwatch: {fault}{on} (incident {id})\""
        )],
        Scheduler::Kubernetes => vec![
            format!("kubectl cordon {node}"),
            format!("kubectl drain {node} --ignore-daemonsets --delete-emptydir-data"),
        ],
        Scheduler::None => return None,
    };
    Some(HandoffDoc {
        scheduler: cfg.scheduler,
        node,
        commands,
        note: never.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::document::{Generator, GpuDoc};
    use crate::model::Category;

    fn doc(next_steps: &str, severity: Severity) -> AlertDocument {
        AlertDocument {
            schema: super::super::document::SCHEMA.into(),
            id: "c62e07a398b0bdd7".into(),
            phase: Phase::Opened,
            test: false,
            host: "gpu-node-7".into(),
            boot_id: None,
            severity,
            category: Category::Pcie,
            kind: "xid".into(),
            xid: Some(79),
            title: "t".into(),
            headline: "h".into(),
            gpu: Some(GpuDoc {
                pci: Some("0000:17:00.0".into()),
                ..GpuDoc::default()
            }),
            meaning: "m".into(),
            next_steps: next_steps.into(),
            first_seen: String::new(),
            first_seen_ms: 0,
            last_seen: String::new(),
            last_seen_ms: 0,
            count: 1,
            found_at_startup: false,
            dropped_alerts_before: 0,
            echoes: Vec::new(),
            findings: Vec::new(),
            findings_omitted: 0,
            catalog: None,
            runbook_override: None,
            evidence: Vec::new(),
            evidence_note: None,
            report_path: None,
            handoff: None,
            host_group: None,
            host_page: None,
            paged_as: Vec::new(),
            gpu_state: None,
            supersedes: Vec::new(),
            generator: Generator {
                name: "xidwatch".into(),
                version: "0".into(),
            },
        }
    }

    fn cfg(s: Scheduler) -> HandoffConfig {
        HandoffConfig {
            scheduler: s,
            node: None,
        }
    }

    #[test]
    fn slurm_and_kubernetes_commands_are_exact() {
        let d = doc("1. Drain the node.", Severity::Critical);
        let h = suggest(&cfg(Scheduler::Slurm), &d).unwrap();
        assert_eq!(
            h.commands,
            ["scontrol update NodeName=gpu-node-7 State=DRAIN Reason=\"xidwatch: Xid 79 on 0000:17:00.0 (incident c62e07a398b0bdd7)\""]
        );
        assert!(h.note.contains("never runs"));
        let h = suggest(&cfg(Scheduler::Kubernetes), &d).unwrap();
        assert_eq!(
            h.commands,
            [
                "kubectl cordon gpu-node-7",
                "kubectl drain gpu-node-7 --ignore-daemonsets --delete-emptydir-data"
            ]
        );
    }

    /// Decided from typed facts: the prose of the guide plays no part.
    #[test]
    fn only_for_a_fault_that_takes_the_gpu_out() {
        let bucket = |b: &str| {
            let mut d = doc("Drain the node now.", Severity::Critical);
            d.catalog = Some(crate::alert::CatalogText {
                immediate_bucket: Some(b.to_string()),
                ..Default::default()
            });
            d
        };
        assert_eq!(
            suggest(&cfg(Scheduler::None), &doc("Drain.", Severity::Critical)),
            None
        );
        // A lost GPU (no bucket) and NVIDIA's reboot or reset: whatever the guide says.
        assert!(suggest(
            &cfg(Scheduler::Slurm),
            &doc("Watch it.", Severity::Critical)
        )
        .is_some());
        assert!(suggest(&cfg(Scheduler::Slurm), &bucket("RESTART_BM")).is_some());
        assert!(suggest(&cfg(Scheduler::Slurm), &bucket("WORKFLOW_XID_48")).is_some());
        // The application's own fault, however the prose reads.
        assert_eq!(
            suggest(&cfg(Scheduler::Slurm), &bucket("RESTART_APP")),
            None
        );
        let mut app = doc("Drain.", Severity::Critical);
        app.category = Category::Application;
        assert_eq!(suggest(&cfg(Scheduler::Slurm), &app), None);
        assert_eq!(
            suggest(&cfg(Scheduler::Slurm), &doc("Drain.", Severity::Warning)),
            None
        );
        let mut d = doc("Drain.", Severity::Critical);
        d.phase = Phase::Resolved;
        assert_eq!(suggest(&cfg(Scheduler::Slurm), &d), None);
        let mut d = doc("Drain.", Severity::Critical);
        d.test = true;
        assert!(suggest(&cfg(Scheduler::Slurm), &d)
            .unwrap()
            .commands
            .is_empty());
        let mut d = doc("Drain.", Severity::Critical);
        d.host = "bad host;rm".into();
        assert_eq!(suggest(&cfg(Scheduler::Slurm), &d), None);
    }

    #[test]
    fn a_node_name_that_is_no_name_is_refused() {
        let bad = HandoffConfig {
            scheduler: Scheduler::Slurm,
            node: Some("node 1\"".into()),
        };
        assert_eq!(bad.validate().unwrap_err().key, "handoff.node");
        let good = HandoffConfig {
            scheduler: Scheduler::Slurm,
            node: Some("gpu-node-7".into()),
        };
        assert!(good.validate().is_ok());
    }
}
