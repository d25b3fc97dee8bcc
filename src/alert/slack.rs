//! The Slack incoming-webhook message: a headline, then a coloured attachment of Block Kit blocks
//! with the meaning, the next step, the GPU's identity, the runbook's findings, the kernel log
//! lines and a list of the evidence steps.
//!
//! Incoming webhooks cannot post threaded replies (they return no message id), so the full
//! evidence is summarised and the message says where the full report lies on the host. Every
//! text is cut to Slack's limits (header 150, section 3000, field 2000 characters, 50 blocks) and
//! the whole message is kept well under the size Slack rejects.

use serde_json::{json, Value};

use super::document::{AlertDocument, Phase};
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
    let mut fault = match doc.xid {
        Some(x) => format!("Xid {x}"),
        None => escape(&doc.kind),
    };
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
    fields.truncate(10);
    blocks.push(json!({
        "type": "section",
        "fields": fields
            .into_iter()
            .map(|f| json!({ "type": "mrkdwn", "text": fit(&f, FIELD_MAX) }))
            .collect::<Vec<_>>(),
    }));

    let notes = doc.notes();
    if !notes.is_empty() {
        let mut text = String::from("*Runbook findings*");
        for (step, note) in &notes {
            text.push_str(&format!("\n• {} (`{}`)", escape(note), escape(step)));
        }
        blocks.push(section(fit(&text, NOTES_MAX)));
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
            .map(|e| match e.xid {
                Some(x) => format!("Xid {x} x{}", e.count),
                None => format!("{} x{}", escape(&e.kind), e.count),
            })
            .collect();
        blocks.push(section(fit(
            &format!("*Folded into this incident*: {}", parts.join(", ")),
            NOTES_MAX,
        )));
    }

    if !doc.evidence.is_empty() {
        let mut text = String::from("*Evidence*");
        for e in &doc.evidence {
            text.push_str(&format!(
                "\nrunbook `{}` ({} step(s), {} ms)",
                escape(&e.runbook),
                e.steps.len(),
                e.duration_ms
            ));
            for s in &e.steps {
                text.push_str(&format!(
                    "\n• `{}` {} ({} ms)",
                    escape(&s.name),
                    escape(&s.status.describe()),
                    s.duration_ms
                ));
            }
        }
        blocks.push(section(fit(&text, EVIDENCE_MAX)));
    }

    let where_ = match &doc.report_path {
        Some(p) => format!("full report: `{}` on {}", escape(p), escape(&doc.host)),
        // Only a file can be pointed at: the journal holds the report only when standard output
        // is a channel, which this message cannot know.
        None => format!("no report file kept on {}", escape(&doc.host)),
    };
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
    let body = format!(
        "No new finding for this incident since {} ({} occurrence(s) from {}). xidwatch has \
         stopped alerting about it; a new fault on this GPU opens a new incident.",
        doc.last_seen, doc.count, doc.first_seen
    );
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
