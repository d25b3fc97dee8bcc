//! Secrets never reach evidence: every configured secret value is cut out of what runbooks found
//! before it is stored or sent. The catalog already keeps steps away from process environments;
//! this is the second line, for anything a program prints that it should not have.

use std::fmt;
use std::sync::Arc;

use crate::model::{Evidence, StepStatus};

/// What stands in for a secret.
pub const REDACTED: &str = "<redacted>";

/// Secrets shorter than this are not searched for: they would cut ordinary words out of the
/// evidence, and are not secrets worth the name.
pub const MIN_SECRET_LEN: usize = 4;

/// The secret values to cut out. `Debug` never shows them.
#[derive(Clone, Default)]
pub struct Redactor {
    secrets: Arc<Vec<String>>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

impl Redactor {
    pub fn new<I: IntoIterator<Item = String>>(values: I) -> Redactor {
        let mut secrets: Vec<String> = values
            .into_iter()
            .filter(|s| s.len() >= MIN_SECRET_LEN)
            .collect();
        // Longest first, so a secret that contains another is cut whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
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
            out.push_str(nl);
        }
        out
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
}
