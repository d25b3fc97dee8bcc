//! `xidwatch health-check`: the host's GPU state for a scheduler's node health check (Slurm's
//! `HealthCheckProgram`, LBNL NHC through deploy/nhc/xidwatch.nhc).
//!
//! It reads the running daemon's state as `status` does (status socket, then `status.json`),
//! prints one line and exits by the state. It never drains a node or changes anything: the
//! scheduler's own script decides what a non-zero status means. Quick by design: the socket
//! gets [`SOCKET_TIMEOUT`] before the file is read, so a stuck daemon costs a fraction of a
//! second, not the scheduler's health-check interval.

use std::path::PathBuf;
use std::time::Duration;

use super::npd::fit;
use super::status::{gather_within, state_dir};
use crate::verdict::GpuState;

/// Exit status: healthy.
pub const EXIT_HEALTHY: u8 = 0;
/// Exit status: degraded (an open warning incident); the node still runs jobs.
pub const EXIT_DEGRADED: u8 = 1;
/// Exit status: failed (a GPU lost, an open critical incident, a GPU service down).
pub const EXIT_FAILED: u8 = 2;
/// Exit status: unknown (the daemon is not running, stuck, its status unreadable, the config
/// unreadable, or NVML down while a condition waits on it).
pub const EXIT_UNKNOWN: u8 = 3;
/// How long the status socket gets before `status.json` is read instead.
pub const SOCKET_TIMEOUT: Duration = Duration::from_millis(500);
/// Longest line printed: NHC and Slurm put it in a node's reason, which should stay readable.
const MAX_LINE: usize = 256;

#[derive(Debug, clap::Args)]
pub struct HealthCheckArgs {
    /// Config file; only its `[state] dir` is used.
    #[arg(long, conflicts_with = "state_dir")]
    pub config: Option<PathBuf>,
    /// The daemon's state directory (where its socket and status.json are), instead of a config.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

/// The exit status for a host state.
pub fn exit_code(state: GpuState) -> u8 {
    match state {
        GpuState::Healthy => EXIT_HEALTHY,
        GpuState::Degraded => EXIT_DEGRADED,
        GpuState::Failed => EXIT_FAILED,
        GpuState::Unknown => EXIT_UNKNOWN,
    }
}

pub fn run(args: &HealthCheckArgs) -> anyhow::Result<u8> {
    let dir = match &args.state_dir {
        Some(d) => d.clone(),
        None => match state_dir(args.config.as_deref()) {
            Ok((d, _)) => d,
            Err(e) => {
                println!(
                    "{}",
                    fit(&format!("xidwatch: unknown: config error: {e}"), MAX_LINE)
                );
                return Ok(EXIT_UNKNOWN);
            }
        },
    };
    let report = super::runtime()?.block_on(gather_within(dir, SOCKET_TIMEOUT));
    let v = &report.verdict;
    println!("{}", fit(&format!("xidwatch: {}", v.line()), MAX_LINE));
    Ok(exit_code(v.host.state))
}
