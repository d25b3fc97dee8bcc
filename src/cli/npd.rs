//! `xidwatch npd-check`: the running daemon's verdict as a node-problem-detector custom plugin.
//!
//! NPD's custom plugin protocol: the program prints one line and exits 0 (OK: condition False),
//! 1 (problem: condition True) or 2 (unknown: condition Unknown). NPD keeps at most
//! `max_output_length` bytes of the line (80 by default), so the message is cut to fit,
//! whole characters only. deploy/kubernetes/npd-xidwatch.yaml turns it into a `GPUFault` node
//! condition; xidwatch itself never talks to the Kubernetes API.
//!
//! The verdict is the host's state ([`crate::verdict`]) from the same status `xidwatch status`
//! reads (socket, else `status.json`):
//!
//! - a problem while the host is `failed` (a GPU lost or with an open critical incident, a
//!   service down): for as long as that lasts, not for an incident window; with
//!   `--min-severity warning` also while it is `degraded`;
//! - unknown while it is `unknown`: the daemon is not running, its status cannot be read, its
//!   main loop has not gone round for a minute (a stuck daemon sees nothing, so "no fault"
//!   would be a lie), or NVML is down while a health condition waits on it;
//! - OK otherwise.

use std::path::PathBuf;

use super::status::{gather, state_dir, verdict_of, Report};
use crate::model::Severity;
use crate::verdict::GpuState;

/// Exit status: no GPU fault (condition False).
pub const EXIT_OK: u8 = 0;
/// Exit status: a GPU fault is open (condition True).
pub const EXIT_PROBLEM: u8 = 1;
/// Exit status: cannot tell (condition Unknown).
pub const EXIT_UNKNOWN: u8 = 2;
/// NPD's default `max_output_length`.
pub const DEFAULT_MAX_LEN: u16 = 80;

#[derive(Debug, clap::Args)]
pub struct NpdCheckArgs {
    /// Config file; only its `[state] dir` is used.
    #[arg(long, conflicts_with = "state_dir")]
    pub config: Option<PathBuf>,
    /// The daemon's state directory (where its socket and status.json are), instead of a config:
    /// NPD's pod mounts the node's /var/lib/xidwatch and has no xidwatch config.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// The least severe open incident that counts as a problem.
    #[arg(long, default_value = "critical", value_parser = ["info", "warning", "critical"])]
    pub min_severity: String,
    /// Longest message printed, in bytes (NPD's `max_output_length`).
    #[arg(long, default_value_t = DEFAULT_MAX_LEN, value_parser = clap::value_parser!(u16).range(16..))]
    pub max_len: u16,
}

pub fn run(args: &NpdCheckArgs) -> anyhow::Result<u8> {
    let dir = match &args.state_dir {
        Some(d) => d.clone(),
        None => match state_dir(args.config.as_deref()) {
            Ok((d, _)) => d,
            Err(e) => {
                let (code, msg) = (EXIT_UNKNOWN, format!("unknown: config error: {e}"));
                println!("{}", fit(&msg, usize::from(args.max_len)));
                return Ok(code);
            }
        },
    };
    let min = match args.min_severity.as_str() {
        "info" => Severity::Info,
        "warning" => Severity::Warning,
        _ => Severity::Critical,
    };
    let report = super::runtime()?.block_on(gather(dir));
    let (code, msg) = verdict(&report, min, now_ms());
    println!("{}", fit(&msg, usize::from(args.max_len)));
    Ok(code)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The exit status and the (uncut) message for what `status` found. The host's state
/// ([`crate::verdict`]) decides, so the condition stays True for as long as a GPU is failed:
/// failed is a problem, unknown is Unknown, degraded is a problem only with
/// `--min-severity warning` (or info, which also counts open info incidents), healthy is OK.
pub fn verdict(r: &Report, min: Severity, now: u64) -> (u8, String) {
    let v = verdict_of(r, now);
    let open_info = r
        .status
        .as_ref()
        .is_some_and(|s| s.open_incidents_total > 0);
    let problem = match v.host.state {
        GpuState::Failed => true,
        GpuState::Unknown => return (EXIT_UNKNOWN, v.line()),
        GpuState::Degraded => min <= Severity::Warning,
        GpuState::Healthy => min == Severity::Info && open_info,
    };
    if problem && v.host.state == GpuState::Healthy {
        // Only info incidents: name the most recent one.
        if let Some(i) = r
            .status
            .as_ref()
            .and_then(|s| s.open_incidents.iter().max_by_key(|i| i.last_seen_ms))
        {
            return (EXIT_PROBLEM, format!("info: {}", i.title));
        }
    }
    if problem {
        return (EXIT_PROBLEM, v.line());
    }
    let (gpus, nvml) = match &r.status {
        Some(s) if !s.nvml.up => (s.gpus.len(), format!(", NVML {}", s.nvml.state)),
        Some(s) => (s.gpus.len(), String::new()),
        None => (0, String::new()),
    };
    let degraded = if v.host.state == GpuState::Degraded {
        format!(", degraded: {}", v.host.reasons.len())
    } else {
        String::new()
    };
    (
        EXIT_OK,
        format!("ok: no GPU fault open ({gpus} GPUs{nvml}{degraded})"),
    )
}

/// One line of at most `max` bytes: line breaks become spaces, and a longer message is cut at a
/// character boundary and ends in "...".
pub fn fit(msg: &str, max: usize) -> String {
    let one: String = msg
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one.len() <= max {
        return one;
    }
    let mut end = max.saturating_sub(3);
    while !one.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", one[..end].trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_cuts_at_a_character_boundary_and_flattens_lines() {
        assert_eq!(fit("short", 80), "short");
        assert_eq!(fit("a\nb", 80), "a b");
        let long = "é".repeat(100);
        let cut = fit(&long, 80);
        assert!(cut.len() <= 80, "{}", cut.len());
        assert!(cut.ends_with("..."));
        assert_eq!(fit(&"x".repeat(81), 80).len(), 80);
    }
}
