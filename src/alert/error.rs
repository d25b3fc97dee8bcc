//! The alert stage's setup errors.

use std::fmt;

/// One refused setting of `[alerts]`: the key it is at (`alerts.webhook[0] (oncall).url`) and
/// what is wrong with it, never its value. The key is kept as a value of its own so the config
/// loader can find what a message refers to without reading it back out of the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// The key, as the message names it; empty for an issue that is about no one key.
    pub key: String,
    pub message: String,
}

impl ConfigIssue {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> ConfigIssue {
        ConfigIssue {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// `key: message`, the form every refusal of the config has always had.
impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.key, self.message)
        }
    }
}

/// The issues, one per line under the heading.
fn issue_lines(issues: &[ConfigIssue]) -> String {
    issues
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n  ")
}

/// Errors of the alert stage's setup (delivery failures are
/// [`DeliveryError`](super::retry::DeliveryError)s).
#[derive(Debug, thiserror::Error)]
pub enum AlertError {
    #[error("invalid alert configuration:\n  {}", issue_lines(.0))]
    Config(Vec<ConfigIssue>),
    #[error("alert channel {channel}: {message}")]
    Channel { channel: String, message: String },
    #[error("no alert channel named {0:?} is configured")]
    NoSuchChannel(String),
    #[error("alert outbox {path}: {message}")]
    Outbox { path: String, message: String },
}
