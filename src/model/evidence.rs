//! [`Evidence`]: what a runbook found on this machine for one incident.

use serde::Serialize;

/// The outcome of one runbook step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum StepStatus {
    /// The program exited (any code) or the file was read.
    Done {
        #[serde(skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
    },
    /// Killed, with its whole process group, when the step's timeout ran out.
    TimedOut { after_ms: u64 },
    /// The program is not installed (or the file does not exist).
    Missing { what: String },
    /// Not run: a placeholder had no value for this incident, or the runbook budget ran out.
    Skipped { reason: String },
    /// It could not run for another reason (permission, spawn failure, ...).
    Failed { error: String },
}

/// One step's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepResult {
    pub name: String,
    /// `run`, `read`, `kmsg` or `nvml`.
    pub kind: String,
    /// The argv as run, or the path read, after placeholder substitution.
    pub target: Vec<String>,
    #[serde(flatten)]
    pub status: StepStatus,
    /// Captured output (stdout then stderr), up to the step's cap, lossily decoded.
    pub output: String,
    /// Bytes of output beyond the cap, counted and dropped.
    pub bytes_dropped: u64,
    pub duration_ms: u64,
    /// What the output means, when the runbook could tell (e.g. a degraded link).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// The evidence one runbook gathered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Evidence {
    pub runbook: String,
    /// What this fault usually means, for the on-call (from the runbook's human part).
    pub meaning: String,
    /// What to do next, in plain words.
    pub next_steps: String,
    pub steps: Vec<StepResult>,
    /// Wall-clock start, milliseconds since the Unix epoch.
    pub started_ms: u64,
    pub duration_ms: u64,
    /// Host the evidence was gathered on; `scan` labels evidence of "this machine now".
    pub host: String,
}

impl Evidence {
    /// No step failed or ran out of time (a missing program or a skipped step is not a failure
    /// of the runbook).
    pub fn ran_clean(&self) -> bool {
        !self.steps.iter().any(|s| {
            matches!(
                s.status,
                StepStatus::Failed { .. } | StepStatus::TimedOut { .. }
            )
        })
    }

    /// A note as evidence of its own, so every channel shows it like a runbook's finding.
    pub fn note(runbook: &str, step: &str, note: &str, host: &str, now_ms: u64) -> Evidence {
        Evidence {
            runbook: runbook.into(),
            meaning: String::new(),
            next_steps: String::new(),
            steps: vec![StepResult {
                name: step.into(),
                kind: "note".into(),
                target: Vec::new(),
                status: StepStatus::Done { exit_code: None },
                output: format!("{note}\n"),
                bytes_dropped: 0,
                duration_ms: 0,
                notes: vec![note.to_string()],
            }],
            started_ms: now_ms,
            duration_ms: 0,
            host: host.to_string(),
        }
    }
}
