//! What a daemon run is given, the settings built from it, and the counters it keeps about its
//! sources: plain values every part of the daemon may use, so that none of them needs the
//! daemon's root module.

use std::path::PathBuf;

use crate::config::Config;
use crate::host::alert_host;
use crate::incident::EngineConfig;

/// Where `run` sends incidents when no alert channel takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// The readable report, for a terminal or the journal.
    Text,
    /// One JSON object per incident.
    Json,
}

/// Options of one daemon run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub config: Config,
    pub output: Output,
    /// `/proc/sys/kernel/random/boot_id`, replaceable for tests.
    pub boot_id_path: PathBuf,
    /// `/proc/stat`, whose `btime` dates kernel log records; replaceable for tests, which set the
    /// boot's time to make a record as old as they need.
    pub boot_time_path: PathBuf,
}

/// Counters the daemon keeps about its sources.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct SourceStats {
    pub kmsg_records: u64,
    pub kmsg_userspace_ignored: u64,
    pub kmsg_malformed: u64,
    pub kmsg_lost: u64,
    pub nvml_up: bool,
    pub gpus_seen: usize,
}

/// The incident engine's settings from `[incidents]`: at start-up and, swapped in, on reload.
pub(super) fn engine_config(cfg: &Config, boot_id: String) -> EngineConfig {
    EngineConfig {
        window_ms: cfg.incidents.window_secs.saturating_mul(1000),
        max_open: cfg.incidents.max_open,
        nvml_match_ms: cfg.incidents.nvml_match_ms,
        host: alert_host(cfg.incidents.host.as_deref()),
        boot_id,
        overrides: cfg.overrides.clone(),
        settle_ms: cfg.incidents.settle_ms,
        quiet_ms: cfg.incidents.quiet_secs.saturating_mul(1000),
        remind_ms: cfg.incidents.remind_secs.saturating_mul(1000),
    }
}
