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
//! counted in `meta.json` and the next alert carries the count in `dropped_alerts_before`. A
//! count stays owed until an alert that carries it is delivered somewhere: when the carrier is
//! dropped in turn, or every channel refuses it, its count goes back to the next alert.
//!
//! A new incident's alert is written here at once, before its runbook has run, so the kernel
//! log position can move past it; it is *held* (not sent) until the runbook's evidence is
//! attached or the hold expires. A hold does not survive a restart: the alert then goes out
//! without the evidence, with a note saying why.
//!
//! Synchronous on purpose: the dispatcher calls it from `spawn_blocking`.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::alert::document::{AlertDocument, EVIDENCE_LOST_NOTE};
use crate::model::Severity;
use files::{create_private_dir, file_name, read_entry, write_atomic, write_batch};

mod files;

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
    awaiting_evidence: bool,
    channels: &'a BTreeMap<String, ChannelState>,
    document: &'a AlertDocument,
}

#[derive(Deserialize)]
struct EntryOwned {
    format: u32,
    seq: u64,
    enqueued_ms: u64,
    #[serde(default)]
    awaiting_evidence: bool,
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
    /// Not sent before this instant (monotonic ms) unless its runbook's evidence comes first.
    /// In memory only: after a restart nothing waits for evidence any more.
    pub held_until_mono: Option<u64>,
}

impl Slot {
    fn held(&self, now_mono: u64) -> bool {
        self.held_until_mono.is_some_and(|t| t > now_mono)
    }

    fn finished(&self) -> bool {
        self.channels
            .values()
            .all(|c| c.state != DeliveryState::Pending)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Meta {
    /// Dropped, and not carried by any alert still waiting or delivered.
    dropped_unreported: u64,
    /// Dropped since the outbox was created.
    dropped_total: u64,
    /// Ids of the newest opened-incident alerts accepted, oldest first: after a crash the
    /// daemon reads again the records after its last checkpoint and opens the same incidents
    /// (same ids); an alert already accepted is not queued a second time.
    #[serde(default)]
    accepted: std::collections::VecDeque<String>,
}

/// Opened-incident ids remembered against duplicates after a crash.
const MAX_REMEMBERED: usize = 4096;

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
    /// The new alert's sequence number, or `None` when the new alert itself was dropped (or
    /// was already accepted before).
    pub seq: Option<u64>,
    /// The same incident's opening alert was accepted before (a record read again after a
    /// crash): not queued again.
    pub duplicate: bool,
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
    /// While [`Outbox::push_many`] runs: the files it will write together.
    batch: Option<Vec<(u64, Vec<u8>)>>,
    /// `meta` changed since it was last written.
    meta_dirty: bool,
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
                match read_entry(&path).map(|b| b.map(|b| serde_json::from_slice::<Meta>(&b))) {
                    Ok(Some(Ok(m))) => meta = m,
                    // Set aside (and said): the counts start again.
                    Ok(None) => {}
                    _ => {
                        warnings.push(format!("{}: unreadable, drop counts reset", path.display()))
                    }
                }
                continue;
            }
            if !name.ends_with(".json") {
                continue;
            }
            let bytes = match read_entry(&path) {
                Ok(Some(b)) => b,
                // Not an outbox file at all: set aside, and said.
                Ok(None) => continue,
                Err(e) => {
                    warnings.push(format!("{}: cannot read: {e}", path.display()));
                    continue;
                }
            };
            match serde_json::from_slice::<EntryOwned>(&bytes) {
                Ok(e) if e.format == FORMAT && file_name(e.seq) == name => {
                    let mut doc = e.document;
                    if e.awaiting_evidence {
                        // Its runbook was running when the previous run ended: send what we have.
                        doc.evidence_note = Some(EVIDENCE_LOST_NOTE.to_string());
                    }
                    slots.insert(
                        e.seq,
                        Slot {
                            seq: e.seq,
                            enqueued_ms: e.enqueued_ms,
                            doc: Arc::new(doc),
                            channels: e.channels,
                            bytes: bytes.len() as u64,
                            persisted: true,
                            held_until_mono: None,
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
                batch: None,
                meta_dirty: false,
            },
            warnings,
        ))
    }

    /// New bounds from a reloaded config; they apply from the next alert on.
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
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
            awaiting_evidence: slot.held_until_mono.is_some(),
            channels: &slot.channels,
            document: &slot.doc,
        })
        .unwrap_or_default()
    }

    fn write_meta(&mut self) -> io::Result<()> {
        let bytes = serde_json::to_vec(&self.meta).unwrap_or_default();
        write_atomic(&self.dir, META, &bytes)?;
        self.meta_dirty = false;
        Ok(())
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
    pub fn push(&mut self, doc: AlertDocument, channels: &[String], now_ms: u64) -> Pushed {
        self.push_held(doc, channels, now_ms, None)
    }

    /// [`Outbox::push`], holding the alert until `held_until_mono` (monotonic ms) or until
    /// [`Outbox::attach`] brings its evidence, whichever comes first.
    pub fn push_held(
        &mut self,
        mut doc: AlertDocument,
        channels: &[String],
        now_ms: u64,
        held_until_mono: Option<u64>,
    ) -> Pushed {
        if doc.phase == crate::alert::document::Phase::Opened && !doc.test {
            if self.meta.accepted.contains(&doc.id) {
                return Pushed {
                    seq: None,
                    duplicate: true,
                    dropped: Vec::new(),
                    write_error: None,
                };
            }
            if self.meta.accepted.len() >= MAX_REMEMBERED {
                self.meta.accepted.pop_front();
            }
            self.meta.accepted.push_back(doc.id.clone());
            self.meta_dirty = true;
        }
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
            held_until_mono,
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
                        // The drops it was carrying are owed again.
                        self.meta.dropped_unreported += old.doc.dropped_alerts_before;
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
            self.meta_dirty = true;
        }
        if self.meta_dirty && self.batch.is_none() {
            if let Err(e) = self.write_meta() {
                write_error = Some(format!("{}: {e}", self.dir.join(META).display()));
            }
        }
        if !accept {
            return Pushed {
                seq: None,
                duplicate: false,
                dropped,
                write_error,
            };
        }
        if self.batch.is_some() {
            // Written by `write_batch`, with the others of its batch.
            if let Some(b) = self.batch.as_mut() {
                b.push((seq, bytes));
            }
        } else {
            match write_atomic(&self.dir, &file_name(seq), &bytes) {
                Ok(()) => slot.persisted = true,
                Err(e) => {
                    write_error = Some(format!("{}: {e}", self.dir.join(file_name(seq)).display()));
                }
            }
        }
        self.slots.insert(seq, slot);
        Pushed {
            seq: Some(seq),
            duplicate: false,
            dropped,
            write_error,
        }
    }

    /// Stores several alerts with one flush to disk for all of them, instead of one each: a
    /// burst of new incidents costs a few milliseconds, not a few per alert. Same semantics as
    /// [`Outbox::push_held`] for each; every alert is durable when this returns, or its entry
    /// says why not.
    pub fn push_many(
        &mut self,
        alerts: Vec<(AlertDocument, Vec<String>, u64, Option<u64>)>,
    ) -> Vec<Pushed> {
        self.batch = Some(Vec::new());
        let mut out: Vec<Pushed> = alerts
            .into_iter()
            .map(|(doc, channels, now_ms, hold)| self.push_held(doc, &channels, now_ms, hold))
            .collect();
        let mut batch = self.batch.take().unwrap_or_default();
        // Not what a later alert of the same batch pushed out again.
        batch.retain(|(seq, _)| self.slots.contains_key(seq));
        let mut files: Vec<(String, Vec<u8>)> = batch
            .iter()
            .map(|(seq, bytes)| (file_name(*seq), bytes.clone()))
            .collect();
        if self.meta_dirty {
            // With the alerts it accounts for, in the same flush.
            files.push((
                META.to_string(),
                serde_json::to_vec(&self.meta).unwrap_or_default(),
            ));
        }
        let result = write_batch(&self.dir, &files);
        if result.is_ok() {
            self.meta_dirty = false;
        }
        for (seq, _) in &batch {
            // A slot may already be gone again (dropped by a later push of the same batch).
            if let Some(slot) = self.slots.get_mut(seq) {
                slot.persisted = result.is_ok();
            }
        }
        if let Err(e) = result {
            for p in &mut out {
                if p.seq.is_some_and(|s| batch.iter().any(|(b, _)| *b == s)) {
                    p.write_error = Some(format!("{}: {e}", self.dir.display()));
                }
            }
        }
        out
    }

    /// The oldest alert waiting for `channel` whose time has come.
    pub fn due(&self, channel: &str, now_ms: u64) -> Option<u64> {
        self.due_except(channel, now_ms, 0, &Default::default())
    }

    /// The oldest alert waiting for `channel` whose time has come, that is not held for its
    /// evidence and not among `busy` (already being sent).
    pub fn due_except(
        &self,
        channel: &str,
        now_ms: u64,
        now_mono: u64,
        busy: &std::collections::HashSet<u64>,
    ) -> Option<u64> {
        self.slots
            .values()
            .find(|s| {
                !busy.contains(&s.seq)
                    && !s.held(now_mono)
                    && s.channels.get(channel).is_some_and(|c| {
                        c.state == DeliveryState::Pending && c.next_attempt_ms <= now_ms
                    })
            })
            .map(|s| s.seq)
    }

    /// How long until `channel` next has something to do (ignoring `busy` alerts), if anything
    /// waits for it. Retry times are wall-clock (they are written to disk); holds monotonic.
    pub fn next_wait(
        &self,
        channel: &str,
        now_ms: u64,
        now_mono: u64,
        busy: &std::collections::HashSet<u64>,
    ) -> Option<std::time::Duration> {
        self.slots
            .values()
            .filter(|s| !busy.contains(&s.seq))
            .filter_map(|s| {
                let c = s.channels.get(channel)?;
                (c.state == DeliveryState::Pending).then(|| {
                    let retry = c.next_attempt_ms.saturating_sub(now_ms);
                    let hold = s.held_until_mono.map_or(0, |t| t.saturating_sub(now_mono));
                    retry.max(hold)
                })
            })
            .min()
            .map(std::time::Duration::from_millis)
    }

    /// Attaches a held alert's evidence: `doc` replaces its document (keeping what the outbox
    /// itself filled in) and the hold ends. `None` when no waiting alert has that id and phase
    /// (it was wanted by no channel, dropped, or already sent without the evidence).
    pub fn attach(&mut self, mut doc: AlertDocument) -> Option<(u64, Option<String>)> {
        let slot = self.slots.values_mut().find(|s| {
            s.held_until_mono.is_some() && s.doc.id == doc.id && s.doc.phase == doc.phase
        })?;
        doc.dropped_alerts_before = slot.doc.dropped_alerts_before;
        // The report written with the evidence names the file; an older path is kept only when
        // this one could not be written (the opening page must never lose where its report is).
        if doc.report_path.is_none() {
            doc.report_path.clone_from(&slot.doc.report_path);
        }
        slot.doc = Arc::new(doc);
        slot.held_until_mono = None;
        let seq = slot.seq;
        let bytes = Self::encode(slot);
        slot.bytes = bytes.len() as u64;
        let err = match write_atomic(&self.dir, &file_name(seq), &bytes) {
            Ok(()) => {
                slot.persisted = true;
                None
            }
            Err(e) => Some(format!("{}: {e}", self.dir.join(file_name(seq)).display())),
        };
        Some((seq, err))
    }

    /// Ends the hold of the alert with this id and phase, for a runbook that will not report.
    pub fn release(&mut self, id: &str, note: &str) -> bool {
        let Some(slot) = self
            .slots
            .values_mut()
            .find(|s| s.held_until_mono.is_some() && s.doc.id == id)
        else {
            return false;
        };
        let mut d = (*slot.doc).clone();
        d.evidence_note = Some(note.to_string());
        slot.doc = Arc::new(d);
        slot.held_until_mono = None;
        true
    }

    /// Writes again an alert whose file could not be written before (disk full).
    pub fn persist(&mut self, seq: u64) -> Result<bool, String> {
        let Some(slot) = self.slots.get_mut(&seq) else {
            // Already finished (delivered from memory) or dropped: nothing left to lose.
            return Ok(true);
        };
        if slot.persisted {
            return Ok(true);
        }
        let bytes = Self::encode(slot);
        match write_atomic(&self.dir, &file_name(seq), &bytes) {
            Ok(()) => {
                slot.persisted = true;
                slot.bytes = bytes.len() as u64;
                Ok(true)
            }
            Err(e) => Err(format!("{}: {e}", self.dir.join(file_name(seq)).display())),
        }
    }

    /// The drops not yet carried by any alert.
    pub fn dropped_unreported(&self) -> u64 {
        self.meta.dropped_unreported
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
            if let Some(s) = &slot {
                let delivered = s
                    .channels
                    .values()
                    .any(|c| c.state == DeliveryState::Delivered);
                if !delivered && s.doc.dropped_alerts_before > 0 {
                    // Nobody heard it: the count it carried is owed to the next alert.
                    self.meta.dropped_unreported += s.doc.dropped_alerts_before;
                    let _ = self.write_meta();
                }
            }
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
            schema: crate::alert::document::SCHEMA.into(),
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
            evidence_note: None,
            report_path: None,
            handoff: None,
            host_group: None,
            host_page: None,
            paged_as: Vec::new(),
            gpu_state: None,
            supersedes: Vec::new(),
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

    /// Every drop reaches a receiver: a count carried by an alert that is itself dropped, or
    /// that no channel accepts, is carried again by the next one.
    #[test]
    fn drop_counts_survive_their_carriers() {
        let dir = tempfile::tempdir().unwrap();
        let (mut ob, _) = Outbox::open(dir.path(), limits(3)).unwrap();
        let mut told = 0;
        for i in 0..200u64 {
            ob.push(doc(&format!("w{i}"), Severity::Warning), &chans(), i);
            // Now and then one alert gets through on one channel and is refused on the other;
            // one in five is refused everywhere.
            if i % 7 == 0 {
                let first = ob.slots().next().map(|s| s.seq).unwrap();
                let carried = ob.get(first).unwrap().doc.dropped_alerts_before;
                let everywhere = i % 5 == 0;
                let a = if everywhere {
                    Outcome::Failed { error: "no".into() }
                } else {
                    Outcome::Delivered
                };
                ob.record(first, "a", a);
                ob.record(first, "b", Outcome::Failed { error: "no".into() });
                if !everywhere {
                    told += carried;
                }
            }
        }
        // Deliver what is left.
        let rest: Vec<u64> = ob.slots().map(|s| s.seq).collect();
        for seq in rest {
            told += ob.get(seq).unwrap().doc.dropped_alerts_before;
            ob.record(seq, "a", Outcome::Delivered);
            ob.record(seq, "b", Outcome::Delivered);
        }
        assert!(ob.dropped_total() > 100);
        assert_eq!(
            told + ob.dropped_unreported(),
            ob.dropped_total(),
            "every drop is told once, or still owed"
        );
    }

    /// A held alert is written at once but not due until its evidence comes or the hold ends;
    /// after a restart it is due at once, with a note.
    #[test]
    fn held_alerts_wait_for_evidence_but_never_past_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (mut ob, _) = Outbox::open(dir.path(), limits(10)).unwrap();
        let none = std::collections::HashSet::new();
        let seq = ob
            .push_held(doc("i", Severity::Critical), &chans(), 1000, Some(50_000))
            .seq
            .unwrap();
        assert!(
            dir.path().join(file_name(seq)).exists(),
            "durable before the evidence"
        );
        assert_eq!(ob.due_except("a", 2000, 10_000, &none), None, "held");
        assert_eq!(
            ob.next_wait("a", 2000, 10_000, &none),
            Some(std::time::Duration::from_millis(40_000))
        );
        assert_eq!(
            ob.due_except("a", 2000, 50_000, &none),
            Some(seq),
            "hold ended"
        );
        let mut with = doc("i", Severity::Critical);
        with.meaning = "with evidence".into();
        assert_eq!(ob.attach(with).map(|r| r.0), Some(seq));
        assert_eq!(ob.due_except("a", 2000, 10_000, &none), Some(seq));
        assert_eq!(ob.get(seq).unwrap().doc.meaning, "with evidence");
        let busy: std::collections::HashSet<u64> = [seq].into();
        assert_eq!(ob.due_except("a", 2000, 10_000, &busy), None, "being sent");

        // Held when the process died: after the restart it is due, and says why it is bare.
        let seq2 = ob
            .push_held(doc("j", Severity::Critical), &chans(), 1000, Some(u64::MAX))
            .seq
            .unwrap();
        drop(ob);
        let (ob, _) = Outbox::open(dir.path(), limits(10)).unwrap();
        assert_eq!(ob.due_except("a", 2000, 0, &busy), Some(seq2));
        assert!(ob.get(seq2).unwrap().doc.evidence_note.is_some());
        assert!(ob.get(seq).unwrap().doc.evidence_note.is_none());
    }

    /// After a crash the daemon reads the records after its checkpoint again and opens the same
    /// incidents: an opening alert already accepted (waiting or delivered) is not queued twice,
    /// across a restart too; digests are not affected.
    #[test]
    fn an_opening_alert_is_accepted_once() {
        let dir = tempfile::tempdir().unwrap();
        let (mut ob, _) = Outbox::open(dir.path(), limits(10)).unwrap();
        let first = ob.push(doc("i", Severity::Critical), &chans(), 1);
        assert!(first.seq.is_some() && !first.duplicate);
        let again = ob.push(doc("i", Severity::Critical), &chans(), 2);
        assert!(again.seq.is_none() && again.duplicate);
        let seq = first.seq.unwrap();
        ob.record(seq, "a", Outcome::Delivered);
        ob.record(seq, "b", Outcome::Delivered);
        assert!(ob.is_empty());
        let mut digest = doc("i", Severity::Critical);
        digest.phase = crate::alert::document::Phase::Digest;
        assert!(ob.push(digest, &chans(), 3).seq.is_some());
        drop(ob);
        let (mut ob, _) = Outbox::open(dir.path(), limits(10)).unwrap();
        let batch = ob.push_many(vec![
            (doc("i", Severity::Critical), chans(), 4, None),
            (doc("j", Severity::Critical), chans(), 4, None),
        ]);
        assert!(batch[0].duplicate, "remembered across a restart");
        assert!(batch[1].seq.is_some());
        drop(ob);
        let (mut ob, _) = Outbox::open(dir.path(), limits(10)).unwrap();
        assert!(
            ob.push(doc("j", Severity::Critical), &chans(), 5).duplicate,
            "written with its batch"
        );
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
