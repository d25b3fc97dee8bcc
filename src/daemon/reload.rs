//! Reload: on SIGHUP, or when the config file or a runbook file really changed. The new config
//! is loaded and validated; the parts that can change while running (the engine's settings, the
//! runbooks, the alert channels) are rebuilt from it and swapped in; settings that need a
//! restart keep their start-up values and say so.

use tokio::sync::mpsc;

use super::alert_stage::{alert_channels, alert_config};
use super::handover::Emitter;
use super::options::engine_config;
use super::options::Output;
use crate::clock::Now;
use crate::config::Config;
use crate::incident::{Engine, Origin};
use crate::model::{FindingKind, Incident};

fn now_ms() -> u64 {
    crate::clock::wall_ms()
}

/// What is in force: the config file's bytes and every runbook file's name and bytes. Reload
/// happens when this changes, not whenever something touches the folders.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Fingerprint(u64);

impl Fingerprint {
    pub(super) fn of(cfg: &Config) -> Fingerprint {
        let mut h = crate::model::Fnv::default();
        let mut eat = |bytes: &[u8]| h.eat(bytes);
        let read = |p: &std::path::Path| {
            // Bounded: a runbook or config larger than this is refused by the loader anyway.
            use std::io::Read;
            let mut buf = Vec::new();
            if let Ok(f) = std::fs::File::open(p) {
                let _ = f.take(4 << 20).read_to_end(&mut buf);
            }
            buf
        };
        if let Some(p) = &cfg.source {
            eat(p.as_os_str().as_encoded_bytes());
            eat(&read(p));
        }
        for d in cfg.runbooks.dirs() {
            eat(d.as_os_str().as_encoded_bytes());
            let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&d)
                .map(|rd| {
                    rd.filter_map(|e| e.ok())
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
                        .collect()
                })
                .unwrap_or_default();
            files.sort();
            for f in files {
                eat(f.as_os_str().as_encoded_bytes());
                eat(&read(&f));
            }
        }
        Fingerprint(h.finish())
    }
}

/// Watches the config file and the runbook directories; any change asks for a reload. The
/// directory of the config is watched, not the file, since editors replace files by renaming.
pub(super) fn watch_config(
    cfg: &Config,
    tx: mpsc::Sender<()>,
) -> Option<::notify::RecommendedWatcher> {
    use ::notify::Watcher;
    let path = cfg.source.clone()?;
    let file_name = path.file_name().map(|n| n.to_os_string());
    let dir = path
        .parent()
        .map(|p| {
            if p.as_os_str().is_empty() {
                std::path::Path::new(".")
            } else {
                p
            }
        })?
        .to_path_buf();
    let runbook_dirs = cfg.runbooks.dirs();
    let mut w = match ::notify::recommended_watcher(move |ev: ::notify::Result<::notify::Event>| {
        let Ok(ev) = ev else { return };
        if matches!(ev.kind, ::notify::EventKind::Access(_)) {
            return;
        }
        let relevant = ev.paths.iter().any(|p| {
            p.file_name().map(|n| n.to_os_string()) == file_name
                || p.extension().is_some_and(|e| e == "toml")
        });
        if relevant {
            let _ = tx.try_send(());
        }
    }) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(
                "cannot watch {} for changes ({e}); reload with SIGHUP",
                path.display()
            );
            return None;
        }
    };
    if let Err(e) = w.watch(&dir, ::notify::RecursiveMode::NonRecursive) {
        tracing::warn!(
            "cannot watch {} for changes ({e}); reload with SIGHUP",
            dir.display()
        );
        return None;
    }
    for d in runbook_dirs {
        let _ = w.watch(&d, ::notify::RecursiveMode::NonRecursive);
    }
    Some(w)
}

/// Reloads the config (and its runbooks and channels). A config that does not validate is
/// refused: the old one stays in force, and the refusal is logged and alerted once per distinct
/// error.
pub(super) async fn reload(
    output: Output,
    current: &mut Config,
    engine: &mut Engine,
    out: &mut Emitter,
    last_error: &mut Option<String>,
    out_buf: &mut Vec<Incident>,
) {
    let Some(path) = current.source.clone() else {
        tracing::info!(
            "reload requested, but xidwatch runs on built-in defaults: nothing to reload"
        );
        return;
    };
    let new = match Config::load(Some(&path)) {
        Ok(c) => c,
        Err(e) => {
            let text = e.to_string();
            tracing::error!("config reload refused, the previous config stays in force: {text}");
            out.tel.config_reloaded(false, now_ms());
            if last_error.as_deref() != Some(text.as_str()) {
                *last_error = Some(text.clone());
                // The page names file, line and key, never the value (it may be a secret).
                let refused = e.refusal(crate::config::read_config_file(&path).ok().as_deref());
                let mut f = crate::classify::signals::finding(
                    FindingKind::ConfigRejected,
                    None,
                    format!("config reload refused: {}", refused.words()),
                );
                f.message = format!(
                    "{} was refused; the previous config stays in force. `xidwatch check --config {}` prints the whole error.{}",
                    refused.words(),
                    path.display(),
                    refused.detail.as_deref().map(|d| format!("\n{d}")).unwrap_or_default()
                );
                out.tel.record_finding(&f);
                engine.push(f, Origin::Probe, Now::read(), false, out_buf);
            }
            return;
        }
    };
    *last_error = None;
    for (what, changed) in [
        ("kmsg.path", new.kmsg.path != current.kmsg.path),
        ("state.dir", new.state_dir != current.state_dir),
        ("nvml", new.nvml != current.nvml),
        (
            "incidents.host",
            new.incidents.host != current.incidents.host,
        ),
        ("metrics", new.metrics != current.metrics),
        ("health", new.health != current.health),
        ("inventory", new.inventory != current.inventory),
        ("history", new.history != current.history),
        ("services", new.services != current.services),
        ("fabricmanager", new.fabricmanager != current.fabricmanager),
    ] {
        if changed {
            tracing::warn!("{what} changed: it takes effect at the next restart");
        }
    }
    // The engine's settings, built as at start-up (host and boot stay) and swapped in.
    let e = engine_config(&new, String::new());
    engine.reconfigure(
        e.window_ms,
        e.max_open,
        e.nvml_match_ms,
        e.overrides,
        e.settle_ms,
        e.quiet_ms,
    );
    engine.set_remind_ms(e.remind_ms);
    // The runbooks, built as at start-up and swapped in.
    out.configure(&new);
    match out
        .alerts
        .reconfigure(&alert_config(&new, output), &alert_channels(&new, output))
        .await
    {
        Ok(warnings) => {
            for w in warnings {
                tracing::warn!("{w}");
            }
        }
        Err(e) => tracing::error!("alert channels not changed, keeping the old ones: {e}"),
    }
    // Settings that need a restart keep their old values until then.
    let mut applied = new;
    applied.kmsg.path = current.kmsg.path.clone();
    applied.state_dir = current.state_dir.clone();
    applied.nvml = current.nvml.clone();
    applied.incidents.host = current.incidents.host.clone();
    applied.metrics = current.metrics.clone();
    applied.health = current.health.clone();
    applied.inventory = current.inventory.clone();
    applied.history = current.history.clone();
    applied.services = current.services.clone();
    applied.fabricmanager = current.fabricmanager.clone();
    *current = applied;
    out.tel.set_xid_overrides(current.overrides.clone());
    out.tel.config_reloaded(true, now_ms());
    tracing::info!("config reloaded from {}", path.display());
}
