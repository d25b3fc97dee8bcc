//! The command line: argument definitions and one module per subcommand.
//!
//! Each subcommand returns an [`ExitCode`]-like number; errors travel up as `anyhow::Error` and
//! are printed once, with their whole chain, by `main`.

pub mod explain;
pub mod install;
pub mod render;
pub mod scan;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Exit status for "something went wrong" (unreadable file, bad config), as grep tools use it.
pub const EXIT_ERROR: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "xidwatch",
    version,
    about = "Watches the kernel log and NVML for GPU faults, explains them, and never reboots anything."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Classify saved kernel logs (dmesg, journalctl -k, kern.log, kmsg dumps, .gz archives).
    Scan(ScanArgs),
    /// Explain an Xid: meaning, causes, what to check, NVIDIA's resolution buckets.
    Explain(ExplainArgs),
    /// Install the binary, systemd unit, user, default config and runbooks (as root).
    Install(install::InstallArgs),
    /// Remove what `install` put in place; the config and state stay unless --purge.
    Uninstall(install::UninstallArgs),
}

#[derive(Debug, clap::Args)]
pub struct ScanArgs {
    /// Print JSON Lines, one object per finding.
    #[arg(long)]
    pub json: bool,
    /// Files to read; standard input when none is given or for `-`.
    pub files: Vec<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// The Xid number.
    #[arg(required_unless_present = "list")]
    pub xid: Option<u32>,
    /// List every Xid in the catalog.
    #[arg(long)]
    pub list: bool,
}

/// Runs a parsed command line; returns the process exit status.
pub fn run(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Scan(args) => scan::run(&args),
        Command::Explain(args) => explain::run(&args),
        Command::Install(args) => install::install(&args),
        Command::Uninstall(args) => install::uninstall(&args),
    }
}
