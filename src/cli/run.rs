//! `xidwatch run` and `xidwatch check`.

use super::{CheckArgs, RunArgs, EXIT_CONFIG, EXIT_ERROR};
use crate::config::Config;
use crate::daemon::{self, Output, RunOptions};

pub fn run(args: &RunArgs) -> anyhow::Result<u8> {
    let config = match Config::load(args.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("xidwatch: config error: {e}");
            return Ok(EXIT_CONFIG);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let opts = RunOptions {
        config,
        output: if args.json {
            Output::Json
        } else {
            Output::Text
        },
        boot_id_path: std::env::var_os("XIDWATCH_BOOT_ID_PATH")
            .map(Into::into)
            .unwrap_or_else(|| "/proc/sys/kernel/random/boot_id".into()),
    };
    match rt.block_on(daemon::run(opts)) {
        Ok(()) => Ok(0),
        Err(e) => {
            eprintln!("xidwatch: error: {e:#}");
            Ok(EXIT_ERROR)
        }
    }
}

pub fn check(args: &CheckArgs) -> anyhow::Result<u8> {
    match Config::load(args.config.as_deref()) {
        Ok(c) => {
            match &c.source {
                Some(p) => println!("{}: ok", p.display()),
                None => println!("no config file; built-in defaults: ok"),
            }
            Ok(0)
        }
        Err(e) => {
            eprintln!("xidwatch: config error: {e}");
            Ok(EXIT_CONFIG)
        }
    }
}
