//! The Slack incoming-webhook message: a headline, then a coloured attachment of Block Kit blocks
//! with the meaning, the next step, the GPU's identity, the runbook's findings, the kernel log
//! lines and a list of the evidence steps.
//!
//! Incoming webhooks cannot post threaded replies (they return no message id), so the full
//! evidence is summarised and the message says where the full report lies on the host. Every
//! text is cut to Slack's limits (header 150, section 3000, field 2000 characters, 50 blocks) and
//! the whole message is kept well under the size Slack rejects.

use serde_json::{json, Value};

use crate::alert::document::{kind_words, AlertDocument, Phase, StepDoc, StepStatusDoc};
use crate::model::Severity;

const SECTION_MAX: usize = 3000;
const FIELD_MAX: usize = 2000;
const MEANING_MAX: usize = 1500;
const NOTES_MAX: usize = 1500;
const KERNEL_MAX: usize = 2500;
const EVIDENCE_MAX: usize = 1500;

/// Attachment colour by severity.
pub fn colour(sev: Severity) -> &'static str {
    match sev {
        Severity::Critical => "#d50000",
        Severity::Warning => "#ff9800",
        Severity::Info => "#2196f3",
    }
}

fn emoji(sev: Severity) -> &'static str {
    match sev {
        Severity::Critical => ":red_circle:",
        Severity::Warning => ":large_orange_circle:",
        Severity::Info => ":large_blue_circle:",
    }
}

/// Escapes the three characters Slack's mrkdwn treats as markup.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Cuts `s` to at most `max` characters, marking the cut.
fn fit(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn mrkdwn(text: String) -> Value {
    json!({ "type": "mrkdwn", "text": fit(&text, SECTION_MAX) })
}

fn section(text: String) -> Value {
    json!({ "type": "section", "text": mrkdwn(text) })
}

/// Lines of text in a code block, as many whole lines as fit in `max` characters.
fn code_block(lines: &[String], max: usize) -> String {
    let mut body = String::new();
    let mut shown = 0;
    for l in lines {
        let l = escape(&l.replace("```", "'''"));
        if body.chars().count() + l.chars().count() + 1 > max.saturating_sub(40) {
            break;
        }
        body.push_str(&l);
        body.push('\n');
        shown += 1;
    }
    let mut out = format!("```{}```", body.trim_end());
    if shown < lines.len() {
        out.push_str(&format!(
            "\n_{} more line(s) in the full report_",
            lines.len() - shown
        ));
    }
    out
}

/// Output excerpt shown per step, in characters.
const EXCERPT_MAX: usize = 160;

/// `title` then as many whole `items` (one a line) as fit in `max` characters; when some do not
/// fit, a last line says how many were left out and where the full report is. Never cut inside
/// an item: a path or a step cut in half reads as something it is not.
fn whole_items(title: &str, items: &[String], max: usize, where_: &str) -> String {
    let mut text = title.to_string();
    let mut shown = 0;
    for (i, item) in items.iter().enumerate() {
        let left = items.len() - i - 1;
        // Room for the "left out" line, unless this is the last item.
        let reserve = if left == 0 {
            0
        } else {
            60 + where_.chars().count()
        };
        if text.chars().count() + 1 + item.chars().count() + reserve > max {
            break;
        }
        text.push('\n');
        text.push_str(item);
        shown += 1;
    }
    if shown < items.len() {
        text.push_str(&format!(
            "\n_{} more item(s) left out here; {where_}_",
            items.len() - shown
        ));
    }
    text
}

/// One line per step saying what it found: its first note, else the first line of its output;
/// the steps whose program is not installed are said once, together.
fn evidence_items(steps: &[StepDoc]) -> Vec<String> {
    let mut items = Vec::new();
    let mut missing: Vec<String> = Vec::new();
    let mut searched: Option<String> = None;
    // The one "not installed" line stands where the first such step was.
    let mut missing_at = None;
    for s in steps {
        if let StepStatusDoc::Missing { what } = &s.status {
            if let Some((program, rest)) = what.split_once(" is not installed ") {
                if !missing.iter().any(|m| m == program) {
                    missing.push(program.to_string());
                }
                searched.get_or_insert_with(|| rest.trim().to_string());
                missing_at.get_or_insert(items.len());
                continue;
            }
        }
        let mut line = format!(
            "• `{}` {} ({} ms)",
            escape(&s.name),
            escape(&s.status.describe()),
            s.duration_ms
        );
        let found = s
            .notes
            .first()
            .map(|n| n.to_string())
            .or_else(|| excerpt(&s.output));
        if let Some(f) = found {
            line.push_str(&format!(": {}", escape(&f.replace('`', "'"))));
        }
        items.push(line);
    }
    if !missing.is_empty() {
        let mut line = format!("• not installed here: {}", escape(&missing.join(", ")));
        if let Some(w) = searched.filter(|w| !w.is_empty()) {
            line.push_str(&format!(" {}", escape(&w)));
        }
        items.insert(missing_at.unwrap_or(items.len()), line);
    }
    items
}

/// The first non-empty line of a step's output (cut at a word to [`EXCERPT_MAX`] characters,
/// and said so), and how many lines follow it in the full report.
fn excerpt(output: &str) -> Option<String> {
    let first = output.lines().map(str::trim).find(|l| !l.is_empty())?;
    let more = output
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
        .saturating_sub(1);
    let mut out = if first.chars().count() <= EXCERPT_MAX {
        first.to_string()
    } else {
        let cut: String = first.chars().take(EXCERPT_MAX).collect();
        match cut.rfind(' ') {
            Some(i) if i > EXCERPT_MAX / 2 => format!("{} [line cut]", &cut[..i]),
            _ => format!("{cut} [line cut]"),
        }
    };
    if more > 0 {
        out.push_str(&format!(" (+{more} line(s))"));
    }
    Some(out)
}

/// The message posted to the incoming webhook.
pub fn payload(doc: &AlertDocument) -> Value {
    if doc.phase == Phase::Resolved {
        return resolved_payload(doc);
    }
    let headline = format!("{} {}", emoji(doc.severity), escape(&doc.headline));
    let mut blocks = Vec::new();

    if doc.test {
        blocks.push(section(
            ":test_tube: *This is a test alert* sent by `xidwatch test-alert`; nothing is wrong with any GPU."
                .to_string(),
        ));
    }
    if doc.dropped_alerts_before > 0 {
        blocks.push(section(format!(
            ":warning: {} earlier alert(s) were dropped because the alert outbox on {} was full.",
            doc.dropped_alerts_before,
            escape(&doc.host)
        )));
    }

    blocks.push(section(format!(
        "*What it means*\n{}\n*What to do*\n{}",
        fit(&escape(&doc.meaning), MEANING_MAX),
        fit(&escape(&doc.next_steps), MEANING_MAX)
    )));

    if let Some(h) = &doc.handoff {
        let mut text = format!("*Hand-off ({})*", h.scheduler.as_str());
        if !h.commands.is_empty() {
            text.push_str(&format!("\n```{}```", escape(&h.commands.join("\n"))));
        }
        text.push_str(&format!("\n_{}_", escape(&h.note)));
        blocks.push(section(text));
    }

    let mut fields = vec![format!("*Host*\n{}", escape(&doc.host))];
    if let Some(g) = &doc.gpu {
        // Without an index (NVML cannot reach the GPU, or is off), the address names it.
        // (The PCI field follows with the address.)
        let mut gpu = match g.index {
            Some(i) => format!("GPU {i}"),
            None if g.name.is_some() => "index unknown".to_string(),
            None => "index unknown (NVML cannot name it)".to_string(),
        };
        if let Some(n) = &g.name {
            gpu.push_str(&format!(" ({})", escape(n)));
        }
        fields.push(format!("*GPU*\n{gpu}"));
        if let Some(p) = &g.pci {
            fields.push(format!("*PCI*\n`{p}`"));
        }
        if let Some(u) = &g.uuid {
            fields.push(format!("*UUID*\n`{}`", escape(u)));
        }
        if let Some(s) = &g.serial {
            fields.push(format!("*Serial*\n`{}`", escape(s)));
        }
    }
    let mut fault = escape(&doc.fault_words());
    // For other kinds the catalog's mnemonic is the kind itself: not twice.
    if let Some(c) = doc
        .catalog
        .as_ref()
        .filter(|c| !c.mnemonic.is_empty() && c.mnemonic != doc.kind)
    {
        fault.push_str(&format!("\n`{}`", escape(&c.mnemonic)));
    }
    fields.push(format!("*Fault*\n{fault}"));
    fields.push(format!(
        "*Severity*\n{} ({})",
        doc.severity,
        doc.category.label()
    ));
    fields.push(format!(
        "*Seen*\n{} x{}{}",
        doc.first_seen,
        doc.count,
        if doc.found_at_startup {
            " (at startup)"
        } else {
            ""
        }
    ));
    if let Some(c) = &doc.catalog {
        if let Some(words) = c.action_words() {
            fields.push(format!("*NVIDIA action*\n{}", escape(&words)));
        }
    }
    if let Some(st) = &doc.gpu_state {
        fields.push(format!("*State now*\n{}", escape(&st.words())));
    }
    fields.truncate(10);
    blocks.push(json!({
        "type": "section",
        "fields": fields
            .into_iter()
            .map(|f| json!({ "type": "mrkdwn", "text": fit(&f, FIELD_MAX) }))
            .collect::<Vec<_>>(),
    }));

    let where_ = match &doc.report_path {
        Some(p) => format!("full report: `{}` on {}", escape(p), escape(&doc.host)),
        // Only a file can be pointed at: the journal holds the report only when standard output
        // is a channel, which this message cannot know.
        None => format!("no report file kept on {}", escape(&doc.host)),
    };

    let notes = doc.notes();
    if !notes.is_empty() {
        let items: Vec<String> = notes
            .iter()
            .map(|(step, note)| format!("• {} (`{}`)", escape(note), escape(step)))
            .collect();
        blocks.push(section(whole_items(
            "*Runbook findings*",
            &items,
            NOTES_MAX,
            &where_,
        )));
    }

    let lines = doc.kernel_lines();
    if !lines.is_empty() {
        blocks.push(section(format!(
            "*Kernel log*\n{}",
            code_block(&lines, KERNEL_MAX)
        )));
    }

    if !doc.echoes.is_empty() {
        let parts: Vec<String> = doc
            .echoes
            .iter()
            .map(|e| format!("{} x{}", escape(&kind_words(&e.kind, e.xid)), e.count))
            .collect();
        blocks.push(section(fit(
            &format!("*Folded into this incident*: {}", parts.join(", ")),
            NOTES_MAX,
        )));
    }

    if !doc.evidence.is_empty() {
        let mut items = Vec::new();
        for e in &doc.evidence {
            items.push(format!(
                "runbook `{}` ({} step(s), {} ms)",
                escape(&e.runbook),
                e.steps.len() + e.steps_omitted,
                e.duration_ms
            ));
            items.extend(evidence_items(&e.steps));
        }
        blocks.push(section(whole_items(
            "*Evidence*",
            &items,
            EVIDENCE_MAX,
            &where_,
        )));
    }

    blocks.push(json!({
        "type": "context",
        "elements": [
            { "type": "mrkdwn", "text": fit(&format!("incident `{}` · {where_}", escape(&doc.id)), FIELD_MAX) }
        ]
    }));
    blocks.truncate(50);

    json!({
        "phase": phase_word(doc),
        "text": fit(&headline, SECTION_MAX),
        "attachments": [
            {
                "color": colour(doc.severity),
                "fallback": fit(&escape(&doc.headline), SECTION_MAX),
                "blocks": blocks,
            }
        ]
    })
}

/// The document's phase as its JSON spells it, carried at the top of the Slack message so a bot
/// or a workflow reading the channel can tell a page from its digest and its resolution.
fn phase_word(doc: &AlertDocument) -> &'static str {
    match doc.phase {
        Phase::Opened => "opened",
        Phase::Digest => "digest",
        Phase::Resolved => "resolved",
    }
}

/// The resolved notice: short, green, naming the incident the page was about.
fn resolved_payload(doc: &AlertDocument) -> Value {
    let headline = format!(":white_check_mark: {}", escape(&doc.headline));
    let mut body = format!(
        "No new finding for this incident since {} ({} occurrence(s) from {}). xidwatch has \
         stopped alerting about it; a new fault on this GPU opens a new incident.",
        doc.last_seen, doc.count, doc.first_seen
    );
    if let Some(st) = &doc.gpu_state {
        body.push_str(&format!(" State now: {}.", escape(&st.words())));
    }
    if let Some(h) = &doc.host_page {
        body.push_str(&format!(" Opened in host page `{}`.", escape(h)));
    }
    json!({
        "phase": phase_word(doc),
        "text": fit(&headline, SECTION_MAX),
        "attachments": [
            {
                "color": "#2e7d32",
                "fallback": fit(&escape(&doc.headline), SECTION_MAX),
                "blocks": [
                    section(body),
                    {
                        "type": "context",
                        "elements": [
                            { "type": "mrkdwn", "text": fit(&format!("incident `{}` · {}", escape(&doc.id), escape(&doc.host)), FIELD_MAX) }
                        ]
                    }
                ],
            }
        ]
    })
}
