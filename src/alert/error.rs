//! The alert stage's setup errors.

/// Errors of the alert stage's setup (delivery failures are [`DeliveryError`]s).
#[derive(Debug, thiserror::Error)]
pub enum AlertError {
    #[error("invalid alert configuration:\n  {}", .0.join("\n  "))]
    Config(Vec<String>),
    #[error("alert channel {channel}: {message}")]
    Channel { channel: String, message: String },
    #[error("no alert channel named {0:?} is configured")]
    NoSuchChannel(String),
    #[error("alert outbox {path}: {message}")]
    Outbox { path: String, message: String },
}
