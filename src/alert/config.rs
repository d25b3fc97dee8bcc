//! The `[alerts]` table of the configuration: channels, retry, outbox bounds, and secrets.
//!
//! Built in two steps, like every component: this module deserialises and validates (naming the
//! offending key), the dispatcher then resolves secrets and builds the channels. A [`Secret`] never
//! shows its value in `Debug`, `Display`, logs or errors.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer};

use crate::model::Severity;

/// The whole `[alerts]` table. Embedded by the main config as `alerts: AlertConfig` with
/// `#[serde(default)]`, so an absent table means "report to standard output only".
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AlertConfig {
    /// Minimum severity for channels that do not set their own.
    pub min_severity: Severity,
    /// Capacity of the bounded channel between the incident stage and the dispatcher.
    pub queue_capacity: usize,
    pub outbox: OutboxConfig,
    pub retry: RetryConfig,
    /// Standard output (the journal, under systemd). Used by default when no channel is configured.
    pub stdout: StdoutConfig,
    pub webhook: Vec<WebhookConfig>,
    pub email: Vec<EmailConfig>,
    pub alertmanager: Vec<AlertmanagerConfig>,
    /// The top-level `[handoff]` table, copied here by the config loader so the alert stage can
    /// put the drain command in the page; not a key of `[alerts]`.
    #[serde(skip)]
    pub handoff: super::handoff::HandoffConfig,
}

impl Default for AlertConfig {
    fn default() -> Self {
        AlertConfig {
            min_severity: Severity::Warning,
            queue_capacity: 256,
            outbox: OutboxConfig::default(),
            retry: RetryConfig::default(),
            stdout: StdoutConfig::default(),
            webhook: Vec::new(),
            email: Vec::new(),
            alertmanager: Vec::new(),
            handoff: super::handoff::HandoffConfig::default(),
        }
    }
}

/// Bounds of the on-disk outbox under the state directory.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct OutboxConfig {
    /// Most alerts kept waiting for delivery.
    pub max_count: usize,
    /// Most bytes of alert files kept waiting for delivery.
    pub max_bytes: u64,
    /// Full readable reports kept under `<state_dir>/reports` (the Slack message points there).
    pub keep_reports: usize,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            max_count: 1000,
            max_bytes: 32 * 1024 * 1024,
            keep_reports: 200,
        }
    }
}

/// Retry policy, shared by every channel.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// First delay after a temporary failure; doubled each attempt, with jitter.
    pub initial_backoff_ms: u64,
    /// Ceiling of the computed delay.
    pub max_backoff_secs: u64,
    /// Attempts per channel before the alert is given up for that channel (0: no limit by count).
    pub max_attempts: u32,
    /// Age after which an alert that still failed is given up (0: no limit by age).
    pub max_age_secs: u64,
    /// A receiver's `Retry-After` is honoured up to this many seconds.
    pub max_retry_after_secs: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            initial_backoff_ms: 2000,
            max_backoff_secs: 300,
            max_attempts: 50,
            max_age_secs: 2 * 24 * 3600,
            max_retry_after_secs: 3600,
        }
    }
}

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

/// Per-channel rate limit: at most `rate_limit_count` sends in any `rate_limit_window_secs`.
/// Alerts over the limit wait in the outbox; they are delayed, not dropped.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub struct RateLimit {
    pub count: u32,
    pub window_secs: u64,
}

/// The body a webhook receives.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum WebhookFormat {
    /// The versioned `xidwatch.alert/v1` document.
    Json,
    /// A Slack incoming-webhook Block Kit message.
    Slack,
}

/// `[[alerts.webhook]]`: Slack incoming webhooks and generic JSON receivers.
#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    pub name: String,
    /// The URL is a secret: Slack webhook URLs carry their token in the path.
    pub url: Secret,
    pub format: WebhookFormat,
    /// Whether this channel is told when an incident resolves (quiet for `incidents.quiet_secs`).
    #[serde(default)]
    pub send_resolved: Option<bool>,
    #[serde(default)]
    pub min_severity: Option<Severity>,
    #[serde(default = "default_rate_count")]
    pub rate_limit_count: u32,
    #[serde(default = "default_rate_window")]
    pub rate_limit_window_secs: u64,
    #[serde(default = "default_http_timeout")]
    pub timeout_secs: u64,
    /// Extra headers, e.g. `Authorization = "env:RECEIVER_TOKEN"`. Values are secrets.
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
    /// Shared secret for the HMAC-SHA256 signature header (JSON format).
    #[serde(default)]
    pub hmac_secret: Option<Secret>,
    #[serde(default = "default_signature_header")]
    pub signature_header: String,
    /// PEM file with extra CA certificates to trust (internal receivers).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

impl fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("format", &self.format)
            .field("min_severity", &self.min_severity)
            .field("rate_limit_count", &self.rate_limit_count)
            .field("rate_limit_window_secs", &self.rate_limit_window_secs)
            .field("timeout_secs", &self.timeout_secs)
            .field("headers", &self.headers)
            .field("hmac_secret", &self.hmac_secret)
            .field("signature_header", &self.signature_header)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// How the SMTP connection is secured.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum SmtpTls {
    /// `smtps://` means implicit TLS; `smtp://` means STARTTLS (required), except on a loopback
    /// host, where it means plain.
    #[default]
    Auto,
    /// Plain connection, upgraded with STARTTLS; fails if the server does not offer it.
    Starttls,
    /// TLS from the first byte (port 465).
    Implicit,
    /// No TLS at all. Allowed only to a loopback address.
    None,
}

/// `[[alerts.email]]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EmailConfig {
    pub name: String,
    /// `smtp://host[:port]` or `smtps://host[:port]`. No credentials in the URL: use `username`
    /// and `password`.
    pub smtp_url: String,
    #[serde(default)]
    pub tls: SmtpTls,
    pub from: String,
    pub to: Vec<String>,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<Secret>,
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Name sent in EHLO; defaults to this host's name.
    #[serde(default)]
    pub hello_name: Option<String>,
    #[serde(default = "default_subject_prefix")]
    pub subject_prefix: String,
    /// Whether this channel is told when an incident resolves (quiet for `incidents.quiet_secs`).
    #[serde(default)]
    pub send_resolved: Option<bool>,
    #[serde(default)]
    pub min_severity: Option<Severity>,
    #[serde(default = "default_rate_count")]
    pub rate_limit_count: u32,
    #[serde(default = "default_rate_window")]
    pub rate_limit_window_secs: u64,
    #[serde(default = "default_smtp_timeout")]
    pub timeout_secs: u64,
}

/// `[[alerts.alertmanager]]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AlertmanagerConfig {
    pub name: String,
    /// Base URLs (`http://am-1:9093`); `/api/v2/alerts` is appended. Every URL is posted to; the
    /// alert counts as delivered when at least one accepted it (an HA cluster shares it).
    pub urls: Vec<String>,
    /// Extra labels added to every alert (e.g. `cluster = "a"`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `endsAt` is set this long after the send; Alertmanager resolves the alert then.
    #[serde(default = "default_resolve_after")]
    pub resolve_after_secs: u64,
    /// Extra headers (e.g. `Authorization`); values are secrets.
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Link put in `generatorURL` (e.g. a dashboard for the host).
    #[serde(default)]
    pub generator_url: Option<String>,
    /// Whether this channel is told when an incident resolves (quiet for `incidents.quiet_secs`).
    #[serde(default)]
    pub send_resolved: Option<bool>,
    #[serde(default)]
    pub min_severity: Option<Severity>,
    #[serde(default = "default_rate_count")]
    pub rate_limit_count: u32,
    #[serde(default = "default_rate_window")]
    pub rate_limit_window_secs: u64,
    #[serde(default = "default_http_timeout")]
    pub timeout_secs: u64,
}

fn default_rate_count() -> u32 {
    20
}
fn default_rate_window() -> u64 {
    60
}
fn default_http_timeout() -> u64 {
    10
}
fn default_smtp_timeout() -> u64 {
    30
}
fn default_resolve_after() -> u64 {
    24 * 3600
}
fn default_signature_header() -> String {
    "X-Xidwatch-Signature".to_string()
}
fn default_subject_prefix() -> String {
    "[xidwatch]".to_string()
}

// ---------------------------------------------------------------------------------------------
// Secrets

/// A secret value and where it comes from: `env:NAME`, `file:PATH`, `inline:VALUE` or a plain
/// string (inline). Its value is read only by [`Secret::resolve`] and never printed.
#[derive(Clone, PartialEq, Eq)]
pub enum Secret {
    Inline(String),
    Env(String),
    File(PathBuf),
}

/// The resolved value of a secret. `Debug` and `Display` print `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    /// The value itself; call it only where it is handed to a library, never to format text.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Secret {
    pub fn parse(text: &str) -> Secret {
        if let Some(name) = text.strip_prefix("env:") {
            Secret::Env(name.to_string())
        } else if let Some(path) = text.strip_prefix("file:") {
            Secret::File(PathBuf::from(path))
        } else if let Some(value) = text.strip_prefix("inline:") {
            Secret::Inline(value.to_string())
        } else {
            Secret::Inline(text.to_string())
        }
    }

    pub fn is_inline(&self) -> bool {
        matches!(self, Secret::Inline(_))
    }

    /// Reads the value. The error names the source (variable or file), never the value. In the
    /// `xidwatch` binary an `env:` variable leaves the environment at its first read
    /// ([`crate::process_guard::env_secret`]).
    pub fn resolve(&self) -> Result<SecretValue, String> {
        match self {
            Secret::Inline(v) => Ok(SecretValue(v.clone())),
            // In the binary, taken out of the environment once read and kept for reloads.
            Secret::Env(name) => match crate::process_guard::env_secret(name) {
                Some(v) if !v.is_empty() => Ok(SecretValue(v)),
                Some(_) => Err(format!("environment variable {name} is empty")),
                None => Err(format!("environment variable {name} is not set")),
            },
            Secret::File(path) => {
                // Like the config: a regular file of bounded size, never a device or FIFO.
                let text = crate::files::read_config_file(path)
                    .map_err(|e| format!("cannot read secret file {}: {e}", path.display()))?;
                let v = text.trim_end_matches(['\n', '\r']).to_string();
                if v.is_empty() {
                    Err(format!("secret file {} is empty", path.display()))
                } else {
                    Ok(SecretValue(v))
                }
            }
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Secret::Inline(_) => f.write_str("Secret(<redacted>)"),
            Secret::Env(name) => write!(f, "Secret(env:{name})"),
            Secret::File(path) => write!(f, "Secret(file:{})", path.display()),
        }
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(Secret::parse(&s))
    }
}

// ---------------------------------------------------------------------------------------------
// Channels as a flat list

/// What kind of channel a name refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
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

impl AlertConfig {
    /// Whether the standard output channel is on: explicitly, or because nothing else is.
    pub fn stdout_enabled(&self) -> bool {
        self.stdout.enabled.unwrap_or(
            self.webhook.is_empty() && self.email.is_empty() && self.alertmanager.is_empty(),
        )
    }

    /// Every enabled channel's name, kind, filter and rate limit, in config order.
    pub fn channels(&self) -> Vec<ChannelCommon> {
        let rl = |count: u32, window_secs: u64| Some(RateLimit { count, window_secs });
        let mut out = Vec::new();
        if self.stdout_enabled() {
            out.push(ChannelCommon {
                name: STDOUT_CHANNEL.to_string(),
                kind: ChannelKind::Stdout,
                min_severity: self.stdout.min_severity.unwrap_or(self.min_severity),
                rate_limit: None,
                send_resolved: self.stdout.send_resolved.unwrap_or(true),
            });
        }
        for w in &self.webhook {
            out.push(ChannelCommon {
                name: w.name.clone(),
                kind: match w.format {
                    WebhookFormat::Json => ChannelKind::Webhook,
                    WebhookFormat::Slack => ChannelKind::Slack,
                },
                min_severity: w.min_severity.unwrap_or(self.min_severity),
                rate_limit: rl(w.rate_limit_count, w.rate_limit_window_secs),
                send_resolved: w.send_resolved.unwrap_or(true),
            });
        }
        for e in &self.email {
            out.push(ChannelCommon {
                name: e.name.clone(),
                kind: ChannelKind::Email,
                min_severity: e.min_severity.unwrap_or(self.min_severity),
                rate_limit: rl(e.rate_limit_count, e.rate_limit_window_secs),
                // Mail is for pages; a second mail saying all is quiet is opt-in.
                send_resolved: e.send_resolved.unwrap_or(false),
            });
        }
        for a in &self.alertmanager {
            out.push(ChannelCommon {
                name: a.name.clone(),
                kind: ChannelKind::Alertmanager,
                min_severity: a.min_severity.unwrap_or(self.min_severity),
                rate_limit: rl(a.rate_limit_count, a.rate_limit_window_secs),
                send_resolved: a.send_resolved.unwrap_or(true),
            });
        }
        out
    }

    /// Checks everything that can be checked without sending: names, URLs, addresses, TLS
    /// settings, CA files, secrets' sources, bounds. Each error names its key, e.g.
    /// `alerts.webhook[0] (oncall).url: ...`.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut errs = Vec::new();
        if self.queue_capacity == 0 {
            errs.push("alerts.queue_capacity: must be at least 1".to_string());
        }
        if self.outbox.max_count == 0 {
            errs.push("alerts.outbox.max_count: must be at least 1".to_string());
        }
        if self.outbox.max_bytes < 64 * 1024 {
            errs.push("alerts.outbox.max_bytes: must be at least 65536".to_string());
        }
        if self.retry.initial_backoff_ms == 0 {
            errs.push("alerts.retry.initial_backoff_ms: must be at least 1".to_string());
        }
        if self.retry.max_backoff_secs == 0 {
            errs.push("alerts.retry.max_backoff_secs: must be at least 1".to_string());
        }

        let mut names = BTreeSet::new();
        let mut check_name = |key: &str, name: &str, errs: &mut Vec<String>| {
            if name.is_empty()
                || name.len() > 64
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                errs.push(format!(
                    "{key}.name: {name:?} must be 1-64 characters of letters, digits, '-', '_' or '.'"
                ));
            } else if name == STDOUT_CHANNEL {
                errs.push(format!(
                    "{key}.name: \"stdout\" is reserved for standard output"
                ));
            } else if !names.insert(name.to_string()) {
                errs.push(format!("{key}.name: {name:?} is used by another channel"));
            }
        };
        let check_rate = |key: &str, count: u32, window: u64, errs: &mut Vec<String>| {
            if count == 0 {
                errs.push(format!("{key}.rate_limit_count: must be at least 1"));
            }
            if window == 0 {
                errs.push(format!("{key}.rate_limit_window_secs: must be at least 1"));
            }
        };
        let check_timeout = |key: &str, secs: u64, errs: &mut Vec<String>| {
            if secs == 0 || secs > 600 {
                errs.push(format!("{key}.timeout_secs: must be between 1 and 600"));
            }
        };
        let check_headers =
            |key: &str, headers: &BTreeMap<String, Secret>, errs: &mut Vec<String>| {
                for (name, value) in headers {
                    if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                        errs.push(format!(
                            "{key}.headers: {name:?} is not a valid header name"
                        ));
                    }
                    match value.resolve() {
                        Err(e) => errs.push(format!("{key}.headers.{name}: {e}")),
                        Ok(v) => {
                            if reqwest::header::HeaderValue::from_str(v.expose()).is_err() {
                                errs.push(format!(
                                    "{key}.headers.{name}: the value is not a valid header value"
                                ));
                            }
                        }
                    }
                }
            };

        for (i, w) in self.webhook.iter().enumerate() {
            let key = format!("alerts.webhook[{i}] ({})", w.name);
            check_name(&format!("alerts.webhook[{i}]"), &w.name, &mut errs);
            match w.url.resolve() {
                Err(e) => errs.push(format!("{key}.url: {e}")),
                Ok(u) => {
                    if let Err(e) = check_http_url(u.expose()) {
                        errs.push(format!("{key}.url: {e}"));
                    }
                }
            }
            check_rate(
                &key,
                w.rate_limit_count,
                w.rate_limit_window_secs,
                &mut errs,
            );
            check_timeout(&key, w.timeout_secs, &mut errs);
            check_headers(&key, &w.headers, &mut errs);
            if reqwest::header::HeaderName::from_bytes(w.signature_header.as_bytes()).is_err() {
                errs.push(format!("{key}.signature_header: not a valid header name"));
            }
            if let Some(s) = &w.hmac_secret {
                if let Err(e) = s.resolve() {
                    errs.push(format!("{key}.hmac_secret: {e}"));
                }
            }
            if let Some(p) = &w.ca_file {
                if let Err(e) = read_pem_certs(p) {
                    errs.push(format!("{key}.ca_file: {e}"));
                }
            }
        }

        for (i, e) in self.email.iter().enumerate() {
            let key = format!("alerts.email[{i}] ({})", e.name);
            check_name(&format!("alerts.email[{i}]"), &e.name, &mut errs);
            match SmtpTarget::parse(&e.smtp_url, e.tls) {
                Err(msg) => errs.push(format!("{key}.smtp_url: {msg}")),
                Ok(t) => {
                    if t.security == SmtpSecurity::Plain && !t.loopback {
                        errs.push(format!(
                            "{key}.tls: a plain SMTP connection is allowed only to a loopback address; use tls = \"starttls\" or an smtps:// URL"
                        ));
                    }
                    if t.security == SmtpSecurity::Plain && e.password.is_some() {
                        errs.push(format!(
                            "{key}.password: refusing to send a password over a plain connection"
                        ));
                    }
                }
            }
            if e.from.parse::<lettre::message::Mailbox>().is_err() {
                errs.push(format!("{key}.from: {:?} is not an email address", e.from));
            }
            if e.to.is_empty() {
                errs.push(format!("{key}.to: at least one recipient is needed"));
            }
            for (j, to) in e.to.iter().enumerate() {
                if to.parse::<lettre::message::Mailbox>().is_err() {
                    errs.push(format!("{key}.to[{j}]: {to:?} is not an email address"));
                }
            }
            match (&e.username, &e.password) {
                (Some(_), None) => errs.push(format!("{key}.password: needed with username")),
                (None, Some(_)) => errs.push(format!("{key}.username: needed with password")),
                _ => {}
            }
            if let Some(p) = &e.password {
                if let Err(msg) = p.resolve() {
                    errs.push(format!("{key}.password: {msg}"));
                }
            }
            if let Some(p) = &e.ca_file {
                if let Err(msg) = read_pem_certs(p) {
                    errs.push(format!("{key}.ca_file: {msg}"));
                }
            }
            check_rate(
                &key,
                e.rate_limit_count,
                e.rate_limit_window_secs,
                &mut errs,
            );
            check_timeout(&key, e.timeout_secs, &mut errs);
        }

        for (i, a) in self.alertmanager.iter().enumerate() {
            let key = format!("alerts.alertmanager[{i}] ({})", a.name);
            check_name(&format!("alerts.alertmanager[{i}]"), &a.name, &mut errs);
            if a.urls.is_empty() {
                errs.push(format!("{key}.urls: at least one URL is needed"));
            }
            for (j, u) in a.urls.iter().enumerate() {
                match check_http_url(u) {
                    Err(msg) => errs.push(format!("{key}.urls[{j}]: {msg}")),
                    // URLs are not secrets (they appear in logs and Debug): no credentials in them.
                    Ok(url) if !url.username().is_empty() || url.password().is_some() => errs.push(
                        format!("{key}.urls[{j}]: credentials in the URL are refused; put them in `headers` (a secret)"),
                    ),
                    Ok(_) => {}
                }
            }
            for name in a.labels.keys() {
                if !is_label_name(name) {
                    errs.push(format!("{key}.labels: {name:?} is not a valid label name"));
                } else if super::alertmanager::RESERVED_LABELS.contains(&name.as_str()) {
                    errs.push(format!("{key}.labels: {name:?} is set by xidwatch itself"));
                }
            }
            if a.resolve_after_secs < 60 {
                errs.push(format!("{key}.resolve_after_secs: must be at least 60"));
            }
            if let Some(g) = &a.generator_url {
                if let Err(msg) = check_http_url(g) {
                    errs.push(format!("{key}.generator_url: {msg}"));
                }
            }
            check_headers(&key, &a.headers, &mut errs);
            if let Some(p) = &a.ca_file {
                if let Err(msg) = read_pem_certs(p) {
                    errs.push(format!("{key}.ca_file: {msg}"));
                }
            }
            check_rate(
                &key,
                a.rate_limit_count,
                a.rate_limit_window_secs,
                &mut errs,
            );
            check_timeout(&key, a.timeout_secs, &mut errs);
        }

        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs)
        }
    }

    /// The value of every secret that resolves, for cutting them out of runbook evidence and
    /// delivery errors ([`crate::runbook::Redactor`] adds each one's parts). Also the shapes
    /// the libraries send them in that the values do not show: SMTP `AUTH PLAIN` and `LOGIN`
    /// credentials, and Alertmanager URLs that carry a password in their userinfo.
    pub fn secret_values(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .secrets()
            .into_iter()
            .filter_map(|(_, s)| s.resolve().ok())
            .map(|v| v.expose().to_string())
            .collect();
        for e in &self.email {
            let Some(pass) = e.password.as_ref().and_then(|p| p.resolve().ok()) else {
                continue;
            };
            let pass = pass.expose();
            let user = e.username.as_deref().unwrap_or_default();
            out.push(crate::runbook::redact::base64(pass.as_bytes()));
            out.push(crate::runbook::redact::base64(
                format!("\0{user}\0{pass}").as_bytes(),
            ));
        }
        for a in &self.alertmanager {
            for u in &a.urls {
                if reqwest::Url::parse(u).is_ok_and(|u| u.password().is_some()) {
                    out.push(u.clone());
                }
            }
        }
        out
    }

    /// Warnings about secrets that others can read: inline secrets in a config file that is
    /// readable by group or others, and `file:` secrets whose file is.
    pub fn secret_warnings(&self, config_path: Option<&Path>) -> Vec<String> {
        let mut out = Vec::new();
        let secrets = self.secrets();
        // An inline URL to this machine with no credentials in it (a local receiver) gives
        // nothing away to whoever reads the file.
        let harmless = |s: &Secret| match s {
            Secret::Inline(v) => url::Url::parse(v).is_ok_and(|u| {
                u.username().is_empty()
                    && u.password().is_none()
                    && match u.host() {
                        Some(url::Host::Ipv4(a)) => a.is_loopback(),
                        Some(url::Host::Ipv6(a)) => a.is_loopback(),
                        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
                        None => false,
                    }
            }),
            _ => false,
        };
        let inline: Vec<&str> = secrets
            .iter()
            .filter(|(k, s)| s.is_inline() && !(k.ends_with(".url") && harmless(s)))
            .map(|(k, _)| k.as_str())
            .collect();
        if let (Some(path), false) = (config_path, inline.is_empty()) {
            if let Some(mode) = readable_by_others(path) {
                out.push(format!(
                    "{} holds secrets inline ({}) and is readable by others (mode {:o}); run chmod o-r or use env:/file: secrets",
                    path.display(),
                    inline.join(", "),
                    mode
                ));
            }
        }
        for (key, s) in &secrets {
            if let Secret::File(p) = s {
                if let Some(mode) = readable_by_others(p) {
                    out.push(format!(
                        "{key}: secret file {} is readable by others (mode {:o}); run chmod o-r",
                        p.display(),
                        mode
                    ));
                }
            }
        }
        out
    }

    /// Channels that send in cleartext (`http://`) to a host that is not this machine: the alert,
    /// its evidence and any token in the URL cross the network unencrypted. Allowed (a receiver
    /// on a trusted network), but said by `xidwatch check`. Names the key and the host only.
    pub fn cleartext_warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut check = |key: String, url: &str| {
            let Ok(u) = url::Url::parse(url) else { return };
            if u.scheme() != "http" {
                return;
            }
            let loopback = match u.host() {
                Some(url::Host::Ipv4(a)) => a.is_loopback(),
                Some(url::Host::Ipv6(a)) => a.is_loopback(),
                Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
                None => true,
            };
            if !loopback {
                let host = u.host_str().unwrap_or_default();
                out.push(format!(
                    "{key}: plain http to {host}, which is not this machine: alerts, their evidence and any token in the URL cross the network unencrypted; use https"
                ));
            }
        };
        for (i, w) in self.webhook.iter().enumerate() {
            // An unresolvable secret is `validate`'s to report; nothing to say about it here.
            if let Ok(v) = w.url.resolve() {
                check(format!("alerts.webhook[{i}] ({}).url", w.name), v.expose());
            }
        }
        for (i, a) in self.alertmanager.iter().enumerate() {
            for (j, u) in a.urls.iter().enumerate() {
                check(
                    format!("alerts.alertmanager[{i}] ({}).urls[{j}]", a.name),
                    u,
                );
            }
        }
        out
    }

    /// Every secret of every channel, by key.
    fn secrets(&self) -> Vec<(String, &Secret)> {
        let mut secrets: Vec<(String, &Secret)> = Vec::new();
        for (i, w) in self.webhook.iter().enumerate() {
            secrets.push((format!("alerts.webhook[{i}].url"), &w.url));
            if let Some(s) = &w.hmac_secret {
                secrets.push((format!("alerts.webhook[{i}].hmac_secret"), s));
            }
            for (h, s) in &w.headers {
                secrets.push((format!("alerts.webhook[{i}].headers.{h}"), s));
            }
        }
        for (i, e) in self.email.iter().enumerate() {
            if let Some(s) = &e.password {
                secrets.push((format!("alerts.email[{i}].password"), s));
            }
        }
        for (i, a) in self.alertmanager.iter().enumerate() {
            for (h, s) in &a.headers {
                secrets.push((format!("alerts.alertmanager[{i}].headers.{h}"), s));
            }
        }
        secrets
    }
}

/// The mode, when the file is readable by others (everyone). Group-readable is fine: the
/// installer makes the config `0640 root:xidwatch` so the service's own group can read it.
fn readable_by_others(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o004 != 0).then_some(mode)
}

fn is_label_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// Checks an http(s) URL; the message never repeats the URL (it may hold a token).
pub(crate) fn check_http_url(text: &str) -> Result<reqwest::Url, String> {
    let url = reqwest::Url::parse(text).map_err(|e| format!("not a valid URL ({e})"))?;
    match url.scheme() {
        "http" | "https" => {}
        _ => return Err("the scheme is not http or https".to_string()),
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("the URL has no host".to_string());
    }
    Ok(url)
}

/// Reads a PEM bundle and checks it holds at least one certificate.
pub(crate) fn read_pem_certs(path: &Path) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !pem
        .windows(b"-----BEGIN CERTIFICATE-----".len())
        .any(|w| w == b"-----BEGIN CERTIFICATE-----")
    {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(pem)
}

/// How an SMTP connection is secured, once `smtp_url` and `tls` are read together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmtpSecurity {
    Plain,
    Starttls,
    Implicit,
}

/// A parsed `smtp_url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmtpTarget {
    pub host: String,
    pub port: u16,
    pub security: SmtpSecurity,
    pub loopback: bool,
}

impl SmtpTarget {
    pub fn parse(text: &str, tls: SmtpTls) -> Result<SmtpTarget, String> {
        let url = reqwest::Url::parse(text).map_err(|e| format!("not a valid URL ({e})"))?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err("put credentials in username/password, not in the URL".to_string());
        }
        if url.query().is_some() || url.path().len() > 1 {
            return Err(
                "expected smtp://host[:port] or smtps://host[:port] with no path or query"
                    .to_string(),
            );
        }
        let host = match url.host() {
            Some(url::Host::Ipv6(a)) => a.to_string(),
            Some(h) => h.to_string(),
            None => return Err("the URL has no host".to_string()),
        };
        let loopback = match url.host() {
            Some(url::Host::Ipv4(a)) => a.is_loopback(),
            Some(url::Host::Ipv6(a)) => a.is_loopback(),
            // smtp:// is not a "special" scheme, so an IP address arrives as a domain.
            Some(url::Host::Domain(d)) => {
                d.eq_ignore_ascii_case("localhost")
                    || d.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback())
            }
            None => false,
        };
        let security = match (url.scheme(), tls) {
            ("smtps", SmtpTls::Auto | SmtpTls::Implicit) => SmtpSecurity::Implicit,
            ("smtps", _) => {
                return Err(
                    "smtps:// means implicit TLS, which `tls` contradicts: leave `tls` out or set it to \"implicit\""
                        .to_string(),
                )
            }
            ("smtp", SmtpTls::Auto) if loopback => SmtpSecurity::Plain,
            ("smtp", SmtpTls::Auto | SmtpTls::Starttls) => SmtpSecurity::Starttls,
            ("smtp", SmtpTls::Implicit) => SmtpSecurity::Implicit,
            ("smtp", SmtpTls::None) => SmtpSecurity::Plain,
            // The scheme is part of the URL, which is never repeated.
            (_, _) => return Err("the scheme is not smtp or smtps".to_string()),
        };
        let port = url.port().unwrap_or(match security {
            SmtpSecurity::Implicit => 465,
            SmtpSecurity::Starttls => 587,
            SmtpSecurity::Plain => 25,
        });
        Ok(SmtpTarget {
            host,
            port,
            security,
            loopback,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> AlertConfig {
        #[derive(Deserialize)]
        struct Root {
            alerts: AlertConfig,
        }
        toml::from_str::<Root>(text).unwrap().alerts
    }

    #[test]
    fn secrets_stay_out_of_debug() {
        let cfg = parse(
            r#"
            [[alerts.webhook]]
            name = "slack"
            url = "https://hooks.slack.com/services/T000/B000/SUPERSECRETTOKEN"
            format = "slack"
            hmac_secret = "hmac-SUPERSECRETTOKEN"
            headers = { Authorization = "Bearer SUPERSECRETTOKEN" }
            [[alerts.email]]
            name = "mail"
            smtp_url = "smtps://mail.example.com"
            from = "xidwatch@example.com"
            to = ["oncall@example.com"]
            username = "xidwatch"
            password = "SUPERSECRETTOKEN"
            "#,
        );
        let dbg = format!("{cfg:?} {cfg:#?}");
        assert!(!dbg.contains("SUPERSECRETTOKEN"), "{dbg}");
        assert!(dbg.contains("<redacted>"));
        let v = cfg.webhook[0].url.resolve().unwrap();
        assert_eq!(format!("{v} {v:?}"), "<redacted> <redacted>");
    }

    #[test]
    fn secret_sources() {
        assert_eq!(Secret::parse("env:X"), Secret::Env("X".into()));
        assert_eq!(Secret::parse("file:/a/b"), Secret::File("/a/b".into()));
        assert_eq!(
            Secret::parse("inline:env:X"),
            Secret::Inline("env:X".into())
        );
        assert_eq!(Secret::parse("abc"), Secret::Inline("abc".into()));
        std::env::set_var("XIDWATCH_TEST_SECRET_A", "value-a");
        assert_eq!(
            Secret::Env("XIDWATCH_TEST_SECRET_A".into())
                .resolve()
                .unwrap()
                .expose(),
            "value-a"
        );
        let err = Secret::Env("XIDWATCH_TEST_SECRET_UNSET".into())
            .resolve()
            .unwrap_err();
        assert!(err.contains("XIDWATCH_TEST_SECRET_UNSET"));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        std::fs::write(&p, "file-value\n").unwrap();
        assert_eq!(Secret::File(p).resolve().unwrap().expose(), "file-value");
    }

    #[test]
    fn unknown_keys_are_rejected() {
        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        struct Root {
            alerts: AlertConfig,
        }
        let err = toml::from_str::<Root>(
            "[[alerts.webhook]]\nname='a'\nurl='http://x'\nformat='json'\nurl_typo=1\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("url_typo"), "{err}");
        assert!(toml::from_str::<Root>("[alerts]\ntimeout=3\n").is_err());
    }

    #[test]
    fn validate_names_the_key() {
        let cfg = parse(
            r#"
            [[alerts.webhook]]
            name = "a"
            url = "ftp://example.com/x"
            format = "json"
            [[alerts.webhook]]
            name = "a"
            url = "env:XIDWATCH_TEST_NOT_SET_EVER"
            format = "slack"
            [[alerts.email]]
            name = "mail"
            smtp_url = "smtp://mail.example.com"
            tls = "none"
            from = "not an address"
            to = []
            [[alerts.alertmanager]]
            name = "am"
            urls = ["http://127.0.0.1:9093", "nope", "http://admin:hunter2@127.0.0.1:9093"]
            labels = { severity = "x", "bad-name" = "y" }
            "#,
        );
        let errs = cfg.validate().unwrap_err();
        let all = errs.join("\n");
        for want in [
            "alerts.webhook[0] (a).url: the scheme is not http or https",
            "alerts.webhook[1].name: \"a\" is used by another channel",
            "alerts.webhook[1] (a).url: environment variable XIDWATCH_TEST_NOT_SET_EVER is not set",
            "alerts.email[0] (mail).tls: a plain SMTP connection",
            "alerts.email[0] (mail).from",
            "alerts.email[0] (mail).to: at least one",
            "alerts.alertmanager[0] (am).urls[1]",
            "alerts.alertmanager[0] (am).urls[2]: credentials in the URL are refused",
            "alerts.alertmanager[0] (am).labels: \"severity\" is set by xidwatch",
            "alerts.alertmanager[0] (am).labels: \"bad-name\"",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
            assert!(!all.contains("hunter2"), "a credential leaked into:\n{all}");
        }
    }

    #[test]
    fn smtp_targets() {
        let t = SmtpTarget::parse("smtp://127.0.0.1:2525", SmtpTls::Auto).unwrap();
        assert_eq!(
            (t.port, t.security, t.loopback),
            (2525, SmtpSecurity::Plain, true)
        );
        let t = SmtpTarget::parse("smtp://mail.example.com", SmtpTls::Auto).unwrap();
        assert_eq!((t.port, t.security), (587, SmtpSecurity::Starttls));
        let t = SmtpTarget::parse("smtps://mail.example.com", SmtpTls::Auto).unwrap();
        assert_eq!((t.port, t.security), (465, SmtpSecurity::Implicit));
        let t = SmtpTarget::parse("smtp://localhost:2525", SmtpTls::Starttls).unwrap();
        assert_eq!(t.security, SmtpSecurity::Starttls);
        assert!(SmtpTarget::parse("smtps://x", SmtpTls::Starttls).is_err());
        assert!(SmtpTarget::parse("smtp://u:p@x", SmtpTls::Auto).is_err());
        assert!(SmtpTarget::parse("http://x", SmtpTls::Auto).is_err());
    }

    #[test]
    fn stdout_is_the_default_channel() {
        let cfg = AlertConfig::default();
        assert!(cfg.validate().is_ok());
        let ch = cfg.channels();
        assert_eq!(ch.len(), 1);
        assert_eq!(ch[0].kind, ChannelKind::Stdout);
        let cfg = parse("[[alerts.alertmanager]]\nname = 'am'\nurls = ['http://127.0.0.1:9093']\n");
        assert!(cfg.channels().iter().all(|c| c.kind != ChannelKind::Stdout));
    }

    #[test]
    fn warns_about_readable_secrets() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("xidwatch.toml");
        let text = "[[alerts.webhook]]\nname='a'\nurl='https://example.com/hook'\nformat='json'\n";
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let cfg = parse(text);
        let w = cfg.secret_warnings(Some(&path));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("alerts.webhook[0].url"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(
            cfg.secret_warnings(Some(&path)).is_empty(),
            "0640 root:xidwatch is how the installer leaves it"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(cfg.secret_warnings(Some(&path)).is_empty());
    }

    /// A loopback receiver's URL with no credentials is no secret worth a warning; one with a
    /// password in it, or to another machine, still is.
    #[test]
    fn a_loopback_url_without_credentials_is_no_inline_secret() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("xidwatch.toml");
        for (url, warned) in [
            ("http://127.0.0.1:8080/hook", false),
            ("http://localhost:8080/hook", false),
            ("http://[::1]:8080/hook", false),
            ("http://u:pw@127.0.0.1:8080/hook", true),
            ("https://hooks.example.com/T0/B0/x", true),
        ] {
            let text = format!("[[alerts.webhook]]\nname='a'\nurl='{url}'\nformat='json'\n");
            std::fs::write(&path, &text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            let w = parse(&text).secret_warnings(Some(&path));
            assert_eq!(!w.is_empty(), warned, "{url}: {w:?}");
        }
    }
}
