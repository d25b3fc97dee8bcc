//! Per-page annotations: what every page gets beside its runbook's evidence: how often this
//! happened on the board before (the history, recorded here when an incident opens), the
//! repeat-offender escalation, and the inventory diff for that GPU ([`Pages`]); and the order
//! the evidence is read in ([`merge`]).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::health::config::HistoryConfig;
use crate::history::History;
use crate::inventory::Change;
use crate::model::{Evidence, Incident, StepResult, StepStatus};

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The history and the inventory diff, shared by the pipeline (which records) and nobody else;
/// behind a lock only so the history file is written off the runtime thread.
#[derive(Clone)]
pub struct Pages {
    inner: Arc<Mutex<PagesInner>>,
    /// Serialises history writes and drops a stale one (generation order).
    writer: Arc<Mutex<u64>>,
}

struct PagesInner {
    state_dir: PathBuf,
    cfg: HistoryConfig,
    history: History,
    generation: u64,
    diff: Vec<Change>,
}

impl Pages {
    /// Loads the history from the state directory (an unreadable one starts empty, and says so).
    pub fn open(state_dir: PathBuf, cfg: HistoryConfig) -> Pages {
        let history = match crate::history::load_owned(&state_dir) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!("{e:#}; the GPU history starts empty");
                History::default()
            }
        };
        Pages {
            inner: Arc::new(Mutex::new(PagesInner {
                state_dir,
                cfg,
                history,
                generation: 0,
                diff: Vec::new(),
            })),
            writer: Arc::new(Mutex::new(0)),
        }
    }

    /// The changes since the previous boot, attached to incidents on the GPUs they name.
    pub fn set_diff(&self, diff: Vec<Change>) {
        self.lock().diff = diff;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PagesInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an incident that opens and returns what its page carries beside the runbook's
    /// evidence: the history (how often before; the escalation for a repeat offender) and the
    /// inventory diff for its GPU.
    pub fn annotate(&self, inc: &Incident) -> Vec<Evidence> {
        let now = now_ms();
        let mut out = Vec::new();
        let snapshot = {
            let mut g = self.lock();
            let cfg = g.cfg.clone();
            let summary = g.history.record(inc, &cfg, now);
            if let Some(s) = &summary {
                tracing::info!("incident {}: {}", inc.id, s.line());
                out.push(crate::history::evidence(s, &inc.host, now));
            }
            if inc.phase == crate::model::IncidentPhase::Opened && !inc.test {
                let changes: Vec<&Change> = g
                    .diff
                    .iter()
                    .filter(|c| c.pci.is_some() && c.pci == inc.pci)
                    .collect();
                if !changes.is_empty() {
                    out.push(diff_evidence(&changes, &inc.host, now));
                }
            }
            summary.map(|_| {
                g.generation += 1;
                g.generation
            })
        };
        if let Some(generation) = snapshot {
            let (writer, inner) = (self.writer.clone(), self.inner.clone());
            // A slow disk must not hold the pipeline: serialised and written on a blocking
            // thread, in generation order (a write overtaken by a newer one is skipped).
            tokio::task::spawn_blocking(move || {
                let mut last = writer.lock().unwrap_or_else(|p| p.into_inner());
                if *last >= generation {
                    return;
                }
                let (bytes, dir, now_gen) = {
                    let g = inner.lock().unwrap_or_else(|p| p.into_inner());
                    (
                        serde_json::to_vec(&g.history),
                        g.state_dir.clone(),
                        g.generation,
                    )
                };
                *last = now_gen;
                let written = bytes
                    .map_err(anyhow::Error::from)
                    .and_then(|b| crate::history::save_bytes(&dir, &b));
                if let Err(e) = written {
                    crate::state::log_write_error("history", &format!("{e:#}"));
                }
            });
        }
        out
    }
}

/// The page's evidence in reading order: a repeat offender's escalation first (its next steps are
/// the page's), then the runbook's, then the history and the inventory diff.
pub fn merge(pages: Vec<Evidence>, runbook: impl IntoIterator<Item = Evidence>) -> Vec<Evidence> {
    let (first, rest): (Vec<Evidence>, Vec<Evidence>) = pages
        .into_iter()
        .partition(|e| !e.next_steps.trim().is_empty());
    first.into_iter().chain(runbook).chain(rest).collect()
}

fn diff_evidence(changes: &[&Change], host: &str, now: u64) -> Evidence {
    let lines: Vec<String> = changes.iter().map(|c| c.describe()).collect();
    Evidence {
        runbook: "inventory-diff".into(),
        meaning: String::new(),
        next_steps: String::new(),
        steps: vec![StepResult {
            name: "changed since last boot".into(),
            kind: "inventory".into(),
            target: Vec::new(),
            status: StepStatus::Done { exit_code: None },
            output: lines.join("\n") + "\n",
            bytes_dropped: 0,
            duration_ms: 0,
            notes: lines
                .iter()
                .map(|l| format!("changed since last boot: {l}"))
                .collect(),
        }],
        started_ms: now,
        duration_ms: 0,
        host: host.to_string(),
    }
}
