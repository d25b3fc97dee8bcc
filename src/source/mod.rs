//! Sources: where raw kernel log text and NVML signals come from.

pub mod fabricmanager;
pub mod file;
pub mod health;
pub mod kmsg;
pub mod mapped;
pub mod nvml;
pub mod probe;
pub mod services;
