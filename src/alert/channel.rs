//! The configured channels, built from [`AlertConfig`] in one step that resolves secrets and may
//! fail with a message naming the channel, then used to deliver documents.

use std::io::Write;

use super::alertmanager::AlertmanagerChannel;
use super::config::{AlertConfig, ChannelKind, StdoutFormat, STDOUT_CHANNEL};
use super::document::AlertDocument;
use super::email::EmailChannel;
use super::report;
use super::retry::DeliveryError;
use super::webhook::WebhookChannel;
use super::AlertError;
use crate::runbook::Redactor;

/// One delivery target, with the config's secrets to cut out of what it reports.
#[derive(Debug)]
pub struct Channel {
    target: Target,
    secrets: Redactor,
}

/// Where a channel delivers.
#[derive(Debug)]
enum Target {
    Stdout(StdoutFormat),
    Webhook(WebhookChannel),
    Email(EmailChannel),
    Alertmanager(AlertmanagerChannel),
}

impl Channel {
    fn new(target: Target, secrets: &Redactor) -> Channel {
        Channel {
            target,
            secrets: secrets.clone(),
        }
    }

    pub fn name(&self) -> &str {
        match &self.target {
            Target::Stdout(_) => STDOUT_CHANNEL,
            Target::Webhook(w) => w.name(),
            Target::Email(e) => e.name(),
            Target::Alertmanager(a) => a.name(),
        }
    }

    pub fn kind(&self) -> ChannelKind {
        match &self.target {
            Target::Stdout(_) => ChannelKind::Stdout,
            Target::Webhook(w) => match w.format() {
                super::config::WebhookFormat::Json => ChannelKind::Webhook,
                super::config::WebhookFormat::Slack => ChannelKind::Slack,
            },
            Target::Email(_) => ChannelKind::Email,
            Target::Alertmanager(_) => ChannelKind::Alertmanager,
        }
    }

    /// One delivery attempt. Every channel's failure goes through here, and leaves redacted and
    /// capped: the dispatcher logs it, the outbox stores it, `xidwatch status` and the status
    /// files show it, `test-alert` prints it, all as it is returned here.
    pub async fn deliver(&self, doc: &AlertDocument) -> Result<(), DeliveryError> {
        self.attempt(doc)
            .await
            .map_err(|e| e.redacted(&self.secrets))
    }

    async fn attempt(&self, doc: &AlertDocument) -> Result<(), DeliveryError> {
        match &self.target {
            Target::Stdout(format) => {
                let text = match format {
                    StdoutFormat::Text => format!("{}\n", report::render(doc)),
                    StdoutFormat::Json => {
                        let mut s = String::from_utf8_lossy(&doc.to_json()).into_owned();
                        s.push('\n');
                        s
                    }
                };
                // Standard output may be a full pipe; keep the blocking write off the runtime.
                tokio::task::spawn_blocking(move || {
                    let mut out = std::io::stdout().lock();
                    out.write_all(text.as_bytes()).and_then(|_| out.flush())
                })
                .await
                .map_err(|e| DeliveryError::transient(format!("stdout writer: {e}")))?
                .map_err(|e| {
                    DeliveryError::transient(format!("cannot write to standard output: {e}"))
                })
            }
            Target::Webhook(w) => w.deliver(doc).await,
            Target::Email(e) => e.deliver(doc).await,
            Target::Alertmanager(a) => {
                let refused = a.deliver(doc).await?;
                // Instances that refused while another accepted: a warning, redacted too.
                for (i, e) in refused {
                    let e = e.redacted(&self.secrets);
                    tracing::warn!(channel = %a.name(), instance = i, error = %e, "an Alertmanager instance did not accept the alert; another did");
                }
                Ok(())
            }
        }
    }
}

/// The channels of one `[alerts]` config, built once when the config is loaded (secrets
/// resolved, URLs and headers parsed, clients made) and shared from then on: the dispatcher,
/// a reload and `test-alert` use these, never the text again.
#[derive(Debug, Clone, Default)]
pub struct BuiltChannels(pub std::sync::Arc<Vec<std::sync::Arc<Channel>>>);

impl BuiltChannels {
    /// Checks `cfg` and builds its channels: the one step from text to typed channels.
    pub fn build(cfg: &AlertConfig) -> Result<BuiltChannels, AlertError> {
        cfg.validate().map_err(AlertError::Config)?;
        let built = build_all(cfg, None)?;
        Ok(BuiltChannels(std::sync::Arc::new(
            built.into_iter().map(std::sync::Arc::new).collect(),
        )))
    }

    /// The channel called `name`.
    pub fn get(&self, name: &str) -> Option<std::sync::Arc<Channel>> {
        self.0.iter().find(|c| c.name() == name).cloned()
    }

    /// Every channel but the one called `name` (the daemon's `--json` mode gives standard
    /// output to the incident stream).
    pub fn without(&self, name: &str) -> BuiltChannels {
        BuiltChannels(std::sync::Arc::new(
            self.0
                .iter()
                .filter(|c| c.name() != name)
                .cloned()
                .collect(),
        ))
    }
}

/// Builds every enabled channel (or only `only`, by name). Errors name the channel.
pub fn build_all(cfg: &AlertConfig, only: Option<&str>) -> Result<Vec<Channel>, AlertError> {
    let want = |name: &str| only.is_none_or(|o| o == name);
    let err = |channel: &str, message: String| AlertError::Channel {
        channel: channel.to_string(),
        message,
    };
    // Every secret of the config, for every channel: a receiver may echo any of them.
    let secrets = Redactor::new(cfg.secret_values());
    let mut out = Vec::new();
    if cfg.stdout_enabled() && want(STDOUT_CHANNEL) {
        out.push(Channel::new(Target::Stdout(cfg.stdout.format), &secrets));
    }
    for w in cfg.webhook.iter().filter(|w| want(&w.name)) {
        let built = WebhookChannel::build(w).map_err(|m| err(&w.name, m))?;
        out.push(Channel::new(Target::Webhook(built), &secrets));
    }
    for e in cfg.email.iter().filter(|e| want(&e.name)) {
        let built = EmailChannel::build(e).map_err(|m| err(&e.name, m))?;
        out.push(Channel::new(Target::Email(built), &secrets));
    }
    for a in cfg.alertmanager.iter().filter(|a| want(&a.name)) {
        let built = AlertmanagerChannel::build(a).map_err(|m| err(&a.name, m))?;
        out.push(Channel::new(Target::Alertmanager(built), &secrets));
    }
    Ok(out)
}
