//! Logging set-up: journal-friendly text (no timestamps of our own when journald adds them) or
//! JSON for log shippers. `RUST_LOG` / `XIDWATCH_LOG` select levels (default `info`).

use tracing_subscriber::EnvFilter;

pub fn init(format: &str) {
    let filter = EnvFilter::try_from_env("XIDWATCH_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let under_journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = if format == "json" {
        builder.json().try_init()
    } else if under_journal {
        builder.without_time().with_ansi(false).try_init()
    } else {
        builder.with_ansi(false).try_init()
    };
}
