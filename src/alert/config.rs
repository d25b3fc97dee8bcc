//! The `[alerts]` table of the configuration: its own keys (severity floor, queue, outbox, retry)
//! and the lists of channels, each kind's table defined in its folder under `channels/`.
//!
//! Built in two steps, like every component: this module deserialises and validates (naming the
//! offending key), [`BuiltChannels`](super::channel::BuiltChannels) then builds the channels.
//! Everything that treats every channel alike goes through [`AlertConfig::configured`], the one
//! list of the kinds that have tables.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;

pub use super::channels::alertmanager::AlertmanagerConfig;
pub use super::channels::email::EmailConfig;
pub use super::channels::stdout::StdoutConfig;
pub use super::channels::webhook::WebhookConfig;
use super::error::ConfigIssue;
use super::handoff::HandoffConfig;
pub use super::retry::RetryConfig;
pub use super::secret::Secret;
use super::sink::{ChannelCommon, ChannelConfig};
use crate::model::Severity;

// The names this module has always offered, now defined where they belong.
pub use super::channels::email::{SmtpSecurity, SmtpTarget, SmtpTls};
pub use super::channels::stdout::StdoutFormat;
pub use super::channels::webhook::WebhookFormat;
pub use super::secret::SecretValue;
pub use super::sink::{ChannelKind, RateLimit, STDOUT_CHANNEL};

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
    pub handoff: HandoffConfig,
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
            handoff: HandoffConfig::default(),
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

/// One configured channel's settings, by kind: a reload rebuilds a channel only when these change.
#[derive(Debug, Clone, PartialEq)]
pub enum ChannelSettings {
    Stdout(StdoutConfig),
    Webhook(WebhookConfig),
    Email(EmailConfig),
    Alertmanager(AlertmanagerConfig),
}

impl AlertConfig {
    /// Every channel that has a table, in config order, with its index in its table: the one
    /// place that lists the kinds.
    pub fn configured(&self) -> Vec<(usize, &dyn ChannelConfig)> {
        let mut out: Vec<(usize, &dyn ChannelConfig)> = Vec::new();
        out.extend(
            self.webhook
                .iter()
                .enumerate()
                .map(|(i, c)| (i, c as &dyn ChannelConfig)),
        );
        out.extend(
            self.email
                .iter()
                .enumerate()
                .map(|(i, c)| (i, c as &dyn ChannelConfig)),
        );
        out.extend(
            self.alertmanager
                .iter()
                .enumerate()
                .map(|(i, c)| (i, c as &dyn ChannelConfig)),
        );
        out
    }

    /// The settings of the channel called `name`, for comparing across a reload.
    pub fn settings(&self, name: &str) -> Option<ChannelSettings> {
        if name == STDOUT_CHANNEL {
            return Some(ChannelSettings::Stdout(self.stdout.clone()));
        }
        if let Some(w) = self.webhook.iter().find(|w| w.name == name) {
            return Some(ChannelSettings::Webhook(w.clone()));
        }
        if let Some(e) = self.email.iter().find(|e| e.name == name) {
            return Some(ChannelSettings::Email(e.clone()));
        }
        let a = self.alertmanager.iter().find(|a| a.name == name)?;
        Some(ChannelSettings::Alertmanager(a.clone()))
    }

    /// Whether the standard output channel is on: explicitly, or because nothing else is.
    pub fn stdout_enabled(&self) -> bool {
        self.stdout.enabled.unwrap_or(self.configured().is_empty())
    }

    /// Every enabled channel's name, kind, filter and rate limit, in config order.
    pub fn channels(&self) -> Vec<ChannelCommon> {
        let mut out = Vec::new();
        if self.stdout_enabled() {
            out.push(self.stdout.common(self.min_severity));
        }
        for (_, c) in self.configured() {
            out.push(c.common(self.min_severity));
        }
        out
    }

    /// Checks everything that can be checked without sending: names, URLs, addresses, TLS
    /// settings, CA files, secrets' sources, bounds. Each error names its key, e.g.
    /// `alerts.webhook[0] (oncall).url: ...`.
    pub fn validate(&self) -> Result<(), Vec<ConfigIssue>> {
        let mut errs = Vec::new();
        if self.queue_capacity == 0 {
            errs.push(ConfigIssue::new(
                "alerts.queue_capacity",
                "must be at least 1",
            ));
        }
        if self.outbox.max_count == 0 {
            errs.push(ConfigIssue::new(
                "alerts.outbox.max_count",
                "must be at least 1",
            ));
        }
        if self.outbox.max_bytes < 64 * 1024 {
            errs.push(ConfigIssue::new(
                "alerts.outbox.max_bytes",
                "must be at least 65536",
            ));
        }
        if self.retry.initial_backoff_ms == 0 {
            errs.push(ConfigIssue::new(
                "alerts.retry.initial_backoff_ms",
                "must be at least 1",
            ));
        }
        if self.retry.max_backoff_secs == 0 {
            errs.push(ConfigIssue::new(
                "alerts.retry.max_backoff_secs",
                "must be at least 1",
            ));
        }
        let mut names = BTreeSet::new();
        for (i, c) in self.configured() {
            let at = format!("alerts.{}[{i}]", c.table());
            let name = c.name();
            if name.is_empty()
                || name.len() > 64
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                errs.push(ConfigIssue::new(
                    format!("{at}.name"),
                    format!("{name:?} must be 1-64 characters of letters, digits, '-', '_' or '.'"),
                ));
            } else if name == STDOUT_CHANNEL {
                errs.push(ConfigIssue::new(
                    format!("{at}.name"),
                    "\"stdout\" is reserved for standard output",
                ));
            } else if !names.insert(name.to_string()) {
                errs.push(ConfigIssue::new(
                    format!("{at}.name"),
                    format!("{name:?} is used by another channel"),
                ));
            }
            c.validate(&format!("{at} ({name})"), &mut errs);
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
        for (_, c) in self.configured() {
            out.extend(c.secret_shapes());
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
        for (i, c) in self.configured() {
            for (field, url) in c.urls() {
                let Ok(u) = url::Url::parse(&url) else {
                    continue;
                };
                if u.scheme() != "http" {
                    continue;
                }
                let loopback = match u.host() {
                    Some(url::Host::Ipv4(a)) => a.is_loopback(),
                    Some(url::Host::Ipv6(a)) => a.is_loopback(),
                    Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
                    None => true,
                };
                if !loopback {
                    let key = format!("alerts.{}[{i}] ({}).{field}", c.table(), c.name());
                    let host = u.host_str().unwrap_or_default();
                    out.push(format!(
                        "{key}: plain http to {host}, which is not this machine: alerts, their evidence and any token in the URL cross the network unencrypted; use https"
                    ));
                }
            }
        }
        out
    }

    /// Every secret of every channel, by key.
    fn secrets(&self) -> Vec<(String, &Secret)> {
        let mut secrets = Vec::new();
        for (i, c) in self.configured() {
            for (field, s) in c.secrets() {
                secrets.push((format!("alerts.{}[{i}].{field}", c.table()), s));
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
        let all = errs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n");
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

    /// Every kind is walked through the one list, in config order (each table in its order),
    /// and what is said about a channel names its table, index and name as before.
    #[test]
    fn every_channel_is_listed_once_in_config_order() {
        let cfg = parse(
            r#"
            [[alerts.alertmanager]]
            name = "am"
            urls = ["http://am.example:9093", "https://am-2.example:9093"]
            [[alerts.webhook]]
            name = "w0"
            url = "https://hooks.example/a"
            format = "json"
            [[alerts.email]]
            name = "mail"
            smtp_url = "smtp://127.0.0.1:25"
            from = "x@example.com"
            to = ["y@example.com"]
            [[alerts.webhook]]
            name = "w1"
            url = "http://hooks.example/b"
            format = "slack"
            headers = { Authorization = "inline:Bearer t0ken-value" }
            "#,
        );
        let listed: Vec<(usize, &str, &str)> = cfg
            .configured()
            .into_iter()
            .map(|(i, c)| (i, c.table(), c.name()))
            .collect();
        assert_eq!(
            listed,
            [
                (0, "webhook", "w0"),
                (1, "webhook", "w1"),
                (0, "email", "mail"),
                (0, "alertmanager", "am"),
            ]
        );
        let kinds: Vec<(String, ChannelKind, bool)> = cfg
            .channels()
            .into_iter()
            .map(|c| (c.name, c.kind, c.send_resolved))
            .collect();
        assert_eq!(
            kinds,
            [
                ("w0".to_string(), ChannelKind::Webhook, true),
                ("w1".to_string(), ChannelKind::Slack, true),
                ("mail".to_string(), ChannelKind::Email, false),
                ("am".to_string(), ChannelKind::Alertmanager, true),
            ]
        );
        assert!(!cfg.stdout_enabled(), "other channels are configured");
        assert_eq!(
            cfg.cleartext_warnings()
                .iter()
                .map(|w| w.split(':').next().unwrap_or_default())
                .collect::<Vec<_>>(),
            [
                "alerts.webhook[1] (w1).url",
                "alerts.alertmanager[0] (am).urls[0]"
            ]
        );
        let keys: Vec<String> = cfg.secrets().into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "alerts.webhook[0].url",
                "alerts.webhook[1].url",
                "alerts.webhook[1].headers.Authorization",
            ]
        );
        assert!(cfg
            .secret_values()
            .contains(&"Bearer t0ken-value".to_string()));
        assert_eq!(
            cfg.settings("w1")
                .map(|s| matches!(s, ChannelSettings::Webhook(_))),
            Some(true)
        );
        assert!(cfg.settings("nobody").is_none());
    }
}
