//! Email over SMTP (lettre, rustls): STARTTLS, implicit TLS, or plain to a loopback relay, with
//! optional authentication. The body is the readable summary; the full report and the JSON
//! document are attached.
//!
//! SMTP 4xx answers, timeouts and connection failures are temporary; 5xx answers (rejected
//! credentials, unknown recipients) and TLS failures are permanent.

use std::time::Duration;

use lettre::message::header::{ContentType, HeaderName, HeaderValue};
use lettre::message::{Attachment, Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::transport::smtp::extension::ClientId;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use super::config::{read_pem_certs, EmailConfig, SmtpSecurity, SmtpTarget};
use super::document::AlertDocument;
use super::report;
use super::retry::DeliveryError;
use super::webhook::INCIDENT_HEADER;

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

    pub fn name(&self) -> &str {
        &self.name
    }

    pub async fn deliver(&self, doc: &AlertDocument) -> Result<(), DeliveryError> {
        let msg = message(doc, &self.from, &self.to, &self.subject_prefix)
            .map_err(|e| DeliveryError::permanent(format!("cannot build the message: {e}")))?;
        match self.transport.send(msg).await {
            Ok(_) => Ok(()),
            Err(e) => Err(classify(&e)),
        }
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
