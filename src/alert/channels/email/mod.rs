//! Email over SMTP (lettre, rustls): STARTTLS, implicit TLS, or plain to a loopback relay, with
//! optional authentication. The body is the readable summary; the full report and the JSON
//! document are attached.
//!
//! SMTP 4xx answers, timeouts and connection failures are temporary; 5xx answers (rejected
//! credentials, unknown recipients) and TLS failures are permanent.

use std::path::PathBuf;
use std::time::Duration;

use lettre::message::header::{ContentType, HeaderName, HeaderValue};
use lettre::message::{Attachment, Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::transport::smtp::extension::ClientId;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use serde::Deserialize;

use crate::alert::document::AlertDocument;
use crate::alert::error::ConfigIssue;
use crate::alert::http::{read_pem_certs, INCIDENT_HEADER};
use crate::alert::report;
use crate::alert::retry::DeliveryError;
use crate::alert::secret::Secret;
use crate::alert::sink::{
    check_rate, check_timeout, default_rate_count, default_rate_window, rate_limit, Accepted,
    ChannelCommon, ChannelConfig, ChannelKind, Delivery, Sink,
};
use crate::model::Severity;

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

fn default_smtp_timeout() -> u64 {
    30
}
fn default_subject_prefix() -> String {
    "[xidwatch]".to_string()
}

impl ChannelConfig for EmailConfig {
    fn table(&self) -> &'static str {
        "email"
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> ChannelKind {
        ChannelKind::Email
    }

    fn common(&self, min_severity: Severity) -> ChannelCommon {
        ChannelCommon {
            name: self.name.clone(),
            kind: ChannelKind::Email,
            min_severity: self.min_severity.unwrap_or(min_severity),
            rate_limit: rate_limit(self.rate_limit_count, self.rate_limit_window_secs),
            // Mail is for pages; a second mail saying all is quiet is opt-in.
            send_resolved: self.send_resolved.unwrap_or(false),
        }
    }

    fn validate(&self, key: &str, errs: &mut Vec<ConfigIssue>) {
        let e = self;
        match SmtpTarget::parse(&e.smtp_url, e.tls) {
            Err(msg) => errs.push(ConfigIssue::new(format!("{key}.smtp_url"), msg.to_string())),
            Ok(t) => {
                if t.security == SmtpSecurity::Plain && !t.loopback {
                    errs.push(ConfigIssue::new(format!("{key}.tls"), "a plain SMTP connection is allowed only to a loopback address; use tls = \"starttls\" or an smtps:// URL"));
                }
                if t.security == SmtpSecurity::Plain && e.password.is_some() {
                    errs.push(ConfigIssue::new(
                        format!("{key}.password"),
                        "refusing to send a password over a plain connection",
                    ));
                }
            }
        }
        if e.from.parse::<Mailbox>().is_err() {
            errs.push(ConfigIssue::new(
                format!("{key}.from"),
                format!("{:?} is not an email address", e.from),
            ));
        }
        if e.to.is_empty() {
            errs.push(ConfigIssue::new(
                format!("{key}.to"),
                "at least one recipient is needed",
            ));
        }
        for (j, to) in e.to.iter().enumerate() {
            if to.parse::<Mailbox>().is_err() {
                errs.push(ConfigIssue::new(
                    format!("{key}.to[{j}]"),
                    format!("{to:?} is not an email address"),
                ));
            }
        }
        match (&e.username, &e.password) {
            (Some(_), None) => errs.push(ConfigIssue::new(
                format!("{key}.password"),
                "needed with username",
            )),
            (None, Some(_)) => errs.push(ConfigIssue::new(
                format!("{key}.username"),
                "needed with password",
            )),
            _ => {}
        }
        if let Some(p) = &e.password {
            if let Err(msg) = p.resolve() {
                errs.push(ConfigIssue::new(format!("{key}.password"), msg.to_string()));
            }
        }
        if let Some(p) = &e.ca_file {
            if let Err(msg) = read_pem_certs(p) {
                errs.push(ConfigIssue::new(format!("{key}.ca_file"), msg.to_string()));
            }
        }
        check_rate(key, e.rate_limit_count, e.rate_limit_window_secs, errs);
        check_timeout(key, e.timeout_secs, errs);
    }

    fn secrets(&self) -> Vec<(String, &Secret)> {
        self.password
            .iter()
            .map(|s| ("password".to_string(), s))
            .collect()
    }

    /// SMTP `AUTH PLAIN` and `LOGIN` send the password base64-encoded.
    fn secret_shapes(&self) -> Vec<String> {
        let Some(pass) = self.password.as_ref().and_then(|p| p.resolve().ok()) else {
            return Vec::new();
        };
        let pass = pass.expose();
        let user = self.username.as_deref().unwrap_or_default();
        vec![
            crate::runbook::redact::base64(pass.as_bytes()),
            crate::runbook::redact::base64(format!("\0{user}\0{pass}").as_bytes()),
        ]
    }

    fn build(&self) -> Result<Box<dyn Sink>, String> {
        Ok(Box::new(EmailChannel::build(self)?))
    }
}

/// A configured email channel.
pub struct EmailChannel {
    name: String,
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    to: Vec<Mailbox>,
    subject_prefix: String,
}

impl std::fmt::Debug for EmailChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmailChannel")
            .field("name", &self.name)
            .field("from", &self.from)
            .field("to", &self.to)
            .finish_non_exhaustive()
    }
}

impl EmailChannel {
    pub fn build(cfg: &EmailConfig) -> Result<Self, String> {
        let target =
            SmtpTarget::parse(&cfg.smtp_url, cfg.tls).map_err(|e| format!("smtp_url: {e}"))?;
        if target.security == SmtpSecurity::Plain && !target.loopback {
            return Err(
                "tls: a plain SMTP connection is allowed only to a loopback address".into(),
            );
        }
        let tls_params = || -> Result<TlsParameters, String> {
            let mut b = TlsParameters::builder(target.host.clone());
            if let Some(path) = &cfg.ca_file {
                let pem = read_pem_certs(path)?;
                let cert = Certificate::from_pem(&pem)
                    .map_err(|e| format!("ca_file {}: {e}", path.display()))?;
                b = b.add_root_certificate(cert);
            }
            b.build_rustls().map_err(|e| format!("TLS settings: {e}"))
        };
        let tls = match target.security {
            SmtpSecurity::Plain => Tls::None,
            SmtpSecurity::Starttls => Tls::Required(tls_params()?),
            SmtpSecurity::Implicit => Tls::Wrapper(tls_params()?),
        };
        let mut b = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(target.host.clone())
            .port(target.port)
            .tls(tls)
            .timeout(Some(Duration::from_secs(cfg.timeout_secs)));
        if let Some(h) = &cfg.hello_name {
            b = b.hello_name(ClientId::Domain(h.clone()));
        }
        if let (Some(user), Some(pass)) = (&cfg.username, &cfg.password) {
            let pass = pass.resolve().map_err(|e| format!("password: {e}"))?;
            b = b.credentials(Credentials::new(user.clone(), pass.expose().to_string()));
        }
        let from = cfg
            .from
            .parse::<Mailbox>()
            .map_err(|e| format!("from: {:?} is not an address ({e})", cfg.from))?;
        let to = cfg
            .to
            .iter()
            .enumerate()
            .map(|(i, t)| {
                t.parse::<Mailbox>()
                    .map_err(|e| format!("to[{i}]: {t:?} is not an address ({e})"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if to.is_empty() {
            return Err("to: at least one recipient is needed".into());
        }
        Ok(EmailChannel {
            name: cfg.name.clone(),
            transport: b.build(),
            from,
            to,
            subject_prefix: cfg.subject_prefix.clone(),
        })
    }

    /// Sends `doc` as one mail to every recipient.
    pub async fn send(&self, doc: &AlertDocument) -> Result<(), DeliveryError> {
        let msg = message(doc, &self.from, &self.to, &self.subject_prefix)
            .map_err(|e| DeliveryError::permanent(format!("cannot build the message: {e}")))?;
        match self.transport.send(msg).await {
            Ok(_) => Ok(()),
            Err(e) => Err(classify(&e)),
        }
    }
}

impl Sink for EmailChannel {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> ChannelKind {
        ChannelKind::Email
    }

    fn deliver<'a>(&'a self, doc: &'a AlertDocument) -> Delivery<'a> {
        Box::pin(async move { self.send(doc).await.map(|()| Accepted::default()) })
    }
}

fn classify(e: &lettre::transport::smtp::Error) -> DeliveryError {
    let text = e.to_string();
    if e.is_permanent() {
        let auth = matches!(e.status().map(|c| c.to_string()), Some(ref c) if c.starts_with("53"));
        if auth {
            DeliveryError::permanent(format!("SMTP authentication rejected: {text}"))
        } else {
            DeliveryError::permanent(format!("SMTP rejected the message: {text}"))
        }
    } else if e.is_tls() {
        DeliveryError::permanent(format!("SMTP TLS failure: {text}"))
    } else if e.is_client() {
        DeliveryError::permanent(format!("SMTP client error: {text}"))
    } else if e.is_transient() {
        DeliveryError::transient(format!("SMTP temporary failure: {text}"))
    } else if e.is_timeout() {
        DeliveryError::transient(format!("SMTP timed out: {text}"))
    } else {
        DeliveryError::transient(format!("SMTP: {text}"))
    }
}

/// The message for `doc`: subject = headline, text body, report and JSON attached. The
/// Message-ID is derived from the incident, so a re-sent alert carries the same one.
pub fn message(
    doc: &AlertDocument,
    from: &Mailbox,
    to: &[Mailbox],
    subject_prefix: &str,
) -> Result<Message, String> {
    let subject = if subject_prefix.is_empty() {
        doc.headline.clone()
    } else {
        format!("{subject_prefix} {}", doc.headline)
    };
    let stem = doc.file_stem();
    let mut body = report::summary(doc);
    body.push_str("\nEvidence\n");
    if doc.evidence.is_empty() {
        body.push_str("  no runbook ran for this alert\n");
    }
    for e in &doc.evidence {
        body.push_str(&format!("  runbook {} ({} ms)\n", e.runbook, e.duration_ms));
        for s in &e.steps {
            body.push_str(&format!("    - {}: {}\n", s.name, s.status.describe()));
        }
    }
    body.push_str(&format!(
        "\nAttached: xidwatch-{stem}.txt (the full report with every step's output) and xidwatch-{stem}.json (the {} document).\n",
        doc.schema
    ));

    let host_part: String = doc
        .host
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
        .collect();
    let message_id = format!(
        "<{stem}.{}@{}>",
        doc.count,
        if host_part.is_empty() {
            "xidwatch"
        } else {
            &host_part
        }
    );

    let mut b = Message::builder()
        .from(from.clone())
        .subject(subject)
        .message_id(Some(message_id));
    for t in to {
        b = b.to(t.clone());
    }
    let text_type = ContentType::parse("text/plain; charset=utf-8").map_err(|e| e.to_string())?;
    let json_type = ContentType::parse("application/json").map_err(|e| e.to_string())?;
    let mut msg = b
        .multipart(
            MultiPart::mixed()
                .singlepart(SinglePart::plain(body))
                .singlepart(
                    Attachment::new(format!("xidwatch-{stem}.txt"))
                        .body(report::render(doc), text_type),
                )
                .singlepart(
                    Attachment::new(format!("xidwatch-{stem}.json"))
                        .body(doc.to_json_pretty(), json_type),
                ),
        )
        .map_err(|e| e.to_string())?;
    if let Ok(name) = HeaderName::new_from_ascii(INCIDENT_HEADER.to_string()) {
        let id: String = doc.id.chars().filter(|c| c.is_ascii_graphic()).collect();
        msg.headers_mut().insert_raw(HeaderValue::new(name, id));
    }
    Ok(msg)
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
