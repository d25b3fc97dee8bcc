//! What every channel is to the rest of the alert stage: a [`Sink`] that delivers a document, and
//! a [`ChannelConfig`] that names, checks and builds it. Each channel kind lives in its own
//! folder under `channels/` and implements both; the config, the built channels and the
//! dispatcher loop over these traits, so a new kind is one folder and one list entry in
//! [`AlertConfig`](super::config::AlertConfig).
//!
//! A low room: it knows the document and the delivery error, never a channel.

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::document::AlertDocument;
use super::error::ConfigIssue;
use super::retry::DeliveryError;
use super::secret::Secret;
use crate::model::Severity;

/// What kind of channel a name refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChannelKind {
    Stdout,
    Webhook,
    Slack,
    Email,
    Alertmanager,
}

impl ChannelKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelKind::Stdout => "stdout",
            ChannelKind::Webhook => "webhook",
            ChannelKind::Slack => "slack",
            ChannelKind::Email => "email",
            ChannelKind::Alertmanager => "alertmanager",
        }
    }
}

/// The name of the built-in standard-output channel.
pub const STDOUT_CHANNEL: &str = "stdout";

/// The common part of every channel: name, filter and rate limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelCommon {
    pub name: String,
    pub kind: ChannelKind,
    pub min_severity: Severity,
    pub rate_limit: Option<RateLimit>,
    /// Resolved notices go to this channel (default: yes, except email).
    pub send_resolved: bool,
}

/// Per-channel rate limit: at most `rate_limit_count` sends in any `rate_limit_window_secs`.
/// Alerts over the limit wait in the outbox; they are delayed, not dropped.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub struct RateLimit {
    pub count: u32,
    pub window_secs: u64,
}

/// What an accepted delivery may still report: the instances of a cluster that refused while
/// another accepted (the caller redacts and logs them as a warning).
#[derive(Debug, Default)]
pub struct Accepted {
    pub refused: Vec<(usize, DeliveryError)>,
}

/// One delivery attempt in flight.
pub type Delivery<'a> = BoxFuture<'a, Result<Accepted, DeliveryError>>;

/// A built channel, ready to deliver: secrets resolved, URLs parsed, clients made.
pub trait Sink: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &str;
    fn kind(&self) -> ChannelKind;
    /// One attempt. The error's message may echo the receiver's answer; the caller redacts it.
    fn deliver<'a>(&'a self, doc: &'a AlertDocument) -> Delivery<'a>;
}

/// One configured channel of a kind that has a table of its own (`[[alerts.<table>]]`).
pub trait ChannelConfig: Send + Sync {
    /// The table under `[alerts]`: `webhook`, `email`, `alertmanager`.
    fn table(&self) -> &'static str;
    fn name(&self) -> &str;
    fn kind(&self) -> ChannelKind;
    /// Name, filter and rate limit; `min_severity` is `[alerts]`'s, for a channel without its own.
    fn common(&self, min_severity: Severity) -> ChannelCommon;
    /// Checks everything but the name (the config checks names across every channel). Each
    /// error starts with `key`, e.g. `alerts.webhook[0] (oncall)`, then the field.
    fn validate(&self, key: &str, errs: &mut Vec<ConfigIssue>);
    /// Every secret, by field (`url`, `hmac_secret`, `headers.Authorization`).
    fn secrets(&self) -> Vec<(String, &Secret)>;
    /// Forms the libraries send secrets in that their values do not show (SMTP `AUTH`
    /// encodings, a password in a URL's userinfo), for the redactor.
    fn secret_shapes(&self) -> Vec<String> {
        Vec::new()
    }
    /// The URLs it sends to, by field (`url`, `urls[1]`), for the cleartext warning. A URL held
    /// in a secret that does not resolve is left out (validation reports it).
    fn urls(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Resolves its secrets and builds the channel; the error names the field, not the value.
    fn build(&self) -> Result<Box<dyn Sink>, String>;
}

/// `rate_limit_count` and `rate_limit_window_secs` of a channel, as its rate limit.
pub fn rate_limit(count: u32, window_secs: u64) -> Option<RateLimit> {
    Some(RateLimit { count, window_secs })
}

/// Checks a channel's rate limit fields.
pub fn check_rate(key: &str, count: u32, window: u64, errs: &mut Vec<ConfigIssue>) {
    if count == 0 {
        errs.push(ConfigIssue::new(
            format!("{key}.rate_limit_count"),
            "must be at least 1",
        ));
    }
    if window == 0 {
        errs.push(ConfigIssue::new(
            format!("{key}.rate_limit_window_secs"),
            "must be at least 1",
        ));
    }
}

/// Checks a channel's `timeout_secs`.
pub fn check_timeout(key: &str, secs: u64, errs: &mut Vec<ConfigIssue>) {
    if secs == 0 || secs > 600 {
        errs.push(ConfigIssue::new(
            format!("{key}.timeout_secs"),
            "must be between 1 and 600",
        ));
    }
}

pub(crate) fn default_rate_count() -> u32 {
    20
}
pub(crate) fn default_rate_window() -> u64 {
    60
}
pub(crate) fn default_http_timeout() -> u64 {
    10
}
