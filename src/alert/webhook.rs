//! HTTP webhooks: the `xidwatch.alert/v1` JSON document or a Slack message, POSTed with an
//! `Idempotency-Key`, optional HMAC-SHA256 signature and custom headers.
//!
//! Also the HTTP plumbing the Alertmanager channel shares: a rustls client, and a POST whose
//! failures are classified for the retry policy and never mention the URL (it may hold a token).

use std::time::{Duration, SystemTime};

use hmac::{Hmac, Mac};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER, USER_AGENT};
use sha2::Sha256;

use super::config::{
    check_http_url, read_pem_certs, Secret, SecretValue, WebhookConfig, WebhookFormat,
};
use super::document::{AlertDocument, Phase};
use super::retry::{classify_http_status, parse_retry_after, DeliveryError, FailureKind};
use super::slack;
use crate::runbook::redact::CUT_MARK;

/// The header carrying the incident id on every request.
pub const INCIDENT_HEADER: &str = "X-Xidwatch-Incident";
/// The header naming the document schema.
pub const SCHEMA_HEADER: &str = "X-Xidwatch-Schema";

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

/// Builds a rustls HTTP client with a timeout and optional extra CA certificates.
pub(crate) fn http_client(
    timeout_secs: u64,
    ca_file: Option<&std::path::Path>,
) -> Result<reqwest::Client, String> {
    let mut b = reqwest::Client::builder()
        .timeout(Duration::from_secs(timeout_secs))
        .connect_timeout(Duration::from_secs(timeout_secs.min(10)))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("xidwatch/", env!("CARGO_PKG_VERSION")));
    if let Some(path) = ca_file {
        let pem = read_pem_certs(path)?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("ca_file {}: {e}", path.display()))?;
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    b.build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

/// Resolves secret header values into a header map marked sensitive.
pub(crate) fn header_map(
    headers: &std::collections::BTreeMap<String, Secret>,
) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    for (name, secret) in headers {
        let n = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("headers: {name:?} is not a valid header name"))?;
        let v = secret
            .resolve()
            .map_err(|e| format!("headers.{name}: {e}"))?;
        let mut v = HeaderValue::from_str(v.expose())
            .map_err(|_| format!("headers.{name}: not a valid header value"))?;
        v.set_sensitive(true);
        map.insert(n, v);
    }
    Ok(map)
}

/// Describes a reqwest error without its URL, with its causes.
pub(crate) fn describe_reqwest(e: reqwest::Error) -> DeliveryError {
    let e = e.without_url();
    let mut msg = if e.is_timeout() {
        "timed out".to_string()
    } else if e.is_connect() {
        "cannot connect".to_string()
    } else if e.is_builder() {
        "cannot build the request".to_string()
    } else {
        "request failed".to_string()
    };
    let mut src: Option<&dyn std::error::Error> = std::error::Error::source(&e);
    let mut depth = 0;
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
        depth += 1;
        if depth > 4 {
            break;
        }
    }
    if e.is_builder() {
        DeliveryError::permanent(msg)
    } else {
        DeliveryError::transient(msg)
    }
}

/// The most of a receiver's answer that is read for an error text.
const ANSWER_READ_MAX: usize = 4096;

/// The start of the answer's body, with [`CUT_MARK`] where it was cut (a secret may end there).
async fn read_excerpt(mut resp: reqwest::Response) -> String {
    let mut bytes = Vec::new();
    let mut cut = false;
    while let Ok(Some(chunk)) = resp.chunk().await {
        let room = ANSWER_READ_MAX - bytes.len();
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            cut = true;
            break;
        }
        bytes.extend_from_slice(&chunk);
    }
    let mut text = String::from_utf8_lossy(&bytes).trim().to_string();
    if cut {
        text.push_str(CUT_MARK);
    }
    text
}

/// POSTs `body` and classifies the answer. Any 2xx is success.
pub(crate) async fn post(
    client: &reqwest::Client,
    url: &str,
    headers: HeaderMap,
    body: Vec<u8>,
) -> Result<u16, DeliveryError> {
    let resp = client
        .post(url)
        .headers(headers)
        .body(body)
        .send()
        .await
        .map_err(describe_reqwest)?;
    let status = resp.status();
    if status.is_success() {
        return Ok(status.as_u16());
    }
    let retry_after = resp
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, SystemTime::now()));
    // The receiver's answer helps ("invalid_payload", "no_service"), but may echo the request:
    // it is redacted and capped with the rest of the error, where every channel's errors are
    // (`Channel::deliver`). Read only so much of it, never a whole page.
    let excerpt = read_excerpt(resp).await;
    let kind = classify_http_status(status.as_u16());
    let mut message = format!("HTTP {}", status.as_u16());
    if !excerpt.is_empty() {
        message.push_str(&format!(": {excerpt}"));
    }
    if kind == FailureKind::Permanent && matches!(status.as_u16(), 401 | 403) {
        message.push_str(" (credentials rejected)");
    }
    Err(DeliveryError {
        kind,
        message,
        retry_after,
    })
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

    pub fn name(&self) -> &str {
        &self.name
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

    pub async fn deliver(&self, doc: &AlertDocument) -> Result<(), DeliveryError> {
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
