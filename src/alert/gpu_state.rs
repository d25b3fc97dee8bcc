//! What a page says about the GPU's state beside the fault: the same answer `status`,
//! `npd-check` and `GET /verdict` give at the time the alert was handed over, so a resolved
//! notice for one fault on a GPU that is still failed for another does not read as "all well".

use serde::{Deserialize, Serialize};

/// The GPU's state (or, for a host-level incident, the host's) when the alert was handed over.
/// Plain strings and ids: the alert stage only shows them, and the daemon fills them from the
/// verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuStateDoc {
    /// `healthy`, `degraded`, `unknown` or `failed`.
    pub state: String,
    /// The reasons for exactly that state, as the verdict words them, the oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// The open incidents among the reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub incidents: Vec<String>,
}

impl GpuStateDoc {
    /// "failed (GPU 3 fell off the bus)", "healthy".
    pub fn words(&self) -> String {
        match self.reasons.first() {
            None => self.state.clone(),
            Some(r) if self.reasons.len() == 1 => format!("{} ({r})", self.state),
            Some(r) => format!("{} ({r}, and {} more)", self.state, self.reasons.len() - 1),
        }
    }
}
