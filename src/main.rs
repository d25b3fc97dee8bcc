//! The `xidwatch` binary: parse arguments, run, turn an error into exit status 2.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // First, before any secret is read: no core dump, no /proc/PID/environ or memory for other
    // programs of the same user; env: secrets leave the environment once read.
    if let Err(e) = xidwatch::process_guard::protect_process() {
        eprintln!("xidwatch: warning: cannot make the process non-dumpable: {e}");
    }
    let cli = xidwatch::cli::Cli::parse();
    match xidwatch::cli::run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("xidwatch: error: {e:#}");
            ExitCode::from(xidwatch::cli::EXIT_ERROR)
        }
    }
}
