//! Text for people: `runbook list`, `runbook show`, `runbook run` and `check`.

use std::fmt::Write;

use crate::model::{Evidence, StepResult, StepStatus};

use super::{Action, LoadError, Runbook, RunbookSet};

fn indent(text: &str, prefix: &str) -> String {
    text.lines()
        .map(|l| {
            if l.is_empty() {
                "\n".to_string()
            } else {
                format!("{prefix}{l}\n")
            }
        })
        .collect()
}

fn serves(rb: &Runbook) -> String {
    let mut parts: Vec<String> = rb.rules().iter().map(|r| r.to_string()).collect();
    if rb.is_fallback() {
        parts.push("anything no other runbook serves (fallback)".into());
    }
    parts.join("; or ")
}

/// One runbook per line: name, title, what it serves, and whether it replaces a shipped one.
pub fn render_list(set: &RunbookSet) -> String {
    let width = set.iter().map(|r| r.name().len()).max().unwrap_or(0);
    let mut s = String::new();
    for rb in set.iter() {
        let _ = writeln!(s, "{:width$}  {}", rb.name(), rb.title());
        let _ = writeln!(s, "{:width$}  serves: {}", "", serves(rb));
        if !rb.overrides().is_empty() {
            let _ = writeln!(
                s,
                "{:width$}  from {} (replaces {})",
                "",
                rb.path().display(),
                rb.overrides()
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    if set.is_empty() {
        s.push_str("no runbooks\n");
    }
    s
}

/// A duration for people: `10 s`, `0.5 s`.
pub(super) fn secs(d: std::time::Duration) -> String {
    let v = d.as_secs_f64();
    if v.fract() == 0.0 {
        format!("{v:.0} s")
    } else {
        format!("{v} s")
    }
}

/// Everything about one runbook: what it serves, its human part, its steps as written.
pub fn render_show(rb: &Runbook) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{}: {}", rb.name(), rb.title());
    let _ = writeln!(s, "file: {}", rb.path().display());
    for p in rb.overrides() {
        let _ = writeln!(s, "replaces: {}", p.display());
    }
    let _ = writeln!(s, "serves: {}", serves(rb));
    if rb.priority() != 0 {
        let _ = writeln!(s, "priority: {}", rb.priority());
    }
    let l = rb.limits();
    let _ = writeln!(
        s,
        "limits: budget {}, step timeout {}, {} bytes of output per step, {} steps at a time",
        secs(l.budget),
        secs(l.step_timeout),
        l.max_output_bytes,
        l.concurrency
    );
    let _ = writeln!(s, "\nWhat it means:\n{}", indent(rb.meaning(), "  "));
    let _ = writeln!(s, "What to do next:\n{}", indent(rb.next_steps(), "  "));
    let _ = writeln!(s, "Steps:");
    for (i, step) in rb.steps().iter().enumerate() {
        let mut extra = vec![step.action.kind().to_string()];
        let needs = step.action.placeholders();
        if !needs.is_empty() {
            extra.push(format!(
                "needs {}",
                needs
                    .iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
        }
        if let Some(t) = step.timeout {
            extra.push(format!("timeout {}", secs(t)));
        }
        if let Some(b) = step.max_output_bytes {
            extra.push(format!("{b} bytes"));
        }
        let _ = writeln!(s, "  {}. {} ({})", i + 1, step.name, extra.join(", "));
        match &step.action {
            Action::Run(_) => {
                let _ = writeln!(s, "       {}", shell_words(&step.action.describe()));
                if let Some(p) = &step.pattern {
                    let _ = writeln!(s, "       (catalog: {p})");
                }
            }
            _ => {
                for line in step.action.describe() {
                    let _ = writeln!(s, "       {line}");
                }
            }
        }
    }
    s
}

/// An argv for reading (it is never given to a shell): words with spaces or quotes are quoted.
fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@%{}".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn status_text(st: &StepStatus) -> String {
    match st {
        StepStatus::Done { exit_code: None } => "done".into(),
        StepStatus::Done { exit_code: Some(0) } => "done (exit 0)".into(),
        StepStatus::Done { exit_code: Some(c) } => format!("done (exit {c})"),
        StepStatus::TimedOut { after_ms } => {
            format!("TIMED OUT after {after_ms} ms (process group killed)")
        }
        StepStatus::Missing { what } => format!("missing: {what}"),
        StepStatus::Skipped { reason } => format!("skipped: {reason}"),
        StepStatus::Failed { error } => format!("failed: {error}"),
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC` from milliseconds since the epoch.
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn render_step(s: &mut String, i: usize, step: &StepResult) {
    let target = if step.kind == "run" {
        shell_words(&step.target)
    } else {
        step.target.join(" ")
    };
    let _ = writeln!(s, "[{}] {} ({} {})", i + 1, step.name, step.kind, target);
    let _ = writeln!(
        s,
        "    {}, {} ms",
        status_text(&step.status),
        step.duration_ms
    );
    for n in &step.notes {
        let _ = writeln!(s, "    NOTE: {n}");
    }
    if !step.output.is_empty() {
        for line in step.output.lines() {
            let _ = writeln!(s, "    | {line}");
        }
    }
    if step.bytes_dropped > 0 {
        let _ = writeln!(
            s,
            "    ({} more bytes of output dropped)",
            step.bytes_dropped
        );
    }
}

/// The evidence as the on-call reads it: the human part, the notes, then each step's output.
pub fn render_evidence(ev: &Evidence) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Runbook {} on {} at {} ({} ms)",
        ev.runbook,
        ev.host,
        utc(ev.started_ms),
        ev.duration_ms
    );
    let _ = writeln!(s, "\nWhat it means:\n{}", indent(&ev.meaning, "  "));
    let _ = writeln!(s, "What to do next:\n{}", indent(&ev.next_steps, "  "));
    let notes: Vec<(usize, &String)> = ev
        .steps
        .iter()
        .enumerate()
        .flat_map(|(i, st)| st.notes.iter().map(move |n| (i + 1, n)))
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(s, "What the evidence says:");
        for (i, n) in notes {
            let _ = writeln!(s, "  - {n} [{i}]");
        }
        s.push('\n');
    }
    let _ = writeln!(s, "Evidence:");
    for (i, step) in ev.steps.iter().enumerate() {
        render_step(&mut s, i, step);
    }
    s
}

/// Load problems for `check` and startup, one per line, then a summary.
pub fn render_load_errors(errors: &[LoadError]) -> String {
    let mut s = String::new();
    for e in errors {
        let _ = writeln!(s, "{e}");
    }
    let refused = errors.iter().filter(|e| e.is_refusal()).count();
    let _ = writeln!(
        s,
        "{} problem(s) in runbooks, {refused} of them refused steps: xidwatch never runs a step that could change the machine",
        errors.len()
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_796_023_443_000), "2026-11-30 07:24:03 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }

    #[test]
    fn argv_quoting() {
        let a: Vec<String> = ["nvidia-smi", "-q", "a b", "it's", "--format=csv"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            shell_words(&a),
            "nvidia-smi -q 'a b' 'it'\\''s' --format=csv"
        );
    }
}
