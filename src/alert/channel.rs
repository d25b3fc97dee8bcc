//! The configured channels, built from [`AlertConfig`] in one step that resolves secrets and may
//! fail with a message naming the channel, then used to deliver documents. A channel is a
//! [`Sink`] of any kind with the config's secrets to cut out of what it reports; nothing here
//! knows one kind from another.

use super::channels::stdout::StdoutChannel;
use super::config::AlertConfig;
use super::document::AlertDocument;
use super::error::AlertError;
use super::retry::DeliveryError;
use super::sink::{ChannelKind, Sink, STDOUT_CHANNEL};
use crate::runbook::Redactor;

/// One delivery target, with the config's secrets to cut out of what it reports.
#[derive(Debug)]
pub struct Channel {
    sink: Box<dyn Sink>,
    secrets: Redactor,
}

impl Channel {
    /// A channel of `sink`, reporting errors with `secrets` cut out.
    pub(crate) fn new(sink: Box<dyn Sink>, secrets: &Redactor) -> Channel {
        Channel {
            sink,
            secrets: secrets.clone(),
        }
    }

    pub fn name(&self) -> &str {
        self.sink.name()
    }

    pub fn kind(&self) -> ChannelKind {
        self.sink.kind()
    }

    /// One delivery attempt. Every channel's failure goes through here, and leaves redacted and
    /// capped: the dispatcher logs it, the outbox stores it, `xidwatch status` and the status
    /// files show it, `test-alert` prints it, all as it is returned here.
    pub async fn deliver(&self, doc: &AlertDocument) -> Result<(), DeliveryError> {
        let accepted = self
            .sink
            .deliver(doc)
            .await
            .map_err(|e| e.redacted(&self.secrets))?;
        // Instances that refused while another accepted: a warning, redacted too.
        for (i, e) in accepted.refused {
            let e = e.redacted(&self.secrets);
            tracing::warn!(channel = %self.name(), instance = i, error = %e, "an Alertmanager instance did not accept the alert; another did");
        }
        Ok(())
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
    // Every secret of the config, for every channel: a receiver may echo any of them.
    let secrets = Redactor::new(cfg.secret_values());
    let mut out = Vec::new();
    if cfg.stdout_enabled() && want(STDOUT_CHANNEL) {
        let sink = StdoutChannel::new(cfg.stdout.format);
        out.push(Channel::new(Box::new(sink), &secrets));
    }
    for (_, c) in cfg.configured().into_iter().filter(|(_, c)| want(c.name())) {
        let sink = c.build().map_err(|message| AlertError::Channel {
            channel: c.name().to_string(),
            message,
        })?;
        out.push(Channel::new(sink, &secrets));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::sink::{Accepted, Delivery};

    /// A receiver that echoes the request's token back in its refusals.
    #[derive(Debug)]
    struct Echo {
        accept: bool,
    }

    impl Sink for Echo {
        fn name(&self) -> &str {
            "echo"
        }

        fn kind(&self) -> ChannelKind {
            ChannelKind::Webhook
        }

        fn deliver<'a>(&'a self, _doc: &'a AlertDocument) -> Delivery<'a> {
            Box::pin(async move {
                let e = DeliveryError::permanent("HTTP 401: bad token s3cret-t0ken-xyz");
                if self.accept {
                    Ok(Accepted {
                        refused: vec![(1, e)],
                    })
                } else {
                    Err(e)
                }
            })
        }
    }

    /// Whatever kind a channel is, its failure leaves `deliver` with the config's secrets cut
    /// out, and an instance's refusal beside an acceptance is not a failure.
    #[tokio::test]
    async fn every_sink_s_failure_leaves_redacted() {
        let secrets = Redactor::new(["s3cret-t0ken-xyz".to_string()]);
        let alert = crate::alert::synthetic_alert("node-1", 1_764_404_043_123, Vec::new());
        let doc = AlertDocument::build(&alert);
        let refusing = Channel::new(Box::new(Echo { accept: false }), &secrets);
        assert_eq!(
            (refusing.name(), refusing.kind()),
            ("echo", ChannelKind::Webhook)
        );
        let e = refusing.deliver(&doc).await.unwrap_err();
        assert!(e.is_permanent());
        assert!(!e.message.contains("s3cret-t0ken-xyz"), "{}", e.message);
        assert!(e.message.starts_with("HTTP 401"), "{}", e.message);
        let accepting = Channel::new(Box::new(Echo { accept: true }), &secrets);
        assert!(accepting.deliver(&doc).await.is_ok());
    }
}
