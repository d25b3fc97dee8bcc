//! Secrets never reach evidence: every configured secret value is cut out of what runbooks found
//! before it is stored or sent. The catalog already keeps steps away from process environments;
//! this is the second line, for anything a program prints that it should not have.
//!
//! The same redactor cleans what a receiver answered before a delivery error is logged, stored
//! in the outbox or shown by `xidwatch status` ([`Redactor::error_text`]): receivers that echo
//! the request back would otherwise put the webhook URL and the `Authorization` header there.
//!
//! A secret shows up in more shapes than the configured value: a header value's token without
//! its `Bearer ` word, a URL's path (the request line) without its scheme and host, one of its
//! path segments or query values, its password, the `Basic` credentials made of its userinfo,
//! any of these percent-encoded. [`Redactor::new`] registers every such part of every secret.

use std::fmt;
use std::sync::Arc;

use crate::model::{Evidence, StepStatus};

/// What stands in for a secret.
pub const REDACTED: &str = "<redacted>";

/// Secrets shorter than this are not searched for: they would cut ordinary words out of the
/// evidence, and are not secrets worth the name.
pub const MIN_SECRET_LEN: usize = 4;

/// Parts of a secret URL (path segments, query values) shorter than this are left alone: `T000`
/// or `v2` are not secrets, and cutting them would make error texts unreadable.
pub const MIN_PART_LEN: usize = 8;

/// The most an error text derived from a request or its answer keeps, in bytes (after
/// redaction): enough for "invalid_payload" or an SMTP reply, not for a page of HTML.
pub const ERROR_TEXT_MAX: usize = 512;

/// Put where a text was cut before it reached the redactor (a receiver's answer read in part):
/// [`Redactor::error_text`] cuts the start of a secret left just before it.
pub const CUT_MARK: &str = " [\u{2026}cut]";

/// The secret values to cut out. `Debug` never shows them.
#[derive(Clone, Default)]
pub struct Redactor {
    secrets: Arc<Vec<String>>,
}

/// Whether a part of a URL looks like a token rather than a word: long enough, and with a digit,
/// a capital, a symbol, or so long that it is no word (`services`, `incoming-webhook` are kept).
fn secret_looking(part: &str) -> bool {
    part.len() >= MIN_PART_LEN
        && (part.len() >= 24
            || !part
                .chars()
                .all(|c| c.is_ascii_lowercase() || matches!(c, '-' | '_' | '.')))
}

/// `text` percent-encoded as a URL component (RFC 3986 unreserved characters kept).
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `text` with its `%XX` escapes decoded, when they decode to UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    if !text.contains('%') {
        return None;
    }
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Standard base64 with padding: the form of HTTP `Basic` and SMTP `AUTH` credentials.
pub(crate) fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Every shape in which `value` may show up in a text: the value, its token without a scheme
/// word, the parts of a URL, and the percent-encoded and decoded forms of each.
fn shapes(value: &str) -> Vec<String> {
    let mut out = vec![value.to_string()];
    let trimmed = value.trim();
    if trimmed != value {
        out.push(trimmed.to_string());
    }
    // A header value with its scheme word (`Bearer abc123`, `Basic dXNlcjpw`, `Token t`): the
    // token alone too, which error texts and receivers print without the word.
    if let Some((scheme, token)) = trimmed.split_once(' ') {
        if !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
        {
            out.push(token.trim().to_string());
        }
    }
    if let Ok(url) = url::Url::parse(trimmed) {
        if url.has_host() {
            out.push(url.as_str().to_string());
            let mut secret_part = false;
            if let Some(pass) = url.password() {
                secret_part = true;
                let user = url.username();
                out.push(pass.to_string());
                out.push(format!("{user}:{pass}"));
                let plain = |s: &str| percent_decode(s).unwrap_or_else(|| s.to_string());
                // What an HTTP client sends for a URL's userinfo.
                let creds = format!("{}:{}", plain(user), plain(pass));
                out.push(base64(creds.as_bytes()));
            }
            for seg in url.path_segments().into_iter().flatten() {
                if secret_looking(seg) {
                    secret_part = true;
                    out.push(seg.to_string());
                }
            }
            for pair in url.query().unwrap_or_default().split('&') {
                let v = pair.split_once('=').map_or(pair, |(_, v)| v);
                if secret_looking(v) {
                    secret_part = true;
                    out.push(v.to_string());
                }
            }
            // The request target, as a request line (and a receiver echoing it) shows it.
            if secret_part {
                let target = &url[url::Position::BeforePath..url::Position::AfterQuery];
                out.push(target.to_string());
            }
        }
    }
    let mut more = Vec::new();
    for s in &out {
        more.push(percent_encode(s));
        more.push(url::form_urlencoded::byte_serialize(s.as_bytes()).collect());
        more.extend(percent_decode(s));
    }
    out.extend(more);
    out
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

impl Redactor {
    /// A redactor for `values` and every part of them that may show up alone (see [`shapes`]).
    pub fn new<I: IntoIterator<Item = String>>(values: I) -> Redactor {
        let mut secrets: Vec<String> = values
            .into_iter()
            .flat_map(|v| shapes(&v))
            .filter(|s| s.len() >= MIN_SECRET_LEN)
            .collect();
        // Longest first, so a secret that contains another is cut whole (equal ones side by
        // side, for dedup).
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        Redactor {
            secrets: Arc::new(secrets),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// `text` with every secret replaced by [`REDACTED`].
    pub fn text(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in self.secrets.iter() {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), REDACTED);
            }
        }
        out
    }

    fn in_place(&self, text: &mut String) {
        if self.secrets.iter().any(|s| text.contains(s.as_str())) {
            *text = self.text(text);
        }
    }

    /// `body` with the start of a secret cut from its end, where `body` was cut in the middle
    /// of one.
    fn cut_tail(&self, body: &str, out: &mut String) {
        let part = self.secrets.iter().find_map(|s| {
            (MIN_SECRET_LEN..s.len())
                .rev()
                .filter(|k| s.is_char_boundary(*k))
                .find(|k| body.ends_with(&s[..*k]))
        });
        match part {
            Some(k) => {
                out.push_str(&body[..body.len() - k]);
                out.push_str(REDACTED);
            }
            None => out.push_str(body),
        }
    }

    /// `text` with the start of a secret cut from the end of every line: where output was cut
    /// at its cap (the cut always falls at the end of a line of the kept text), a secret may be
    /// kept in part.
    fn cut_partial(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        for line in text.split_inclusive('\n') {
            let (body, nl) = match line.strip_suffix('\n') {
                Some(b) => (b, "\n"),
                None => (line, ""),
            };
            self.cut_tail(body, &mut out);
            out.push_str(nl);
        }
        out
    }

    /// An error text made from a request or its answer (a receiver's body, an SMTP reply, an
    /// HTTP library's message), fit to be logged, stored and shown: secrets cut out, control
    /// characters made spaces (one log line), the start of a secret cut before each
    /// [`CUT_MARK`], and at most [`ERROR_TEXT_MAX`] bytes, saying how much was cut. Redaction
    /// comes before the cap, so the cap never leaves part of a secret.
    pub fn error_text(&self, text: &str) -> String {
        let text: String = text
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let mut out = String::with_capacity(text.len().min(ERROR_TEXT_MAX + 64));
        let mut pieces = text.split(CUT_MARK).peekable();
        while let Some(piece) = pieces.next() {
            let clean = self.text(piece);
            if pieces.peek().is_some() {
                self.cut_tail(&clean, &mut out);
                out.push_str(CUT_MARK);
            } else {
                out.push_str(&clean);
            }
        }
        cap(out, ERROR_TEXT_MAX)
    }

    /// Cuts secrets out of every text of the evidence: outputs, argv, notes, errors.
    pub fn evidence(&self, ev: &mut Evidence) {
        if self.is_empty() {
            return;
        }
        for t in [&mut ev.meaning, &mut ev.next_steps, &mut ev.host] {
            self.in_place(t);
        }
        for s in &mut ev.steps {
            self.in_place(&mut s.name);
            self.in_place(&mut s.output);
            if s.bytes_dropped > 0 {
                s.output = self.cut_partial(&s.output);
            }
            s.target.iter_mut().for_each(|t| self.in_place(t));
            s.notes.iter_mut().for_each(|t| self.in_place(t));
            match &mut s.status {
                StepStatus::Failed { error } => self.in_place(error),
                StepStatus::Missing { what } => self.in_place(what),
                StepStatus::Skipped { reason } => self.in_place(reason),
                _ => {}
            }
        }
    }
}

/// `text` cut to at most `max` bytes on a character boundary, saying how many bytes were cut.
pub fn cap(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut k = max;
    while !text.is_char_boundary(k) {
        k -= 1;
    }
    format!("{}\u{2026} ({} more bytes cut)", &text[..k], text.len() - k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_every_secret_and_leaves_short_ones() {
        let r = Redactor::new(["hunter2-token".to_string(), "hunter2".into(), "ab".into()]);
        assert_eq!(
            r.text("a hunter2-token b hunter2 ab"),
            "a <redacted> b <redacted> ab"
        );
        assert!(!format!("{r:?}").contains("hunter2"));
    }

    #[test]
    fn a_secret_cut_by_the_output_cap_is_cut_out_too() {
        let r = Redactor::new(["hunter2-token".to_string()]);
        assert_eq!(
            r.cut_partial("a hunt\nb hunter2-to"),
            "a <redacted>\nb <redacted>"
        );
        assert_eq!(r.cut_partial("a hun\n"), "a hun\n");
    }

    #[test]
    fn a_bearer_token_is_cut_without_its_word() {
        let r = Redactor::new(["Bearer abc123".to_string(), "Basic dXNlcjpwYXNz".into()]);
        assert_eq!(
            r.text("auth Bearer abc123, token abc123, basic dXNlcjpwYXNz"),
            "auth <redacted>, token <redacted>, basic <redacted>"
        );
    }

    #[test]
    fn a_url_is_cut_whole_and_by_its_secret_parts() {
        let url =
            "https://hooks.example/services/T000/B000/XXXXSECRET?token=qqqSECRET1&channel=alerts";
        let r = Redactor::new([url.to_string()]);
        assert_eq!(
            r.text(&format!("posting to {url} failed")),
            "posting to <redacted> failed"
        );
        // A receiver echoing the request line: the path and query without scheme and host.
        assert_eq!(
            r.text("POST /services/T000/B000/XXXXSECRET?token=qqqSECRET1&channel=alerts HTTP/1.1"),
            "POST <redacted> HTTP/1.1"
        );
        // Each secret-looking part alone; short parts and words stay.
        assert_eq!(
            r.text("path /services/T000/B000/XXXXSECRET, token qqqSECRET1, channel alerts"),
            "path /services/T000/B000/<redacted>, token <redacted>, channel alerts"
        );
    }

    #[test]
    fn userinfo_is_cut_with_the_basic_credentials_made_of_it() {
        let r = Redactor::new(["https://xidwatch:pa55word@am.example:9093/".to_string()]);
        assert_eq!(
            r.text("pass pa55word, userinfo xidwatch:pa55word"),
            "pass <redacted>, userinfo <redacted>"
        );
        // What an HTTP client sends for that userinfo: base64("xidwatch:pa55word").
        assert_eq!(base64(b"xidwatch:pa55word"), "eGlkd2F0Y2g6cGE1NXdvcmQ=");
        assert_eq!(
            r.text("authorization: Basic eGlkd2F0Y2g6cGE1NXdvcmQ="),
            "authorization: Basic <redacted>"
        );
    }

    #[test]
    fn percent_encoded_forms_are_cut_too() {
        let r = Redactor::new(["Bearer a+b/c=d_long".to_string()]);
        assert_eq!(r.text("x a%2Bb%2Fc%3Dd_long y"), "x <redacted> y");
        assert_eq!(r.text("x Bearer+a%2Bb%2Fc%3Dd_long y"), "x <redacted> y");
        let r = Redactor::new(["https://h.example/hook/AbC%2Fdef123".to_string()]);
        assert_eq!(
            r.text("seg AbC/def123 and AbC%2Fdef123"),
            "seg <redacted> and <redacted>"
        );
    }

    #[test]
    fn words_in_a_url_are_not_secrets() {
        for w in ["services", "incoming-webhook", "T000", "alerts"] {
            assert!(!secret_looking(w), "{w}");
        }
        for s in ["XXXXSECRET", "B01234567", "abcdefghijklmnopqrstuvwxyz"] {
            assert!(secret_looking(s), "{s}");
        }
    }

    #[test]
    fn error_texts_are_redacted_then_capped_on_a_char_boundary() {
        let r = Redactor::new(["Bearer tok-SECRET-123".to_string()]);
        let body = format!(
            "HTTP 400: authorization: Bearer tok-SECRET-123\r\n{}",
            "é".repeat(400)
        );
        let t = r.error_text(&body);
        assert!(!t.contains("tok-SECRET-123"), "{t}");
        assert!(
            t.starts_with("HTTP 400: authorization: <redacted>  é"),
            "{t}"
        );
        assert!(t.len() <= ERROR_TEXT_MAX + 40, "{}", t.len());
        assert!(t.ends_with("more bytes cut)"), "{t}");
        // A text short enough stays whole.
        assert_eq!(r.error_text("HTTP 500: boom"), "HTTP 500: boom");
        // A secret cut where the answer was read in part loses what is left of it.
        let t = r.error_text(&format!("HTTP 500: Bearer tok-SEC{CUT_MARK}"));
        assert_eq!(t, format!("HTTP 500: <redacted>{CUT_MARK}"));
    }
}
