//! Logging set-up: for journald, `<N>` syslog priority prefixes and no timestamps of our own (the
//! journal adds both the time and, from the prefix, the level, so `journalctl -p warning` works);
//! plain text in a terminal; JSON for log shippers. `XIDWATCH_LOG` / `RUST_LOG` select levels
//! (default `info`).

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;

/// The levels `XIDWATCH_LOG` (else `RUST_LOG`) asks for: a level, and levels per module
/// (`info,xidwatch::alert=debug`); `info` when neither is set or one does not parse (said on
/// standard error, since logging is not up yet).
fn levels() -> Targets {
    for var in ["XIDWATCH_LOG", "RUST_LOG"] {
        let Ok(text) = std::env::var(var) else {
            continue;
        };
        match text.parse::<Targets>() {
            Ok(t) => return t,
            Err(e) => {
                eprintln!("xidwatch: {var}={text:?} is not a list of levels ({e}); logging at info")
            }
        }
    }
    Targets::new().with_default(Level::INFO)
}

pub fn init(format: &str) {
    let filter = levels();
    let under_journal = std::env::var_os("JOURNAL_STREAM").is_some();
    // The builder's own ceiling (info unless told) is lifted: `filter` decides.
    let builder = tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::TRACE)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = if format == "json" {
        tracing::subscriber::set_global_default(builder.json().finish().with(filter))
    } else if under_journal {
        tracing::subscriber::set_global_default(builder.event_format(Journal).finish().with(filter))
    } else {
        tracing::subscriber::set_global_default(builder.finish().with(filter))
    };
}

/// The syslog priority journald reads from a `<N>` line prefix.
pub fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// One line per event: `<priority>message key=value ...`.
struct Journal;

impl<S, N> FormatEvent<S, N> for Journal
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(writer, "<{}>", priority(event.metadata().level()))?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_map_to_syslog_priorities() {
        assert_eq!(
            [
                Level::ERROR,
                Level::WARN,
                Level::INFO,
                Level::DEBUG,
                Level::TRACE
            ]
            .map(|l| priority(&l)),
            [3, 4, 6, 7, 7]
        );
    }
}
