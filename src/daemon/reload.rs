//! Reload: on SIGHUP, or when the config file or a runbook file really changed. The new config
//! is loaded and validated; the parts that can change while running (the engine's settings, the
//! runbooks, the alert channels) are rebuilt from it and swapped in; settings that need a
//! restart keep their start-up values and say so.

use super::handover::Emitter;
use super::options::Output;
use crate::clock::Now;
use crate::config::Config;
use crate::incident::{Engine, Origin};
use crate::model::{FindingKind, Incident};

fn now_ms() -> u64 {
    crate::clock::wall_ms()
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
    for what in current.restart_only_changes(&new) {
        tracing::warn!("{what} changed: it takes effect at the next restart");
    }
    // The engine's settings, built as at start-up (host and boot stay) and swapped in.
    engine.reconfigure(new.engine_config(String::new()));
    // The runbooks, built as at start-up and swapped in.
    out.configure(&new);
    match out
        .alerts
        .reconfigure(
            &new.alert_config(output.stdout_taken()),
            &new.alert_channels(output.stdout_taken()),
        )
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
    *current = new.keeping_restart_only(current);
    out.tel.set_xid_overrides(current.overrides.clone());
    out.tel.config_reloaded(true, now_ms());
    tracing::info!("config reloaded from {}", path.display());
}
