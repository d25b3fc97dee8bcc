//! What one step gave, before it becomes a [`StepResult`](crate::model::StepResult).

use std::time::Duration;

use crate::model::StepStatus;

pub(super) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(super) struct Outcome {
    pub(super) status: StepStatus,
    pub(super) output: String,
    pub(super) bytes_dropped: u64,
    pub(super) notes: Vec<String>,
}

impl Outcome {
    pub(super) fn status(status: StepStatus) -> Outcome {
        Outcome {
            status,
            output: String::new(),
            bytes_dropped: 0,
            notes: Vec::new(),
        }
    }
}
