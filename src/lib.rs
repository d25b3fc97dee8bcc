//! xidwatch: watches the kernel log and NVML for GPU faults, groups them into incidents, runs
//! read-only runbooks and sends alerts with the evidence attached. It never reboots, resets,
//! unloads or reconfigures anything.
//!
//! The pipeline, one module per stage:
//! `source` (kmsg, NVML, files) -> `classify` (catalog + line shapes) -> `incident` -> `runbook`
//! -> `alert`. `model` holds the typed values that travel between them.

pub mod alert;
pub mod classify;
pub mod cli;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod health;
pub mod history;
pub mod host;
pub mod incident;
pub mod inventory;
pub mod model;
pub mod runbook;
pub mod source;
pub mod state;
