//! The durable outbox: one JSON file per alert under `<state_dir>/alert-outbox/`, written before
//! any send and removed only when every channel has accepted the alert or failed for good.
//!
//! Each write goes to a temporary file that is fsynced, renamed over the real name, and the
//! directory fsynced, so a crash leaves either the old or the new file, never half of one. The
//! file also records each channel's progress, so after a restart a channel that already accepted
//! the alert is not sent it again.
//!
//! The outbox is bounded by count and bytes. When full, the oldest non-critical alert is dropped
//! first (then, only if every waiting alert is critical, the oldest critical one); drops are
//! counted in `meta.json` and the next alert carries the count in `dropped_alerts_before`.
//!
//! Synchronous on purpose: the dispatcher calls it from `spawn_blocking`.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::document::AlertDocument;
use crate::model::Severity;

/// Version of the outbox file layout (not of the alert document).
pub const FORMAT: u32 = 1;
const META: &str = "meta.json";

/// Where one channel stands with one alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    Pending,
    Delivered,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelState {
    pub state: DeliveryState,
    pub attempts: u32,
    /// Not before this time (ms since the epoch).
    pub next_attempt_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl ChannelState {
    fn pending(now_ms: u64) -> Self {
        ChannelState {
            state: DeliveryState::Pending,
            attempts: 0,
            next_attempt_ms: now_ms,
            last_error: None,
        }
    }
}

/// The outcome of one attempt, as the outbox records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    /// Temporary failure: try again at `next_attempt_ms`.
    Retry {
        next_attempt_ms: u64,
        error: String,
    },
    /// Given up: permanent failure, too many attempts or too old.
    Failed {
        error: String,
    },
}

#[derive(Serialize)]
struct EntryRef<'a> {
    format: u32,
    seq: u64,
    enqueued_ms: u64,
    channels: &'a BTreeMap<String, ChannelState>,
    document: &'a AlertDocument,
}

#[derive(Deserialize)]
struct EntryOwned {
    format: u32,
    seq: u64,
    enqueued_ms: u64,
    channels: BTreeMap<String, ChannelState>,
    document: AlertDocument,
}

/// One waiting alert in memory.
#[derive(Debug, Clone)]
pub struct Slot {
    pub seq: u64,
    pub enqueued_ms: u64,
    pub doc: Arc<AlertDocument>,
    pub channels: BTreeMap<String, ChannelState>,
    pub bytes: u64,
    /// False when the file could not be written (disk full); the alert is still delivered.
    pub persisted: bool,
}

impl Slot {
    fn finished(&self) -> bool {
        self.channels
            .values()
            .all(|c| c.state != DeliveryState::Pending)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Meta {
    /// Dropped since the last alert that reported drops.
    dropped_unreported: u64,
    /// Dropped since the outbox was created.
    dropped_total: u64,
}

/// An alert dropped to make room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub id: String,
    pub severity: Severity,
    pub headline: String,
}

/// What [`Outbox::push`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    /// The new alert's sequence number, or `None` when the new alert itself was dropped.
    pub seq: Option<u64>,
    pub dropped: Vec<Dropped>,
    /// The file could not be written; the error, for the log.
    pub write_error: Option<String>,
}

/// The end of an alert's life in the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub seq: u64,
    pub id: String,
    pub channels: BTreeMap<String, ChannelState>,
}

/// Bounds of the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_count: usize,
    pub max_bytes: u64,
}

/// The outbox directory and its contents in memory.
#[derive(Debug)]
pub struct Outbox {
    dir: PathBuf,
    limits: Limits,
    slots: BTreeMap<u64, Slot>,
    next_seq: u64,
    meta: Meta,
}

fn file_name(seq: u64) -> String {
    format!("{seq:016}.json")
}

/// Writes `bytes` to `dir/name` atomically and durably, readable by the service and its group
/// only (the state directory's one write helper).
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    crate::state::write_atomic(&dir.join(name), bytes, crate::state::STATE_FILE_MODE)
}

fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

impl Outbox {
    /// Opens (creating) the outbox in `dir` and loads what a previous run left. Unreadable files
    /// are renamed to `*.corrupt` and reported in the returned warnings, never deleted.
    pub fn open(dir: &Path, limits: Limits) -> io::Result<(Outbox, Vec<String>)> {
        create_private_dir(dir)?;
        let mut warnings = Vec::new();
        let mut slots = BTreeMap::new();
        let mut meta = Meta::default();
        let mut names: Vec<_> = fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for name in names {
            let path = dir.join(&name);
            if name.starts_with('.') && name.ends_with(".tmp") {
                // A write that never reached its rename: the old file (if any) is intact.
                let _ = fs::remove_file(&path);
                continue;
            }
            if name == META {
                match fs::read(&path).map(|b| serde_json::from_slice::<Meta>(&b)) {
                    Ok(Ok(m)) => meta = m,
                    _ => {
                        warnings.push(format!("{}: unreadable, drop counts reset", path.display()))
                    }
                }
                continue;
            }
            if !name.ends_with(".json") {
                continue;
            }
            let bytes = match fs::read(&path) {
                Ok(b) => b,
                Err(e) => {
                    warnings.push(format!("{}: cannot read: {e}", path.display()));
                    continue;
                }
            };
            match serde_json::from_slice::<EntryOwned>(&bytes) {
                Ok(e) if e.format == FORMAT && file_name(e.seq) == name => {
                    slots.insert(
                        e.seq,
                        Slot {
                            seq: e.seq,
                            enqueued_ms: e.enqueued_ms,
                            doc: Arc::new(e.document),
                            channels: e.channels,
                            bytes: bytes.len() as u64,
                            persisted: true,
                        },
                    );
                }
                Ok(_) | Err(_) => {
                    let bad = dir.join(format!("{name}.corrupt"));
                    let _ = fs::rename(&path, &bad);
                    warnings.push(format!(
                        "{}: not a readable outbox entry; moved to {}",
                        path.display(),
                        bad.display()
                    ));
                }
            }
        }
        let next_seq = slots.keys().next_back().map_or(1, |s| s + 1);
        Ok((
            Outbox {
                dir: dir.to_path_buf(),
                limits,
                slots,
                next_seq,
                meta,
            },
            warnings,
        ))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn bytes(&self) -> u64 {
        self.slots.values().map(|s| s.bytes).sum()
    }

    pub fn dropped_total(&self) -> u64 {
        self.meta.dropped_total
    }

    pub fn slots(&self) -> impl Iterator<Item = &Slot> {
        self.slots.values()
    }

    pub fn get(&self, seq: u64) -> Option<&Slot> {
        self.slots.get(&seq)
    }

    fn encode(slot: &Slot) -> Vec<u8> {
        serde_json::to_vec(&EntryRef {
            format: FORMAT,
            seq: slot.seq,
            enqueued_ms: slot.enqueued_ms,
            channels: &slot.channels,
            document: &slot.doc,
        })
        .unwrap_or_default()
    }

    fn write_meta(&self) -> io::Result<()> {
        let bytes = serde_json::to_vec(&self.meta).unwrap_or_default();
        write_atomic(&self.dir, META, &bytes)
    }

    fn remove_slot(&mut self, seq: u64) -> Option<Slot> {
        let slot = self.slots.remove(&seq)?;
        if slot.persisted {
            let _ = fs::remove_file(self.dir.join(file_name(seq)));
        }
        Some(slot)
    }

    /// The oldest waiting alert that may be dropped for a newcomer of severity `new_sev`:
    /// non-critical first; a critical one only to make room for a critical newcomer.
    fn victim(&self, new_sev: Severity) -> Option<u64> {
        let non_critical = self
            .slots
            .values()
            .find(|s| s.doc.severity != Severity::Critical)
            .map(|s| s.seq);
        match (non_critical, new_sev) {
            (Some(seq), _) => Some(seq),
            (None, Severity::Critical) => self.slots.keys().next().copied(),
            (None, _) => None,
        }
    }

    /// Stores a new alert for `channels`, making room by the drop policy, and writes it durably
    /// before returning. `doc.dropped_alerts_before` is raised by the drops not yet reported.
    pub fn push(&mut self, mut doc: AlertDocument, channels: &[String], now_ms: u64) -> Pushed {
        let mut dropped = Vec::new();
        doc.dropped_alerts_before += self.meta.dropped_unreported;
        let reported = self.meta.dropped_unreported;
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut slot = Slot {
            seq,
            enqueued_ms: now_ms,
            doc: Arc::new(doc),
            channels: channels
                .iter()
                .map(|c| (c.clone(), ChannelState::pending(now_ms)))
                .collect(),
            bytes: 0,
            persisted: false,
        };
        let mut bytes = Self::encode(&slot);
        if bytes.len() as u64 > self.limits.max_bytes {
            // One alert larger than the whole outbox: keep its words, drop its step outputs.
            let mut d = (*slot.doc).clone();
            for e in &mut d.evidence {
                for s in &mut e.steps {
                    s.bytes_dropped += s.output.len() as u64;
                    s.output.clear();
                }
            }
            slot.doc = Arc::new(d);
            bytes = Self::encode(&slot);
        }
        slot.bytes = bytes.len() as u64;

        let mut accept = slot.bytes <= self.limits.max_bytes;
        while accept
            && (self.slots.len() + 1 > self.limits.max_count
                || self.bytes() + slot.bytes > self.limits.max_bytes)
        {
            match self.victim(slot.doc.severity) {
                Some(v) => {
                    if let Some(old) = self.remove_slot(v) {
                        dropped.push(Dropped {
                            id: old.doc.id.clone(),
                            severity: old.doc.severity,
                            headline: old.doc.headline.clone(),
                        });
                    }
                }
                None => accept = false,
            }
        }
        let dropped_now = dropped.len() as u64 + u64::from(!accept);
        if !accept {
            dropped.push(Dropped {
                id: slot.doc.id.clone(),
                severity: slot.doc.severity,
                headline: slot.doc.headline.clone(),
            });
        }
        // The drops this alert reports are reported; the ones it caused wait for the next one.
        // A dropped newcomer reports nothing, so its count stays unreported.
        if accept {
            self.meta.dropped_unreported -= reported;
        }
        self.meta.dropped_unreported += dropped_now;
        self.meta.dropped_total += dropped_now;
        let mut write_error = None;
        if reported > 0 || dropped_now > 0 {
            if let Err(e) = self.write_meta() {
                write_error = Some(format!("{}: {e}", self.dir.join(META).display()));
            }
        }
        if !accept {
            return Pushed {
                seq: None,
                dropped,
                write_error,
            };
        }
        match write_atomic(&self.dir, &file_name(seq), &bytes) {
            Ok(()) => slot.persisted = true,
            Err(e) => {
                write_error = Some(format!("{}: {e}", self.dir.join(file_name(seq)).display()));
            }
        }
        self.slots.insert(seq, slot);
        Pushed {
            seq: Some(seq),
            dropped,
            write_error,
        }
    }

    /// The oldest alert waiting for `channel` whose time has come.
    pub fn due(&self, channel: &str, now_ms: u64) -> Option<u64> {
        self.slots
            .values()
            .find(|s| {
                s.channels.get(channel).is_some_and(|c| {
                    c.state == DeliveryState::Pending && c.next_attempt_ms <= now_ms
                })
            })
            .map(|s| s.seq)
    }

    /// When `channel` next has something to do, if anything waits for it.
    pub fn next_due_ms(&self, channel: &str) -> Option<u64> {
        self.slots
            .values()
            .filter_map(|s| s.channels.get(channel))
            .filter(|c| c.state == DeliveryState::Pending)
            .map(|c| c.next_attempt_ms)
            .min()
    }

    /// Alerts still waiting for `channel`.
    pub fn pending_for(&self, channel: &str) -> usize {
        self.slots
            .values()
            .filter(|s| {
                s.channels
                    .get(channel)
                    .is_some_and(|c| c.state == DeliveryState::Pending)
            })
            .count()
    }

    /// Records an attempt's outcome. Returns the alert when that finished it (its file is gone).
    pub fn record(
        &mut self,
        seq: u64,
        channel: &str,
        outcome: Outcome,
    ) -> (Option<Finished>, Option<String>) {
        let Some(slot) = self.slots.get_mut(&seq) else {
            return (None, None);
        };
        let Some(c) = slot.channels.get_mut(channel) else {
            return (None, None);
        };
        match outcome {
            Outcome::Delivered => {
                c.attempts += 1;
                c.state = DeliveryState::Delivered;
                c.last_error = None;
            }
            Outcome::Retry {
                next_attempt_ms,
                error,
            } => {
                c.attempts += 1;
                c.next_attempt_ms = next_attempt_ms;
                c.last_error = Some(error);
            }
            Outcome::Failed { error } => {
                c.attempts += 1;
                c.state = DeliveryState::Failed;
                c.last_error = Some(error);
            }
        }
        if slot.finished() {
            let slot = self.remove_slot(seq);
            return (
                slot.map(|s| Finished {
                    seq,
                    id: s.doc.id.clone(),
                    channels: s.channels,
                }),
                None,
            );
        }
        let bytes = Self::encode(slot);
        slot.bytes = bytes.len() as u64;
        match write_atomic(&self.dir, &file_name(seq), &bytes) {
            Ok(()) => {
                slot.persisted = true;
                (None, None)
            }
            Err(e) => (
                None,
                Some(format!("{}: {e}", self.dir.join(file_name(seq)).display())),
            ),
        }
    }

    /// Marks every pending delivery to a channel that is no longer configured as failed.
    pub fn retire_channels(&mut self, configured: &[String]) -> Vec<(String, String)> {
        let mut retired = Vec::new();
        let stale: Vec<(u64, String)> = self
            .slots
            .values()
            .flat_map(|s| {
                s.channels
                    .iter()
                    .filter(|(name, c)| {
                        c.state == DeliveryState::Pending && !configured.contains(name)
                    })
                    .map(move |(name, _)| (s.seq, name.clone()))
            })
            .collect();
        for (seq, name) in stale {
            if let Some(s) = self.slots.get(&seq) {
                retired.push((s.doc.id.clone(), name.clone()));
            }
            let _ = self.record(
                seq,
                &name,
                Outcome::Failed {
                    error: "channel no longer configured".to_string(),
                },
            );
        }
        retired
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::document::{Generator, Phase};
    use crate::model::Category;

    pub(crate) fn doc(id: &str, severity: Severity) -> AlertDocument {
        AlertDocument {
            schema: super::super::document::SCHEMA.into(),
            id: id.into(),
            phase: Phase::Opened,
            test: false,
            host: "h".into(),
            boot_id: None,
            severity,
            category: Category::Pcie,
            kind: "xid".into(),
            xid: Some(79),
            title: "t".into(),
            headline: format!("h: {id}"),
            gpu: None,
            meaning: String::new(),
            next_steps: String::new(),
            first_seen: String::new(),
            first_seen_ms: 0,
            last_seen: String::new(),
            last_seen_ms: 0,
            count: 1,
            found_at_startup: false,
            dropped_alerts_before: 0,
            echoes: vec![],
            findings: vec![],
            findings_omitted: 0,
            catalog: None,
            runbook_override: None,
            evidence: vec![],
            report_path: None,
            generator: Generator {
                name: "xidwatch".into(),
                version: "0".into(),
            },
        }
    }

    fn chans() -> Vec<String> {
        vec!["a".to_string(), "b".to_string()]
    }

    fn limits(max_count: usize) -> Limits {
        Limits {
            max_count,
            max_bytes: 1 << 20,
        }
    }

    #[test]
    fn survives_reopen_with_channel_progress() {
        let dir = tempfile::tempdir().unwrap();
        let (mut ob, w) = Outbox::open(dir.path(), limits(10)).unwrap();
        assert!(w.is_empty());
        let p = ob.push(doc("i1", Severity::Critical), &chans(), 1000);
        let seq = p.seq.unwrap();
        assert_eq!(ob.due("a", 1000), Some(seq));
        let (fin, err) = ob.record(seq, "a", Outcome::Delivered);
        assert!(fin.is_none() && err.is_none());
        let (fin, _) = ob.record(
            seq,
            "b",
            Outcome::Retry {
                next_attempt_ms: 5000,
                error: "HTTP 503".into(),
            },
        );
        assert!(fin.is_none());
        drop(ob);

        let (mut ob, w) = Outbox::open(dir.path(), limits(10)).unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(ob.len(), 1);
        assert_eq!(ob.due("a", 10_000), None, "a already delivered");
        assert_eq!(ob.due("b", 4999), None, "b waits for its backoff");
        assert_eq!(ob.due("b", 5000), Some(seq));
        assert_eq!(ob.get(seq).unwrap().channels["b"].attempts, 1);
        let (fin, _) = ob.record(seq, "b", Outcome::Delivered);
        assert_eq!(fin.unwrap().id, "i1");
        assert!(ob.is_empty());
        let files: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n != META)
            .collect();
        assert!(files.is_empty(), "{files:?}");
        // New sequence numbers never reuse a live one.
        let p = ob.push(doc("i2", Severity::Info), &chans(), 1);
        assert!(p.seq.unwrap() >= 1);
    }

    #[test]
    fn drops_oldest_non_critical_first_and_reports_it() {
        let dir = tempfile::tempdir().unwrap();
        let (mut ob, _) = Outbox::open(dir.path(), limits(3)).unwrap();
        ob.push(doc("crit-1", Severity::Critical), &chans(), 1);
        ob.push(doc("warn-1", Severity::Warning), &chans(), 2);
        ob.push(doc("warn-2", Severity::Warning), &chans(), 3);
        let p = ob.push(doc("crit-2", Severity::Critical), &chans(), 4);
        assert_eq!(p.dropped.len(), 1);
        assert_eq!(p.dropped[0].id, "warn-1");
        let ids: Vec<_> = ob.slots().map(|s| s.doc.id.clone()).collect();
        assert_eq!(ids, ["crit-1", "warn-2", "crit-2"]);
        // The next alert says how many were dropped before it; the one after says nothing.
        let p = ob.push(doc("crit-3", Severity::Critical), &chans(), 5);
        assert_eq!(p.dropped[0].id, "warn-2");
        let last = ob.get(p.seq.unwrap()).unwrap();
        assert_eq!(last.doc.dropped_alerts_before, 1);
        // A warning cannot push out criticals: it is dropped itself, and counted.
        let p = ob.push(doc("warn-3", Severity::Warning), &chans(), 6);
        assert_eq!(p.seq, None);
        assert_eq!(p.dropped[0].id, "warn-3");
        // A critical can push out the oldest critical when nothing else is left.
        let p = ob.push(doc("crit-4", Severity::Critical), &chans(), 7);
        assert_eq!(p.dropped[0].id, "crit-1");
        let d = ob.get(p.seq.unwrap()).unwrap().doc.dropped_alerts_before;
        assert_eq!(d, 2, "warn-2 (caused by crit-3) and warn-3");
        assert_eq!(ob.dropped_total(), 4);
        drop(ob);
        let (ob, _) = Outbox::open(dir.path(), limits(3)).unwrap();
        assert_eq!(ob.dropped_total(), 4, "drop counts survive a restart");
        assert_eq!(ob.len(), 3);
    }

    #[test]
    fn bounded_by_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let one = serde_json::to_vec(&doc("x", Severity::Warning))
            .unwrap()
            .len() as u64;
        let (mut ob, _) = Outbox::open(
            dir.path(),
            Limits {
                max_count: 100,
                max_bytes: one * 3,
            },
        )
        .unwrap();
        for i in 0..10 {
            ob.push(doc(&format!("w{i}"), Severity::Warning), &chans(), i);
            assert!(ob.bytes() <= one * 3);
        }
        assert!((1..3).contains(&ob.len()), "{}", ob.len());
    }

    #[test]
    fn corrupt_and_partial_files_do_not_stop_the_outbox() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("0000000000000007.json"), b"{ half").unwrap();
        fs::write(dir.path().join(".0000000000000008.json.tmp"), b"partial").unwrap();
        let (mut ob, w) = Outbox::open(dir.path(), limits(10)).unwrap();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(dir.path().join("0000000000000007.json.corrupt").exists());
        assert!(!dir.path().join(".0000000000000008.json.tmp").exists());
        assert!(ob
            .push(doc("ok", Severity::Info), &chans(), 1)
            .seq
            .is_some());
    }

    #[test]
    fn retired_channels_fail_and_finish_alerts() {
        let dir = tempfile::tempdir().unwrap();
        let (mut ob, _) = Outbox::open(dir.path(), limits(10)).unwrap();
        let seq = ob
            .push(doc("i", Severity::Critical), &chans(), 1)
            .seq
            .unwrap();
        ob.record(seq, "a", Outcome::Delivered);
        let retired = ob.retire_channels(&["a".to_string()]);
        assert_eq!(retired, vec![("i".to_string(), "b".to_string())]);
        assert!(ob.is_empty());
    }
}
