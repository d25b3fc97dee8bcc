//! The alert stage's setup errors.

pub use crate::model::ConfigIssue;

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
