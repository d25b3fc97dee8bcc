//! `xidwatch npd-check`: the running daemon's verdict as a node-problem-detector custom plugin.
//!
//! NPD's custom plugin protocol: the program prints one line and exits 0 (OK: condition False),
//! 1 (problem: condition True) or 2 (unknown: condition Unknown). NPD keeps at most
//! `max_output_length` bytes of the line (80 by default), so the message is cut to fit,
//! whole characters only. deploy/kubernetes/npd-xidwatch.yaml turns it into a `GPUFault` node
//! condition; xidwatch itself never talks to the Kubernetes API.
//!
//! The verdict comes from the same status `xidwatch status` reads (socket, else `status.json`):
//!
//! - a problem while an incident of at least `--min-severity` (critical by default) is open;
//!   the incident closes `[incidents] window_secs` after the fault's last repeat, and the
//!   condition goes back to False then;
//! - unknown when the daemon is not running, its status cannot be read, or its main loop has not
//!   gone round for [`HEALTH_STALE`] (a stuck daemon sees nothing, so "no fault" would be a lie);
//! - OK otherwise.

use std::path::PathBuf;

use super::status::{gather, span, state_dir, Liveness, Report};
use crate::daemon::metrics::{health, HEALTH_STALE};
use crate::model::Severity;

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

/// The exit status and the (uncut) message for what `status` found.
pub fn verdict(r: &Report, min: Severity, now: u64) -> (u8, String) {
    let snap = match (r.daemon, &r.status) {
        (Liveness::Running, Some(s)) => s,
        (Liveness::Running, None) => {
            return (
                EXIT_UNKNOWN,
                format!(
                    "unknown: xidwatch runs but its status is unreadable: {}",
                    notes(r)
                ),
            )
        }
        (Liveness::NotRunning, Some(s)) => {
            return (
                EXIT_UNKNOWN,
                format!(
                    "unknown: xidwatch is not running (last status {} ago)",
                    span(now.saturating_sub(s.taken_ms))
                ),
            )
        }
        (Liveness::NotRunning, None) => {
            return (
                EXIT_UNKNOWN,
                format!(
                    "unknown: xidwatch is not running (no status in {})",
                    r.state_dir.display()
                ),
            )
        }
        (Liveness::Unknown, _) => {
            return (
                EXIT_UNKNOWN,
                format!("unknown: cannot read xidwatch's status: {}", notes(r)),
            )
        }
    };
    // A status from a daemon too old to report its heartbeat has 0: judge by the snapshot's age.
    let beat = if snap.heartbeat_ms > 0 {
        snap.heartbeat_ms
    } else {
        snap.taken_ms
    };
    if !health(beat, now).0 {
        return (
            EXIT_UNKNOWN,
            format!(
                "unknown: xidwatch is stuck: no progress for {} (limit {})",
                span(now.saturating_sub(beat)),
                span(HEALTH_STALE.as_millis() as u64)
            ),
        );
    }
    let mut faults: Vec<_> = snap
        .open_incidents
        .iter()
        .filter(|i| i.severity >= min)
        .collect();
    // The worst first, then the most recent.
    faults.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(b.last_seen_ms.cmp(&a.last_seen_ms))
    });
    match faults.split_first() {
        Some((worst, rest)) => {
            let more = if rest.is_empty() {
                String::new()
            } else {
                format!(" (+{} more)", rest.len())
            };
            (
                EXIT_PROBLEM,
                format!("{}: {}{more}", worst.severity.as_str(), worst.title),
            )
        }
        None => {
            let nvml = if snap.nvml.up {
                String::new()
            } else {
                format!(", NVML {}", snap.nvml.state)
            };
            (
                EXIT_OK,
                format!("ok: no GPU fault open ({} GPUs{nvml})", snap.gpus.len()),
            )
        }
    }
}

fn notes(r: &Report) -> String {
    if r.notes.is_empty() {
        "no details".into()
    } else {
        r.notes.join("; ")
    }
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
