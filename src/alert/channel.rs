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

/// One delivery target.
#[derive(Debug)]
pub enum Channel {
    Stdout(StdoutFormat),
    Webhook(WebhookChannel),
    Email(EmailChannel),
    Alertmanager(AlertmanagerChannel),
}

impl Channel {
    pub fn name(&self) -> &str {
        match self {
            Channel::Stdout(_) => STDOUT_CHANNEL,
            Channel::Webhook(w) => w.name(),
            Channel::Email(e) => e.name(),
            Channel::Alertmanager(a) => a.name(),
        }
    }

    pub fn kind(&self) -> ChannelKind {
        match self {
            Channel::Stdout(_) => ChannelKind::Stdout,
            Channel::Webhook(w) => match w.format() {
                super::config::WebhookFormat::Json => ChannelKind::Webhook,
                super::config::WebhookFormat::Slack => ChannelKind::Slack,
            },
            Channel::Email(_) => ChannelKind::Email,
            Channel::Alertmanager(_) => ChannelKind::Alertmanager,
        }
    }

    /// One delivery attempt.
    pub async fn deliver(&self, doc: &AlertDocument) -> Result<(), DeliveryError> {
        match self {
            Channel::Stdout(format) => {
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
            Channel::Webhook(w) => w.deliver(doc).await,
            Channel::Email(e) => e.deliver(doc).await,
            Channel::Alertmanager(a) => a.deliver(doc).await,
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
    let mut out = Vec::new();
    if cfg.stdout_enabled() && want(STDOUT_CHANNEL) {
        out.push(Channel::Stdout(cfg.stdout.format));
    }
    for w in cfg.webhook.iter().filter(|w| want(&w.name)) {
        out.push(Channel::Webhook(
            WebhookChannel::build(w).map_err(|m| err(&w.name, m))?,
        ));
    }
    for e in cfg.email.iter().filter(|e| want(&e.name)) {
        out.push(Channel::Email(
            EmailChannel::build(e).map_err(|m| err(&e.name, m))?,
        ));
    }
    for a in cfg.alertmanager.iter().filter(|a| want(&a.name)) {
        out.push(Channel::Alertmanager(
            AlertmanagerChannel::build(a).map_err(|m| err(&a.name, m))?,
        ));
    }
    Ok(out)
}
