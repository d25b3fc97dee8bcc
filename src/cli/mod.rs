//! The command line: argument definitions and one module per subcommand.
//!
//! Each subcommand returns an [`ExitCode`]-like number; errors travel up as `anyhow::Error` and
//! are printed once, with their whole chain, by `main`.

pub mod explain;
pub mod gpus;
pub mod health_check;
pub mod install;
pub mod json;
pub mod logging;
pub mod npd;
pub mod render;
pub mod run;
pub mod runbook;
pub mod scan;
pub mod status;

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
    /// Log format on standard error: `text` (no timestamps under journald) or `json`.
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Classify saved kernel logs (dmesg, journalctl -k, kern.log, kmsg dumps, .gz archives).
    Scan(ScanArgs),
    /// Explain an Xid: meaning, causes, what to check, NVIDIA's resolution buckets.
    #[command(override_usage = "xidwatch explain <XID>\n       xidwatch explain --list")]
    Explain(ExplainArgs),
    /// Run the watcher: follow the kernel log and NVML, report incidents.
    Run(RunArgs),
    /// Validate a config (and its runbooks and alert channels) without starting anything.
    Check(CheckArgs),
    /// Send a clearly marked synthetic incident through the configured alert channels.
    TestAlert(TestAlertArgs),
    /// List, show or run the read-only diagnostic runbooks.
    #[command(subcommand)]
    Runbook(RunbookCommand),
    /// Install the binary, systemd unit, user, default config and runbooks (as root).
    Install(install::InstallArgs),
    /// Remove what `install` put in place; the config and state stay unless --purge.
    Uninstall(install::UninstallArgs),
    /// Is the daemon running, and what does it see? Exit 0 running, 3 not running, 4 unknown,
    /// 78 config error.
    #[command(
        after_help = "Exit status:\n  0   the daemon is running\n  3   the daemon is not running\n  4   whether it runs cannot be told (permissions, unreadable state)\n  78  the config could not be loaded"
    )]
    Status(status::StatusArgs),
    /// node-problem-detector custom plugin: exit 0 no GPU fault, 1 fault open, 2 unknown.
    NpdCheck(npd::NpdCheckArgs),
    /// Node health check for Slurm's HealthCheckProgram and NHC: one line, exit 0 healthy,
    /// 1 degraded, 2 failed, 3 unknown. Reads the daemon's state; changes nothing.
    #[command(after_help = "Exit status:
  0  healthy: no open warning or critical incident
  1  degraded: an open warning incident
  2  failed: a GPU lost, an open critical incident, or a GPU service down
  3  unknown: the daemon is not running or stuck, its status cannot be read, or NVML is down while a condition waits on it")]
    HealthCheck(health_check::HealthCheckArgs),
    /// This boot's GPU inventory as the daemon stored it, or (--diff) what changed since the
    /// previous boot.
    Inventory(gpus::InventoryArgs),
    /// Each GPU's faults across restarts and reboots.
    History(gpus::HistoryArgs),
}

#[derive(Debug, Subcommand)]
pub enum RunbookCommand {
    /// Every runbook in force, with what it serves.
    List {
        /// Config file whose `[runbooks]` are listed (default: the installed one, else the
        /// shipped runbooks).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// One runbook in full: what it serves, its words for the on-call, its steps.
    Show {
        /// The runbook's name, as `xidwatch runbook list` prints it.
        name: String,
        /// Config file whose `[runbooks]` are searched.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Run a runbook now against this machine and print the evidence (read-only, as the daemon
    /// runs it).
    Run {
        /// The runbook's name, as `xidwatch runbook list` prints it.
        name: String,
        /// The GPU, by PCI address (e.g. 0000:17:00.0): fills {pci} and {parent_pci}.
        #[arg(long, value_name = "ADDRESS")]
        pci: Option<String>,
        /// The Xid the run is about: fills {xid}.
        #[arg(long)]
        xid: Option<u32>,
        /// A process the fault named: fills {pid} (its /proc entries).
        #[arg(long)]
        pid: Option<u32>,
        /// Config file whose `[runbooks]` (directories, search path, limits) apply.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
pub struct TestAlertArgs {
    /// Config file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Only this channel (by name).
    #[arg(long)]
    pub channel: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Config file (default: /etc/xidwatch/xidwatch.toml if it exists, else built-in defaults).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print incidents on standard output as JSON Lines instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Config file to check.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// Exit status for a configuration error (sysexits' EX_CONFIG); the systemd unit does not restart
/// on it, since a restart cannot fix a typo.
pub const EXIT_CONFIG: u8 = 78;

#[derive(Debug, clap::Args)]
pub struct ScanArgs {
    /// Print JSON Lines, one object per finding.
    #[arg(long)]
    pub json: bool,
    /// Files to read; standard input when none is given or for `-`.
    pub files: Vec<PathBuf>,
    /// Also run the matching runbooks for the findings, on this machine now, with this config
    /// (`-` for the built-in defaults); the evidence is labelled as this machine's, today.
    #[arg(long, value_name = "CONFIG")]
    pub runbooks: Option<PathBuf>,
    /// Read the site's own shapes and silences (`[[classify.shape]]`, `[[classify.silence]]`)
    /// from this config; without it, from the `--runbooks` config when one is given.
    #[arg(long, value_name = "CONFIG")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// The Xid number (the SXid number with --sxid).
    #[arg(required_unless_present = "list")]
    pub xid: Option<u32>,
    /// List every Xid in the catalog (every SXid with --sxid).
    #[arg(long)]
    pub list: bool,
    /// The number is an NVSwitch SXid (catalog from NVIDIA's Fabric Manager guide).
    #[arg(long)]
    pub sxid: bool,
}

/// Loads the config for a subcommand; on error prints it (file, line, key) and gives the exit
/// status to return.
pub fn load_config(path: Option<&std::path::Path>) -> Result<crate::config::Config, u8> {
    crate::config::Config::load(path).map_err(|e| {
        eprintln!("xidwatch: config error: {e}");
        EXIT_CONFIG
    })
}

/// [`load_config`] for a command that sends nothing: an alert channel that cannot be built (a
/// secret's environment variable unset outside the service) is a warning, not a refusal.
pub fn load_config_sending_nothing(
    path: Option<&std::path::Path>,
) -> Result<crate::config::Config, u8> {
    match crate::config::Config::load_sending_nothing(path) {
        Ok(c) => {
            if let Some(why) = &c.channels_left_out {
                eprintln!(
                    "xidwatch: warning: the alert channels are left out ({why}); this command sends nothing"
                );
            }
            Ok(c)
        }
        Err(e) => {
            eprintln!("xidwatch: config error: {e}");
            Err(EXIT_CONFIG)
        }
    }
}

/// A runtime for one subcommand: single-threaded, timers and I/O on.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Runs a parsed command line; returns the process exit status.
pub fn run(cli: Cli) -> anyhow::Result<u8> {
    logging::init(&cli.log_format);
    match cli.command {
        Command::Scan(args) => scan::run(&args),
        Command::Explain(args) => explain::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Check(args) => run::check(&args),
        Command::TestAlert(args) => run::test_alert(&args),
        Command::Runbook(cmd) => runbook::run(cmd),
        Command::Install(args) => install::install(&args),
        Command::Uninstall(args) => install::uninstall(&args),
        Command::Status(args) => status::run(&args),
        Command::NpdCheck(args) => npd::run(&args),
        Command::HealthCheck(args) => health_check::run(&args),
        Command::Inventory(args) => gpus::inventory(&args),
        Command::History(args) => gpus::history(&args),
    }
}
