//! The alert stage as the daemon runs it: started once, for the whole run, and reconfigured in
//! place on reload (through the alert module's public API).

use std::time::Duration;

use super::options::Output;
use crate::config::Config;
use crate::status::telemetry::Telemetry;

pub(super) fn set_alert_provider(tel: &Telemetry, alerts: &AlertStage) {
    let s = alerts.sender();
    tel.set_alert_status_provider(Some(std::sync::Arc::new(move || s.status())));
}

/// The alert stage as the daemon runs it: started once, for the whole run, and reconfigured in
/// place on reload, so a runbook that outlives a reload still hands its evidence to the same
/// stage and one outbox is ever open on the state directory.
pub(super) struct AlertStage {
    sender: crate::alert::AlertSender,
    handle: tokio::task::JoinHandle<()>,
    shutdown: tokio::sync::watch::Sender<bool>,
}

impl AlertStage {
    pub(super) fn start(cfg: &Config, output: Output) -> anyhow::Result<AlertStage> {
        let alert_cfg = cfg.alert_config(output.stdout_taken());
        for w in alert_cfg
            .secret_warnings(cfg.source.as_deref())
            .into_iter()
            .chain(alert_cfg.cleartext_warnings())
        {
            tracing::warn!("{w}");
        }
        let (shutdown, rx) = tokio::sync::watch::channel(false);
        let built = cfg.alert_channels(output.stdout_taken());
        let (sender, handle) =
            crate::alert::Dispatcher::start_built(&alert_cfg, &built, &cfg.state_dir, rx)
                .map_err(|e| anyhow::anyhow!("starting the alert stage: {e}"))?;
        Ok(AlertStage {
            sender,
            handle,
            shutdown,
        })
    }

    pub(super) fn sender(&self) -> crate::alert::AlertSender {
        self.sender.clone()
    }

    pub(super) async fn stop(self) {
        let _ = self.shutdown.send(true);
        drop(self.sender);
        // The outbox keeps whatever is not delivered yet; give in-flight sends a moment.
        let _ = tokio::time::timeout(Duration::from_secs(5), self.handle).await;
    }
}
