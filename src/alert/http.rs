//! The HTTP code the channels share (webhooks, Slack, Alertmanager): URL checks, CA bundles, a
//! rustls client that follows no redirect, secret headers, and a POST whose failures are
//! classified for the retry policy and never mention the URL (it may hold a token).
//!
//! One module so that every HTTP channel fails, times out and redacts alike, and so a channel
//! never borrows another channel's code.

use std::path::Path;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use super::error::ConfigIssue;
use super::retry::{classify_http_status, parse_retry_after, DeliveryError, FailureKind};
use super::secret::Secret;
use crate::runbook::redact::CUT_MARK;

/// The header carrying the incident id on every request.
pub const INCIDENT_HEADER: &str = "X-Xidwatch-Incident";
/// The header naming the document schema.
pub const SCHEMA_HEADER: &str = "X-Xidwatch-Schema";

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

/// Checks configured headers: valid names, and values that resolve to valid header values.
pub(crate) fn check_headers(
    key: &str,
    headers: &std::collections::BTreeMap<String, Secret>,
    errs: &mut Vec<ConfigIssue>,
) {
    for (name, value) in headers {
        if HeaderName::from_bytes(name.as_bytes()).is_err() {
            errs.push(ConfigIssue::new(
                format!("{key}.headers"),
                format!("{name:?} is not a valid header name"),
            ));
        }
        match value.resolve() {
            Err(e) => errs.push(ConfigIssue::new(
                format!("{key}.headers.{name}"),
                e.to_string(),
            )),
            Ok(v) => {
                if HeaderValue::from_str(v.expose()).is_err() {
                    errs.push(ConfigIssue::new(
                        format!("{key}.headers.{name}"),
                        "the value is not a valid header value",
                    ));
                }
            }
        }
    }
}
