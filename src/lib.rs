//! xidwatch: watches the kernel log and NVML for GPU faults, groups them into incidents, runs
//! read-only runbooks and sends alerts with the evidence attached. It never reboots, resets,
//! unloads or reconfigures anything.
//!
//! The pipeline, one module per stage:
//! `source` (kmsg, NVML, files) -> `classify` (catalog + line shapes) -> `incident` -> `runbook`
//! -> `alert`. `model` holds the typed values that travel between them.
//!
//! Exported: what the binary (`cli`) and the integration tests use. The clock, the state
//! directory, the incident engine and the daemon's inner actors are the crate's own.

pub mod alert;
pub mod classify;
pub mod cli;
pub(crate) mod clock;
pub mod config;
pub mod daemon;
pub(crate) mod decimal;
pub(crate) mod files;
pub mod health;
pub mod history;
pub(crate) mod host;
pub(crate) mod incident;
pub mod inventory;
pub mod model;
pub mod process_guard;
pub mod runbook;
pub mod source;
pub(crate) mod state;
pub mod status;
pub mod verdict;
