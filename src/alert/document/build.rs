//! The one place a page is assembled: the document built from the alert (with the catalog's
//! text, the repeat-offender line, the inventory and history evidence and the runbook's steps),
//! then the note on its evidence, the host group it stands for, and the hand-off.

use super::{AlertDocument, HostGroup};
use crate::alert::handoff::{self, HandoffConfig};
use crate::alert::input::Alert;

/// Assembles every page the alert stage sends, in one order and in one place: the document from
/// the alert, the note on its evidence, the host group it stands for, then the hand-off (which
/// reads the finished page). A new alert, its late evidence and `test-alert` all come here, so
/// they cannot make different pages from the same facts.
#[derive(Debug, Clone, Default)]
pub struct PageBuilder {
    /// `[handoff]`: the drain command put in pages whose fault takes the GPU out of service.
    pub handoff: HandoffConfig,
}

impl PageBuilder {
    pub fn new(handoff: HandoffConfig) -> PageBuilder {
        PageBuilder { handoff }
    }

    /// The page for `alert`: `evidence_note` says why evidence is missing, `host` makes it the
    /// host page of a group.
    pub fn page(
        &self,
        alert: &Alert,
        evidence_note: Option<String>,
        host: Option<HostGroup>,
    ) -> AlertDocument {
        let mut doc = AlertDocument::build(alert);
        doc.evidence_note = evidence_note;
        if let Some(g) = host {
            doc.apply_host_group(g);
        }
        doc.handoff = handoff::suggest(&self.handoff, &doc);
        doc
    }
}
