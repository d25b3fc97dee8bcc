//! The sender loop: takes alerts from a bounded channel, writes them to the outbox, and delivers
//! them to every channel that wants them.
//!
//! One intake task persists alerts (and the full report on the host); one worker task per
//! channel delivers, so a receiver that is down delays only itself. Workers honour the
//! per-channel rate limit (alerts over it wait, they are not dropped), retry temporary failures
//! with backoff, and give up on permanent ones loudly. Every wait also watches the shutdown
//! signal, so the dispatcher never holds up shutdown: an interrupted send stays in the outbox
//! and goes out after the restart.

//!
//! Three rooms, lowest first: `shared` (the state every task shares), `worker` (one channel's
//! sender), `intake` (pages into the outbox, workers across reloads); this file is the handle
//! the daemon holds and the start.

mod acks;
mod intake;
mod shared;
mod worker;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::alert::channel::{BuiltChannels, Channel};
use crate::alert::config::AlertConfig;
use crate::alert::document::build::PageBuilder;
use crate::alert::document::HostGroup;
use crate::alert::error::{AlertError, ConfigIssue};
use crate::alert::input::Alert;
use crate::alert::outbox::{Limits, Outbox};
use intake::Intake;
use shared::{Envelope, Shared};

pub use acks::{Acks, ACK_WAIT};
pub use shared::{
    read_status, Ack, AlertStatus, ChannelStatus, OUTBOX_DIR, REPORTS_DIR, STATUS_FILE,
};

/// Why an alert could not be handed over.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("the alert queue is full")]
    Full(Box<Alert>),
    #[error("the alert dispatcher has stopped")]
    Closed(Box<Alert>),
    #[error("the alert dispatcher has stopped")]
    Stopped,
}

/// The daemon's handle: hands alerts to the dispatcher and reads its status. Cheap to clone.
/// It stays valid for the whole run: a reload reconfigures the dispatcher in place.
#[derive(Clone)]
pub struct AlertSender {
    tx: mpsc::Sender<Envelope>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for AlertSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlertSender").finish_non_exhaustive()
    }
}

fn closed(e: mpsc::error::SendError<Envelope>) -> SendError {
    match e.0 {
        Envelope::Alert { alert, .. } | Envelope::Evidence(alert) => {
            SendError::Closed(Box::new(alert))
        }
        _ => SendError::Stopped,
    }
}

impl AlertSender {
    /// Hands an alert over, waiting while the queue is full.
    pub async fn send(&self, alert: Alert) -> Result<(), SendError> {
        self.tx
            .send(Envelope::Alert {
                alert,
                hold: None,
                note: None,
                host: None,
                ack: None,
            })
            .await
            .map_err(closed)
    }

    /// Hands an alert over, waiting while the queue is full (back-pressure), and returns what
    /// resolves once the alert is durable. With `hold`, the alert is written at once but not
    /// sent until [`AlertSender::attach_evidence`] brings its evidence or the hold ends.
    pub async fn submit(
        &self,
        alert: Alert,
        hold: Option<Duration>,
        note: Option<String>,
    ) -> Result<oneshot::Receiver<Ack>, SendError> {
        self.submit_host(alert, hold, note, None).await
    }

    /// [`AlertSender::submit`] for an opening page that may stand for several GPUs: with
    /// `host`, the page becomes the host page ([`HostGroup`]) and keeps being one when its
    /// evidence comes. The other GPUs of the group are not handed over.
    pub async fn submit_host(
        &self,
        alert: Alert,
        hold: Option<Duration>,
        note: Option<String>,
        host: Option<HostGroup>,
    ) -> Result<oneshot::Receiver<Ack>, SendError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Envelope::Alert {
                alert,
                hold,
                note,
                host: host.map(Box::new),
                ack: Some(tx),
            })
            .await
            .map_err(closed)?;
        Ok(rx)
    }

    /// The evidence of an alert submitted with a hold (same incident id and phase).
    pub async fn attach_evidence(&self, alert: Alert) -> Result<(), SendError> {
        self.tx
            .send(Envelope::Evidence(alert))
            .await
            .map_err(closed)
    }

    /// Ends the hold of an alert whose runbook will not report, with a note saying why.
    pub async fn release(&self, id: String, note: String) -> Result<(), SendError> {
        self.tx
            .send(Envelope::Release { id, note })
            .await
            .map_err(closed)
    }

    /// Applies a new `[alerts]` config in place: channels whose own settings did not change
    /// keep their worker (and what it is sending); changed ones are rebuilt; removed ones stop.
    /// On error nothing changes. Returns warnings for the log.
    pub async fn reconfigure(
        &self,
        cfg: &AlertConfig,
        built: &BuiltChannels,
    ) -> Result<Vec<String>, AlertError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Envelope::Reconfigure {
                cfg: Box::new(cfg.clone()),
                built: built.clone(),
                reply,
            })
            .await
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Hands an alert over without waiting.
    pub fn try_send(&self, alert: Alert) -> Result<(), SendError> {
        self.tx
            .try_send(Envelope::Alert {
                alert,
                hold: None,
                note: None,
                host: None,
                ack: None,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(Envelope::Alert { alert, .. }) => {
                    SendError::Full(Box::new(alert))
                }
                mpsc::error::TrySendError::Closed(env) => closed(mpsc::error::SendError(env)),
                mpsc::error::TrySendError::Full(_) => SendError::Stopped,
            })
    }

    /// A snapshot of every channel and of the outbox.
    pub fn status(&self) -> AlertStatus {
        self.shared.status()
    }
}

/// A reload that found the dispatcher gone, worded as it always was.
fn stopped() -> AlertError {
    AlertError::Config(vec![ConfigIssue::new(
        "",
        "the alert dispatcher has stopped",
    )])
}

/// Starts and owns the alert tasks.
pub struct Dispatcher;

impl Dispatcher {
    /// Validates the config, builds every channel (resolving secrets), opens the outbox under
    /// `state_dir` and starts the tasks on the current tokio runtime. Alerts left in the outbox
    /// by an earlier run are delivered first. The tasks end when `shutdown` becomes `true` (or
    /// its sender is dropped); the returned handle completes then.
    pub fn start(
        cfg: &AlertConfig,
        state_dir: &Path,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(AlertSender, JoinHandle<()>), AlertError> {
        for w in cfg.secret_warnings(None) {
            tracing::warn!("{w}");
        }
        let built = BuiltChannels::build(cfg)?;
        Self::start_built(cfg, &built, state_dir, shutdown)
    }

    /// [`Dispatcher::start`] with the channels the config was loaded with (the daemon's way:
    /// the config is checked and its channels built once, when it is loaded).
    pub fn start_built(
        cfg: &AlertConfig,
        built: &BuiltChannels,
        state_dir: &Path,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(AlertSender, JoinHandle<()>), AlertError> {
        let channels: Vec<Arc<Channel>> = built.0.iter().cloned().collect();

        let dir = state_dir.join(OUTBOX_DIR);
        let (mut ob, warnings) = Outbox::open(
            &dir,
            Limits {
                max_count: cfg.outbox.max_count,
                max_bytes: cfg.outbox.max_bytes,
            },
        )
        .map_err(|e| AlertError::Outbox {
            path: dir.display().to_string(),
            message: e.to_string(),
        })?;
        for w in warnings {
            tracing::error!("alert outbox: {w}");
        }
        let names: Vec<String> = channels.iter().map(|c| c.name().to_string()).collect();
        for (id, ch) in ob.retire_channels(&names) {
            tracing::error!(incident = %id, channel = %ch, "alert left in the outbox for a channel that is no longer configured; not sent there");
        }
        if !ob.is_empty() {
            tracing::info!(
                count = ob.len(),
                "alerts left in the outbox by an earlier run will be sent"
            );
        }
        let shared = Arc::new(Shared {
            status_written: Mutex::new(None),
            status_stale: Default::default(),
            outbox: Mutex::new(ob),
            stats: Mutex::new(BTreeMap::new()),
            accepted_total: Mutex::new(0),
            status_path: Mutex::new(state_dir.join(STATUS_FILE)),
        });
        let (tx, rx) = mpsc::channel(cfg.queue_capacity.max(1));
        let (retry_tx, _) = watch::channel(cfg.retry.clone());
        let mut intake = Intake {
            rx,
            shared: shared.clone(),
            commons: cfg.channels(),
            pages: PageBuilder::new(cfg.handoff.clone()),
            workers: BTreeMap::new(),
            retry: retry_tx,
            reports_dir: state_dir.join(REPORTS_DIR),
            keep_reports: cfg.outbox.keep_reports,
            shutdown,
            unpersisted: Vec::new(),
            host_pages: Default::default(),
        };
        for ch in channels {
            intake.spawn_worker(cfg, ch);
        }
        shared.write_status();
        let handle = tokio::spawn(intake.run());
        Ok((AlertSender { tx, shared }, handle))
    }
}

#[cfg(test)]
mod tests;
