//! Each GPU's history of faults, across restarts and reboots: one event per incident opened, kept
//! in the state directory (`history.json`), keyed by the board's serial (then its UUID, then its
//! PCI address when NVML could not say), bounded by age and count and compacted on every write.
//!
//! It answers the on-call's first question ("has this board done this before?") on every page —
//! "the 3rd Xid 79 on this board in 30 days" — and the repeat-offender rule raises the guidance to
//! "replace the board / open an RMA" with the earlier events attached.

pub mod pages;

use std::collections::VecDeque;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::health::config::HistoryConfig;
use crate::model::{Evidence, Incident, PciAddress, Severity, StepResult, StepStatus};

/// The state file.
pub const FILE: &str = "history.json";

/// Largest history file read back (10,000 events are about 3 MiB).
const MAX_FILE: u64 = 32 << 20;

const DAY_MS: u64 = 24 * 3600 * 1000;

/// Earlier events listed on a page, at most (the most recent ones).
const MAX_LISTED: usize = 20;

/// One fault on one board.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Wall-clock time of the incident's first fault, milliseconds since the Unix epoch: for a
    /// kernel log fault, when the kernel logged it (one read at start-up may be hours old, and
    /// the repeat window must count it then).
    pub at_ms: u64,
    /// `serial:...`, `uuid:...` or `pci:...`: which board it happened on.
    pub board: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<PciAddress>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// The finding kind that opened the incident (`xid`, `gpu_temperature`, ...).
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid: Option<u32>,
    pub severity: Severity,
    pub title: String,
    pub incident: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

impl Event {
    /// "Xid 79" or the kind.
    pub fn what(&self) -> String {
        match self.xid {
            Some(x) if self.kind == "xid" => format!("Xid {x}"),
            Some(x) if self.kind == "sxid" => format!("SXid {x}"),
            _ => self.kind.replace('_', " "),
        }
    }
}

/// The board key of an incident, or `None` for a host-wide one.
pub fn board_of(inc: &Incident) -> Option<String> {
    if let Some(s) = inc.gpu.serial.as_deref().filter(|s| !s.is_empty()) {
        return Some(format!("serial:{s}"));
    }
    if let Some(u) = inc.gpu.uuid.as_deref().filter(|s| !s.is_empty()) {
        return Some(format!("uuid:{u}"));
    }
    inc.pci.map(|p| format!("pci:{p}"))
}

/// How often an incident's fault happened before on its board.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// This one included.
    pub count_in_window: usize,
    pub window_days: u64,
    /// The repeat-offender rule matched.
    pub repeat_offender: bool,
    /// The most recent earlier events of the same fault on this board in the window (at most
    /// 20), oldest first.
    pub earlier: Vec<Event>,
    pub board: String,
    pub what: String,
}

impl Summary {
    /// "the 3rd Xid 79 on this board (serial 1650923011234) in 30 days".
    pub fn line(&self) -> String {
        let board = board_words(&self.board);
        if self.count_in_window <= 1 {
            return format!(
                "the first {} on this board ({board}) in {} days",
                self.what, self.window_days
            );
        }
        format!(
            "the {} {} on this board ({board}) in {} days",
            ordinal(self.count_in_window),
            self.what,
            self.window_days
        )
    }
}

/// A board key as words: `serial 1650923011234`, `pci 0007:86:00.0`. Only the kind's colon
/// becomes a space: the address keeps its own, or the page names a GPU no one can find.
pub fn board_words(board: &str) -> String {
    match board.split_once(':') {
        Some((kind, value)) => format!("{kind} {value}"),
        None => board.to_string(),
    }
}

fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// The history.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    pub events: VecDeque<Event>,
}

impl History {
    /// Records the opening of `inc` (once per incident id) and says how often it happened
    /// before. `None` for incidents on no GPU, test alerts and digests.
    pub fn record(&mut self, inc: &Incident, cfg: &HistoryConfig, now_ms: u64) -> Option<Summary> {
        if inc.test || inc.phase != crate::model::IncidentPhase::Opened {
            return None;
        }
        let board = board_of(inc)?;
        if !self.events.iter().any(|e| e.incident == inc.id) {
            self.events.push_back(Event {
                at_ms: inc.first_seen_ms,
                board: board.clone(),
                pci: inc.pci,
                uuid: inc.gpu.uuid.clone(),
                serial: inc.gpu.serial.clone(),
                kind: inc.kind.as_str().to_string(),
                xid: inc.xid,
                severity: inc.severity,
                title: inc.title.clone(),
                incident: inc.id.clone(),
                boot_id: inc.boot_id.clone(),
            });
        }
        self.compact(cfg, now_ms);
        let same = |e: &&Event| e.board == board && e.kind == inc.kind.as_str() && e.xid == inc.xid;
        let from = |days: u64| now_ms.saturating_sub(days.saturating_mul(DAY_MS));
        let (window_from, rule_from) = (from(cfg.window_days), from(cfg.repeat.window_days));
        let count_in_window = self
            .events
            .iter()
            .filter(same)
            .filter(|e| e.at_ms >= window_from)
            .count();
        let rule = &cfg.repeat;
        let repeat_offender = rule.enabled
            && inc.severity >= rule.min_severity
            && self
                .events
                .iter()
                .filter(same)
                .filter(|e| e.at_ms >= rule_from)
                .count()
                >= rule.count as usize;
        // The most recent earlier events only: a page lists a few, the count says how many.
        let mut earlier: Vec<Event> = self
            .events
            .iter()
            .rev()
            .filter(same)
            .filter(|e| e.at_ms >= window_from && e.incident != inc.id)
            .take(MAX_LISTED)
            .cloned()
            .collect();
        earlier.reverse();
        Some(Summary {
            count_in_window,
            window_days: cfg.window_days,
            repeat_offender,
            what: self
                .events
                .iter()
                .rev()
                .find(|e| e.incident == inc.id)
                .map_or_else(|| inc.kind.as_str().to_string(), Event::what),
            earlier,
            board,
        })
    }

    /// Drops events older than the retention and the oldest beyond the count limit.
    pub fn compact(&mut self, cfg: &HistoryConfig, now_ms: u64) {
        let from = now_ms.saturating_sub(cfg.retention_days.saturating_mul(DAY_MS));
        self.events.retain(|e| e.at_ms >= from);
        while self.events.len() > cfg.max_events {
            self.events.pop_front();
        }
    }

    /// Events matching `gpu` (a serial, UUID or PCI address, or the board key) since `since_ms`.
    pub fn query(&self, gpu: Option<&str>, since_ms: u64) -> Vec<&Event> {
        let norm = gpu.map(|g| {
            PciAddress::parse(g)
                .map(|p| p.to_string())
                .unwrap_or_else(|_| g.to_string())
        });
        self.events
            .iter()
            .filter(|e| e.at_ms >= since_ms)
            .filter(|e| match &norm {
                None => true,
                Some(g) => {
                    e.board == *g
                        || e.board.split_once(':').is_some_and(|(_, v)| v == g)
                        || e.serial.as_deref() == Some(g)
                        || e.uuid.as_deref() == Some(g)
                        || e.pci.map(|p| p.to_string()).as_deref() == Some(g)
                }
            })
            .collect()
    }
}

/// Reads `history.json` for another process (`xidwatch gpus`); a missing file is an empty
/// history, anything but a regular file an error naming it.
pub fn load(state_dir: &Path) -> anyhow::Result<History> {
    load_as(state_dir, crate::state::file::Reader::Visitor)
}

/// Reads `history.json` in the daemon: anything but its own regular file is set aside and the
/// history starts empty (see [`crate::state::file`]).
pub(crate) fn load_owned(state_dir: &Path) -> anyhow::Result<History> {
    load_as(state_dir, crate::state::file::Reader::Owner)
}

fn load_as(state_dir: &Path, who: crate::state::file::Reader) -> anyhow::Result<History> {
    use anyhow::Context;
    let path = state_dir.join(FILE);
    let Some(bytes) = crate::state::file::read_bounded(&path, MAX_FILE, who)? else {
        return Ok(History::default());
    };
    serde_json::from_slice(&bytes)
        .with_context(|| format!("{}: not a history file", path.display()))
}

/// Writes `history.json` atomically (mode 0640).
pub fn save(state_dir: &Path, h: &History) -> anyhow::Result<()> {
    use anyhow::Context;
    let bytes = serde_json::to_vec(h).context("serialising the history")?;
    save_bytes(state_dir, &bytes)
}

/// Writes an already serialised history atomically (mode 0640).
pub fn save_bytes(state_dir: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use anyhow::Context;
    crate::state::write_atomic(&state_dir.join(FILE), bytes, crate::state::STATE_FILE_MODE)
        .with_context(|| format!("writing {}", state_dir.join(FILE).display()))
}

/// The words that replace the next steps of a repeat offender's page.
pub fn escalation(s: &Summary) -> String {
    format!(
        "Replace the board / open an RMA: this is {}, which meets the repeat-offender rule. Drain the GPU, keep this alert and the history below for the RMA case, and do not return the board to service after a reset alone.",
        s.line()
    )
}

/// The page's history evidence: how often before (a note every channel shows), the earlier
/// events, and, for a repeat offender, the escalated next steps.
pub fn evidence(s: &Summary, host: &str, now_ms: u64) -> Evidence {
    let mut output = String::new();
    for e in &s.earlier {
        output.push_str(&format!(
            "{}  {}  {}  (incident {})\n",
            crate::clock::rfc3339(e.at_ms),
            e.what(),
            e.title,
            e.incident
        ));
    }
    if output.is_empty() {
        output = format!(
            "no earlier {} on this board in {} days\n",
            s.what, s.window_days
        );
    }
    let mut notes = vec![format!("history: {}", s.line())];
    if s.repeat_offender {
        notes.push("repeat offender: replace the board / open an RMA".into());
    }
    Evidence {
        runbook: "gpu-history".into(),
        meaning: String::new(),
        next_steps: if s.repeat_offender {
            escalation(s)
        } else {
            String::new()
        },
        steps: vec![StepResult {
            name: "earlier faults on this board".into(),
            kind: "history".into(),
            target: vec![s.board.clone()],
            status: StepStatus::Done { exit_code: None },
            output,
            bytes_dropped: 0,
            duration_ms: 0,
            notes,
        }],
        started_ms: now_ms,
        duration_ms: 0,
        host: host.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Category, FindingKind, GpuIdentity, IncidentPhase};

    fn inc(id: &str, at_ms: u64) -> Incident {
        Incident {
            id: id.into(),
            phase: IncidentPhase::Opened,
            host: "h".into(),
            boot_id: None,
            kind: FindingKind::Xid,
            xid: Some(79),
            pci: PciAddress::parse("0000:17:00.0").ok(),
            gpu: GpuIdentity {
                serial: Some("1650923011234".into()),
                ..GpuIdentity::default()
            },
            severity: Severity::Critical,
            category: Category::Pcie,
            title: "fell off the bus".into(),
            first_seen_ms: at_ms,
            last_seen_ms: at_ms,
            count: 1,
            findings: Vec::new(),
            echoes: Vec::new(),
            found_at_startup: false,
            before_lookback: false,
            runbook_override: None,
            dropped_alerts_before: 0,
            test: false,
            note: None,
            supersedes: Vec::new(),
            host_page: None,
            paged_as: Vec::new(),
        }
    }

    #[test]
    fn counts_repeats_per_board_and_escalates() {
        let cfg = HistoryConfig::default();
        let mut h = History::default();
        let day = DAY_MS;
        let s = h.record(&inc("a", 100 * day), &cfg, 100 * day).unwrap();
        assert_eq!(s.count_in_window, 1);
        assert!(!s.repeat_offender);
        assert!(s.line().contains("the first Xid 79"), "{}", s.line());
        // Recorded once per incident id.
        let s = h.record(&inc("a", 100 * day), &cfg, 100 * day).unwrap();
        assert_eq!(s.count_in_window, 1);
        let s = h.record(&inc("b", 110 * day), &cfg, 110 * day).unwrap();
        assert_eq!(s.count_in_window, 2);
        assert!(s.repeat_offender);
        assert!(s.line().contains("the 2nd Xid 79"), "{}", s.line());
        assert!(evidence(&s, "h", 0)
            .next_steps
            .starts_with("Replace the board"));
        // 40 days later the first two are out of the 30-day window, still in the history.
        let s = h.record(&inc("c", 150 * day), &cfg, 150 * day).unwrap();
        assert_eq!(s.count_in_window, 1);
        assert_eq!(h.events.len(), 3);
        // Retention: 90 days.
        h.compact(&cfg, 195 * day);
        assert_eq!(h.events.len(), 2);
        assert_eq!(ordinal(11), "11th");
        assert_eq!(ordinal(23), "23rd");
    }

    /// A GPU NVML cannot name is keyed by its address, and the page writes the address as it is.
    #[test]
    fn a_board_known_only_by_address_keeps_its_colons() {
        let mut i = inc("a", 1000);
        i.gpu = GpuIdentity::default();
        i.pci = PciAddress::parse("0007:86:00.0").ok();
        let s = History::default()
            .record(&i, &HistoryConfig::default(), 2000)
            .unwrap();
        assert_eq!(s.board, "pci:0007:86:00.0");
        assert!(s.line().contains("(pci 0007:86:00.0)"), "{}", s.line());
        assert_eq!(board_words("serial:1650923011234"), "serial 1650923011234");
    }

    #[test]
    fn bounded_by_count() {
        let cfg = HistoryConfig {
            max_events: 10,
            ..HistoryConfig::default()
        };
        let mut h = History::default();
        for i in 0..25 {
            h.record(&inc(&format!("i{i}"), 1000 + i), &cfg, 2000);
        }
        assert_eq!(h.events.len(), 10);
        assert_eq!(h.events[0].incident, "i15");
        assert_eq!(h.query(Some("0000:17:00.0"), 0).len(), 10);
        assert_eq!(h.query(Some("1650923011234"), 0).len(), 10);
        assert_eq!(h.query(Some("other"), 0).len(), 0);
    }
}
