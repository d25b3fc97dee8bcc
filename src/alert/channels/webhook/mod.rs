//! HTTP webhooks: the `xidwatch.alert/v1` JSON document or a Slack message, POSTed with an
//! `Idempotency-Key`, optional HMAC-SHA256 signature and custom headers.
//!
//! The `[[alerts.webhook]]` table, its checks, its build and its delivery; the HTTP code it shares
//! with Alertmanager is in [`crate::alert::http`], the Slack message in [`super::slack`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use hmac::{Hmac, Mac};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, USER_AGENT};
use serde::Deserialize;
use sha2::Sha256;

use super::slack;
use crate::alert::document::{AlertDocument, Phase};
use crate::alert::error::ConfigIssue;
use crate::alert::http::{check_headers, check_http_url, header_map, http_client, post};
use crate::alert::retry::DeliveryError;
use crate::alert::secret::{Secret, SecretValue};
use crate::alert::sink::{
    check_rate, check_timeout, default_http_timeout, default_rate_count, default_rate_window,
    rate_limit, Accepted, ChannelCommon, ChannelConfig, ChannelKind, Delivery, Sink,
};
use crate::model::Severity;

pub use crate::alert::http::{INCIDENT_HEADER, SCHEMA_HEADER};

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

fn default_signature_header() -> String {
    "X-Xidwatch-Signature".to_string()
}

impl ChannelConfig for WebhookConfig {
    fn table(&self) -> &'static str {
        "webhook"
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> ChannelKind {
        match self.format {
            WebhookFormat::Json => ChannelKind::Webhook,
            WebhookFormat::Slack => ChannelKind::Slack,
        }
    }

    fn common(&self, min_severity: Severity) -> ChannelCommon {
        ChannelCommon {
            name: self.name.clone(),
            kind: self.kind(),
            min_severity: self.min_severity.unwrap_or(min_severity),
            rate_limit: rate_limit(self.rate_limit_count, self.rate_limit_window_secs),
            send_resolved: self.send_resolved.unwrap_or(true),
        }
    }

    fn validate(&self, key: &str, errs: &mut Vec<ConfigIssue>) {
        match self.url.resolve() {
            Err(e) => errs.push(ConfigIssue::new(format!("{key}.url"), e.to_string())),
            Ok(u) => {
                if let Err(e) = check_http_url(u.expose()) {
                    errs.push(ConfigIssue::new(format!("{key}.url"), e.to_string()));
                }
            }
        }
        check_rate(
            key,
            self.rate_limit_count,
            self.rate_limit_window_secs,
            errs,
        );
        check_timeout(key, self.timeout_secs, errs);
        check_headers(key, &self.headers, errs);
        if HeaderName::from_bytes(self.signature_header.as_bytes()).is_err() {
            errs.push(ConfigIssue::new(
                format!("{key}.signature_header"),
                "not a valid header name",
            ));
        }
        if let Some(s) = &self.hmac_secret {
            if let Err(e) = s.resolve() {
                errs.push(ConfigIssue::new(
                    format!("{key}.hmac_secret"),
                    e.to_string(),
                ));
            }
        }
        if let Some(p) = &self.ca_file {
            if let Err(e) = crate::alert::http::read_pem_certs(p) {
                errs.push(ConfigIssue::new(format!("{key}.ca_file"), e.to_string()));
            }
        }
    }

    fn secrets(&self) -> Vec<(String, &Secret)> {
        let mut out = vec![("url".to_string(), &self.url)];
        if let Some(s) = &self.hmac_secret {
            out.push(("hmac_secret".to_string(), s));
        }
        for (h, s) in &self.headers {
            out.push((format!("headers.{h}"), s));
        }
        out
    }

    fn urls(&self) -> Vec<(String, String)> {
        // An unresolvable secret is `validate`'s to report; nothing to say about it here.
        match self.url.resolve() {
            Ok(v) => vec![("url".to_string(), v.expose().to_string())],
            Err(_) => Vec::new(),
        }
    }

    fn build(&self) -> Result<Box<dyn Sink>, String> {
        Ok(Box::new(WebhookChannel::build(self)?))
    }
}

/// A configured webhook, ready to send.
pub struct WebhookChannel {
    name: String,
    url: SecretValue,
    format: WebhookFormat,
    headers: HeaderMap,
    hmac: Option<SecretValue>,
    signature_header: HeaderName,
    client: reqwest::Client,
}

impl std::fmt::Debug for WebhookChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookChannel")
            .field("name", &self.name)
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

/// The key receivers deduplicate on: the incident id for the first alert, and the id with the
/// occurrence count for a digest (a digest is a new message about the same incident).
pub fn idempotency_key(doc: &AlertDocument) -> String {
    match doc.phase {
        Phase::Opened => doc.id.clone(),
        Phase::Digest => format!("{}/digest/{}", doc.id, doc.count),
        Phase::Resolved => format!("{}/resolved", doc.id),
    }
}

/// `sha256=<hex HMAC-SHA256(secret, body)>`: the value of the signature header.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    // HMAC accepts keys of any length; new_from_slice cannot fail for it.
    let mut mac = match <Hmac<Sha256> as Mac>::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(body);
    let bytes = mac.finalize().into_bytes();
    let mut hex = String::with_capacity(7 + bytes.len() * 2);
    hex.push_str("sha256=");
    for b in bytes {
        hex.push_str(&format!("{b:02x}"));
    }
    hex
}

impl WebhookChannel {
    pub fn build(cfg: &WebhookConfig) -> Result<Self, String> {
        let url = cfg.url.resolve().map_err(|e| format!("url: {e}"))?;
        check_http_url(url.expose()).map_err(|e| format!("url: {e}"))?;
        let hmac = match &cfg.hmac_secret {
            Some(s) => Some(s.resolve().map_err(|e| format!("hmac_secret: {e}"))?),
            None => None,
        };
        let signature_header = HeaderName::from_bytes(cfg.signature_header.as_bytes())
            .map_err(|_| "signature_header: not a valid header name".to_string())?;
        Ok(WebhookChannel {
            name: cfg.name.clone(),
            url,
            format: cfg.format,
            headers: header_map(&cfg.headers)?,
            hmac,
            signature_header,
            client: http_client(cfg.timeout_secs, cfg.ca_file.as_deref())?,
        })
    }

    pub fn format(&self) -> WebhookFormat {
        self.format
    }

    /// The body this channel sends for `doc`.
    pub fn body(&self, doc: &AlertDocument) -> Vec<u8> {
        match self.format {
            WebhookFormat::Json => doc.to_json(),
            WebhookFormat::Slack => serde_json::to_vec(&slack::payload(doc)).unwrap_or_default(),
        }
    }

    /// One POST of `doc`, signed when a secret is set.
    pub async fn send(&self, doc: &AlertDocument) -> Result<(), DeliveryError> {
        let body = self.body(doc);
        let mut headers = self.headers.clone();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            USER_AGENT,
            HeaderValue::from_static(concat!("xidwatch/", env!("CARGO_PKG_VERSION"))),
        );
        let put = |headers: &mut HeaderMap, name: &str, value: &str| {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                headers.insert(n, v);
            }
        };
        put(&mut headers, "Idempotency-Key", &idempotency_key(doc));
        put(&mut headers, INCIDENT_HEADER, &doc.id);
        put(&mut headers, SCHEMA_HEADER, &doc.schema);
        if let Some(secret) = &self.hmac {
            let sig = sign(secret.expose().as_bytes(), &body);
            if let Ok(v) = HeaderValue::from_str(&sig) {
                headers.insert(self.signature_header.clone(), v);
            }
        }
        post(&self.client, self.url.expose(), headers, body)
            .await
            .map(|_| ())
    }
}

impl Sink for WebhookChannel {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> ChannelKind {
        match self.format {
            WebhookFormat::Json => ChannelKind::Webhook,
            WebhookFormat::Slack => ChannelKind::Slack,
        }
    }

    fn deliver<'a>(&'a self, doc: &'a AlertDocument) -> Delivery<'a> {
        Box::pin(async move { self.send(doc).await.map(|()| Accepted::default()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc4231_case_2() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        assert_eq!(
            sign(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
