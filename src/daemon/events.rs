//! The daemon's sources merged into one event type: the kernel log reader, the NVML side, the
//! service watch, the Fabric Manager log, the timers, the config watch and SIGHUP, and the stop.
//! [`Sources::next`] waits for whichever comes first; the daemon handles each the same way
//! (one handler, then one flush).

use std::time::Duration;

use tokio::sync::mpsc;

use super::signals::{Hangup, Shutdown};
use crate::source::fabricmanager::FmLogEvent;
use crate::source::kmsg::follow::KmsgEvent;
use crate::source::nvml::link::{NvmlLink, NvmlMsg};
use crate::source::services::ServiceEvent;

/// Kernel log events handled in one batch at most: a storm is handled in batches, and the
/// loop still goes round. The reader sends batches of up to `follow::BATCH`; queued ones are
/// joined up to this.
const KMSG_BATCH: usize = 512;

/// Everything that reaches the daemon's loop.
#[derive(Debug)]
pub(super) enum Event {
    /// A batch from the kernel log reader.
    Kmsg(Vec<KmsgEvent>),
    /// From the NVML worker, the lost-GPU probe or the health loop.
    Nvml(NvmlMsg),
    /// Boxed: a finding is large, and most events are not.
    Service(Box<ServiceEvent>),
    FabricLog(FmLogEvent),
    /// A multi-line kernel message got no next line in time.
    FoldQuiet,
    /// The incident engine's next deadline (settle, quiet, remind) has come.
    Deadline,
    /// The status file and heartbeat are due.
    StatusTick,
    /// systemd's watchdog is due.
    Watchdog,
    /// The checkpoint is due.
    SaveDue,
    /// SIGHUP: reload whatever is on disk.
    Hangup,
    /// The config file or a runbook file changed on disk.
    ConfigChanged,
    /// SIGTERM or SIGINT, or the kernel log reader has ended.
    Shutdown,
}

/// What the loop waits for besides the sources, from the pipeline's state.
#[derive(Debug, Clone, Copy)]
pub(super) struct Waits {
    /// Until the engine's next deadline.
    pub deadline: Duration,
    /// When the checkpoint is due, if it is.
    pub save_at: Option<tokio::time::Instant>,
    /// Until a pending multi-line message is reported as it is, if one is pending.
    pub fold: Option<Duration>,
}

/// The receiving ends of every source, and the timers.
pub(super) struct Sources {
    /// Batches from the kernel log reader (`follow::BATCH` events at most each).
    pub kmsg: mpsc::Receiver<Vec<KmsgEvent>>,
    pub nvml: NvmlLink,
    pub services: mpsc::Receiver<ServiceEvent>,
    pub fabric: mpsc::Receiver<FmLogEvent>,
    pub watchdog: tokio::time::Interval,
    pub status: tokio::time::Interval,
    pub reloads: mpsc::Receiver<()>,
    pub hangup: Hangup,
    /// Senders of sources that do not run, kept so their receivers wait instead of ending.
    pub _idle: (
        Option<mpsc::Sender<ServiceEvent>>,
        Option<mpsc::Sender<FmLogEvent>>,
    ),
}

impl Sources {
    /// The next event: whichever source, timer or request comes first.
    pub(super) async fn next(&mut self, w: Waits, shutdown: &mut Shutdown) -> Event {
        let save_at = w.save_at.unwrap_or_else(tokio::time::Instant::now);
        tokio::select! {
            ev = self.kmsg.recv() => match ev {
                Some(ev) => Event::Kmsg(self.drain_kmsg(ev)),
                None => Event::Shutdown,
            },
            msg = self.nvml.next() => Event::Nvml(msg),
            Some(ev) = self.services.recv() => Event::Service(Box::new(ev)),
            Some(ev) = self.fabric.recv() => Event::FabricLog(ev),
            _ = tokio::time::sleep(w.fold.unwrap_or_default()), if w.fold.is_some() => Event::FoldQuiet,
            _ = tokio::time::sleep(w.deadline) => Event::Deadline,
            _ = self.status.tick() => Event::StatusTick,
            _ = self.watchdog.tick() => Event::Watchdog,
            _ = self.hangup.recv() => Event::Hangup,
            Some(()) = self.reloads.recv() => {
                // Editors write a file in several steps: let them finish.
                tokio::time::sleep(Duration::from_millis(300)).await;
                while self.reloads.try_recv().is_ok() {}
                Event::ConfigChanged
            }
            _ = tokio::time::sleep_until(save_at), if w.save_at.is_some() => Event::SaveDue,
            _ = shutdown.requested() => Event::Shutdown,
        }
    }

    /// Joins the batches already queued behind `batch` while fewer than [`KMSG_BATCH`] events
    /// are gathered; a batch is never split, so events keep their order.
    fn drain_kmsg(&mut self, mut batch: Vec<KmsgEvent>) -> Vec<KmsgEvent> {
        while batch.len() < KMSG_BATCH {
            match self.kmsg.try_recv() {
                Ok(mut more) => {
                    batch.append(&mut more);
                }
                Err(_) => break,
            }
        }
        batch
    }
}
