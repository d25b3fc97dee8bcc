//! What the alert stage is handed: an incident, its evidence and the catalog's words for it. The
//! lowest room of the stage; the document is built from these.

use serde::{Deserialize, Serialize};

use crate::model::{Evidence, Incident};

/// One alert as the daemon hands it over.
#[derive(Debug, Clone)]
pub struct Alert {
    pub incident: Incident,
    pub evidence: Vec<Evidence>,
    /// The catalog's words for this fault, when the classifier knows it.
    pub catalog: Option<CatalogText>,
    /// The GPU's (or host's) state when the daemon handed the alert over; `None` where no
    /// daemon judged it (`scan`, `test-alert`).
    pub gpu_state: Option<super::gpu_state::GpuStateDoc>,
}

/// The catalog's text for one fault, filled by the classify stage from NVIDIA's catalog. Plain
/// strings on purpose: the alert stage only shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogText {
    /// NVIDIA's mnemonic, e.g. `ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS`.
    pub mnemonic: String,
    /// What the fault is, in a sentence.
    pub summary: String,
    /// Usual causes (NVIDIA's trigger conditions, in the project's words).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub causes: String,
    /// What to check first.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub check: String,
    /// NVIDIA's immediate-action bucket (`RESTART_BM`, `RESET_GPU`, ...) and what it means.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub immediate_bucket: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub immediate_meaning: Option<String>,
    /// NVIDIA's investigatory-action bucket (`CONTACT_SUPPORT`, ...) and what it means.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub investigatory_bucket: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub investigatory_meaning: Option<String>,
    /// GPU families the code applies to (`A100`, `H100`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applies_to: Vec<String>,
    /// Where the text came from (catalog name and date).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
}

impl CatalogText {
    /// "Immediate: RESTART_BM (restart the machine). Then: CONTACT_SUPPORT (...)", when known.
    pub fn action_words(&self) -> Option<String> {
        let part = |bucket: &Option<String>, meaning: &Option<String>| match (bucket, meaning) {
            (Some(b), Some(m)) if !m.trim().is_empty() => Some(format!("{b} ({})", m.trim())),
            (Some(b), _) => Some(b.clone()),
            (None, Some(m)) if !m.trim().is_empty() => Some(m.trim().to_string()),
            _ => None,
        };
        let imm = part(&self.immediate_bucket, &self.immediate_meaning);
        let inv = part(&self.investigatory_bucket, &self.investigatory_meaning);
        match (imm, inv) {
            // NVIDIA gives some Xids (48, 145) one bucket for both steps: said once.
            (Some(a), Some(b)) if a == b => Some(format!("Immediate, then investigate: {a}.")),
            (Some(a), Some(b)) => Some(format!("Immediate: {a}. Then: {b}.")),
            (Some(a), None) => Some(format!("Immediate: {a}.")),
            (None, Some(b)) => Some(format!("Investigate: {b}.")),
            (None, None) => None,
        }
    }
}

/// The catalog's words (or, for findings without an Xid, xidwatch's guidance) for an incident.
pub fn catalog_text(inc: &Incident) -> CatalogText {
    use crate::classify::{catalog, guidance};
    let first = inc.findings.first();
    let g = first.map(guidance::for_finding);
    match (inc.kind, inc.xid.and_then(catalog::lookup)) {
        (crate::model::FindingKind::Xid, Some(e)) => {
            let meaning = |cell: &str| {
                let m: Vec<String> = catalog::bucket_meanings(cell)
                    .iter()
                    .map(|b| b.meaning.to_string())
                    .collect();
                (!m.is_empty()).then(|| m.join(" / "))
            };
            CatalogText {
                mnemonic: e.mnemonic.to_string(),
                summary: e.summary.to_string(),
                causes: e.causes.to_string(),
                check: g.map(|g| g.action).unwrap_or_else(|| e.check.to_string()),
                immediate_bucket: (!e.immediate.is_empty()).then(|| e.immediate.to_string()),
                immediate_meaning: meaning(e.immediate),
                investigatory_bucket: (!e.investigatory.is_empty())
                    .then(|| e.investigatory.to_string()),
                investigatory_meaning: meaning(e.investigatory),
                applies_to: e.applies_to.iter().map(|s| s.to_string()).collect(),
                source: catalog::SOURCE.to_string(),
            }
        }
        _ => {
            let g = g.unwrap_or_else(|| guidance::Guidance {
                meaning: String::new(),
                action: String::new(),
                nvidia: Vec::new(),
            });
            CatalogText {
                mnemonic: inc.kind.as_str().to_string(),
                summary: g.meaning,
                check: g.action,
                ..Default::default()
            }
        }
    }
}
