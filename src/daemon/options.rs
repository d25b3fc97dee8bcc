//! What a daemon run is given, the settings built from it, and the counters it keeps about its
//! sources: plain values every part of the daemon may use, so that none of them needs the
//! daemon's root module.

use std::path::PathBuf;

use crate::config::Config;

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
    /// Lines a reader failed on (a panic caught): skipped, the watch goes on.
    pub kmsg_unread: u64,
    pub kmsg_lost: u64,
    pub nvml_up: bool,
    pub gpus_seen: usize,
}

impl Output {
    /// With `--json` standard output carries the incidents: no alert channel may write there.
    pub fn stdout_taken(self) -> bool {
        self == Output::Json
    }
}
