//! Standard output (the journal, under systemd): the readable report or the JSON document, one
//! per alert. The channel used when no other is configured, so it has no table list of its own.

use std::io::Write;

use serde::Deserialize;

use crate::alert::document::AlertDocument;
use crate::alert::report;
use crate::alert::retry::DeliveryError;
use crate::alert::sink::{Accepted, ChannelCommon, ChannelKind, Delivery, Sink, STDOUT_CHANNEL};
use crate::model::Severity;

/// `enabled`: `true`, `false`, or absent (on only when no other channel is configured).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct StdoutConfig {
    pub enabled: Option<bool>,
    /// `text` (the readable report) or `json` (the xidwatch.alert/v1 document, one line).
    pub format: StdoutFormat,
    pub min_severity: Option<Severity>,
    /// Whether resolved notices are printed (default: yes).
    pub send_resolved: Option<bool>,
}

impl Default for StdoutConfig {
    fn default() -> Self {
        StdoutConfig {
            enabled: None,
            format: StdoutFormat::Text,
            min_severity: Some(Severity::Info),
            send_resolved: None,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StdoutFormat {
    Text,
    Json,
}

impl StdoutConfig {
    /// Name, filter and rate limit (none: the journal takes what comes).
    pub fn common(&self, min_severity: Severity) -> ChannelCommon {
        ChannelCommon {
            name: STDOUT_CHANNEL.to_string(),
            kind: ChannelKind::Stdout,
            min_severity: self.min_severity.unwrap_or(min_severity),
            rate_limit: None,
            send_resolved: self.send_resolved.unwrap_or(true),
        }
    }
}

/// The built standard-output channel.
#[derive(Debug)]
pub struct StdoutChannel {
    format: StdoutFormat,
}

impl StdoutChannel {
    pub fn new(format: StdoutFormat) -> StdoutChannel {
        StdoutChannel { format }
    }

    async fn write(&self, doc: &AlertDocument) -> Result<(), DeliveryError> {
        let text = match self.format {
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
        .map_err(|e| DeliveryError::transient(format!("cannot write to standard output: {e}")))
    }
}

impl Sink for StdoutChannel {
    fn name(&self) -> &str {
        STDOUT_CHANNEL
    }

    fn kind(&self) -> ChannelKind {
        ChannelKind::Stdout
    }

    fn deliver<'a>(&'a self, doc: &'a AlertDocument) -> Delivery<'a> {
        Box::pin(async move { self.write(doc).await.map(|()| Accepted::default()) })
    }
}
