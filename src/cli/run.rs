//! `xidwatch run` and `xidwatch check`.

use super::{CheckArgs, RunArgs, TestAlertArgs, EXIT_CONFIG, EXIT_ERROR};
use crate::config::Config;
use crate::daemon::{self, Output, RunOptions};

pub fn run(args: &RunArgs) -> anyhow::Result<u8> {
    let config = match super::load_config(args.config.as_deref()) {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let rt = super::runtime()?;
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
        boot_time_path: std::env::var_os("XIDWATCH_BOOT_TIME_PATH")
            .map(Into::into)
            .unwrap_or_else(|| crate::source::kmsg::time::PROC_STAT.into()),
    };
    // The signal handlers first: a stop requested while the daemon is built (NVML can take
    // seconds to open) is a clean shutdown once the loop runs.
    let running = rt.block_on(async {
        let (shutdown, hangup) = daemon::signals::install()?;
        let built = daemon::build(&opts, hangup).await?;
        daemon::run(built, shutdown).await
    });
    match running {
        Ok(()) => Ok(0),
        Err(e) => {
            eprintln!("xidwatch: error: {e:#}");
            // A state directory others can write to is a setup error, as a config one is: a
            // restart cannot fix it, so the unit must not loop on it.
            if e.downcast_ref::<crate::state::UnsafeStateDir>().is_some() {
                return Ok(EXIT_CONFIG);
            }
            Ok(EXIT_ERROR)
        }
    }
}

pub fn check(args: &CheckArgs) -> anyhow::Result<u8> {
    match Config::load(args.config.as_deref()) {
        Ok(c) => {
            for w in c.alerts.secret_warnings(c.source.as_deref()) {
                println!("warning: {w}");
            }
            for w in c.alerts.cleartext_warnings() {
                println!("warning: {w}");
            }
            for w in &c.metrics_settings.warnings {
                println!("warning: {w}");
            }
            let channels = c.alerts.channels();
            match &c.source {
                Some(p) => println!("{}: ok", p.display()),
                None => println!("no config file; built-in defaults: ok"),
            }
            println!(
                "alert channels: {}",
                channels
                    .iter()
                    .map(|ch| format!("{} ({})", ch.name, ch.kind.as_str()))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            // The runbooks were loaded and every step checked against the catalog above (a
            // refused one fails the load): say which are in force, and from where.
            let dirs: Vec<String> = c
                .runbooks
                .dirs()
                .iter()
                .map(|d| d.display().to_string())
                .collect();
            let names: Vec<&str> = c.runbook_set.iter().map(|r| r.name()).collect();
            println!(
                "runbooks: {} checked against the command catalog, from {}: {}",
                names.len(),
                dirs.join(", "),
                names.join(", ")
            );
            // What holds the steps to reading whatever they are: the kernel's confinement, as
            // this kernel offers it to this process (the daemon's own is in `status`).
            println!(
                "runbook steps confined by: {}",
                crate::runbook::confine::Support::probe()
            );
            // The site's own shapes and silences, each checked against its example lines.
            let site = c.site_shapes.rows();
            let (silences, shapes): (Vec<_>, Vec<_>) = site.iter().partition(|r| r.silence);
            println!(
                "site shapes: {} added{}, {} silenced (each read its examples as written)",
                shapes.len(),
                if shapes.is_empty() {
                    String::new()
                } else {
                    format!(
                        " ({})",
                        shapes.iter().map(|r| r.id).collect::<Vec<_>>().join(", ")
                    )
                },
                silences.len()
            );
            // The built-in shapes as this binary compiles them: a pattern that does not compile
            // here reads nothing, silently, wherever the daemon or `scan` runs.
            let builtin = crate::classify::table::Table::builtin();
            let broken = builtin.uncompiled();
            if !broken.is_empty() {
                for (id, e) in &broken {
                    eprintln!("xidwatch: built-in shape {id} does not compile in this build: {e}");
                }
                return Ok(1);
            }
            println!(
                "built-in shapes: {} rows, every pattern compiles",
                builtin.rows().len()
            );
            let h = &c.alerts.handoff;
            match (&h.scheduler, &h.node) {
                (crate::alert::handoff::Scheduler::None, _) => {
                    println!("hand-off: none (pages carry no drain command)")
                }
                (s, node) => println!(
                    "hand-off: {} drain command in pages of faults that take a GPU out of service, for node {} (suggested; never run)",
                    s.as_str(),
                    // Unset: the alert's host name, as the daemon will resolve it here.
                    node.clone().unwrap_or_else(|| crate::host::alert_host(
                        c.incidents.host.as_deref()
                    ))
                ),
            }
            Ok(0)
        }
        Err(e) => {
            eprintln!("xidwatch: config error: {e}");
            Ok(EXIT_CONFIG)
        }
    }
}

/// `xidwatch test-alert`: one synthetic incident through every configured channel (or one), with
/// a report per channel. Exit 0 only when every channel accepted it.
pub fn test_alert(args: &TestAlertArgs) -> anyhow::Result<u8> {
    let config = match super::load_config(args.config.as_deref()) {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let rt = super::runtime()?;
    let evidence = rt.block_on(test_evidence(&config));
    let opts = crate::alert::TestAlertOptions {
        channel: args.channel.clone(),
        host: crate::host::alert_host(config.incidents.host.as_deref()),
        evidence,
        now_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
    };
    match rt.block_on(crate::alert::test_alert(
        &config.alerts,
        &config.alert_channels,
        opts,
    )) {
        Ok(report) => {
            print!("{}", report.render());
            Ok(if report.all_ok() { 0 } else { 1 })
        }
        Err(e) => {
            eprintln!("xidwatch: test-alert: {e}");
            Ok(EXIT_ERROR)
        }
    }
}

/// Real evidence from this machine for `test-alert`: the checks of the runbook a real Xid 79 gets.
async fn test_evidence(config: &crate::config::Config) -> Vec<crate::model::Evidence> {
    // The runbook a real Xid 79 gets (the one `xidwatch explain 79` names), run without a GPU
    // address: the synthetic GPU does not exist, so steps about one GPU say so and are skipped.
    let mut subject = crate::runbook::Subject::manual(None, Some(79), None);
    if let Some(e) = crate::classify::catalog::lookup(79) {
        subject.category = e.category;
        subject.severity = e.severity;
    }
    let Some(rb) = config.runbook_set.select(&subject) else {
        return Vec::new();
    };
    vec![
        rb.run(
            &subject,
            &crate::config::env::runbook_env(config),
            &config.runbook_limits,
        )
        .await,
    ]
}
