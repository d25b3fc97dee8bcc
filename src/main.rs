//! The `xidwatch` binary: parse arguments, run, turn an error into exit status 2.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = xidwatch::cli::Cli::parse();
    match xidwatch::cli::run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("xidwatch: error: {e:#}");
            ExitCode::from(xidwatch::cli::EXIT_ERROR)
        }
    }
}
