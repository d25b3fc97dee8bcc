//! The daemon (`xidwatch run`): wires sources -> classifier -> incidents -> outputs, keeps the
//! kernel log position, and speaks systemd's notification protocol.
//!
//! Build, then run: [`build`] constructs each part once from its own config section (the kernel
//! log reader, the NVML side, the pipeline, the alert stage, the operations side); [`run`]
//! merges the sources into one [`Event`](events::Event) type and, per event, calls one handler
//! and one after-step (the flush). The stop is one [`Shutdown`] token, from [`signals::install`].
//!
//! Threads: one follows `/dev/kmsg`, one owns NVML and makes every NVML call (both block; see
//! [`nvml`]); everything else runs on a single-threaded tokio runtime, so the classifier and the
//! incident engine need no locks. Channels between them are bounded: when the pipeline falls
//! behind, the kmsg thread waits, the kernel ring buffer overwrites, and the loss is reported as an
//! overrun rather than hidden in an ever-growing queue.
//!
//! Rooms: [`pipeline`] (classify, correlate, checkpoint: plain values in), [`handover`] (where
//! incidents leave: runbooks, alert stage, `--json`), [`reload`], [`events`] (the merge), [`nvml`]
//! (the NVML actor), [`ops`] (starts the metrics endpoint and the status socket of
//! [`crate::status`]), [`signals`].

mod alert_stage;
pub(crate) mod checkpoint;
mod events;
mod fabricmanager;
mod handover;
pub(crate) mod notify;
mod ops;
mod options;
mod pipeline;
mod reload;
mod services;
pub mod signals;
#[cfg(test)]
mod tests;

/// The status side moved to its own room ([`crate::status`]); these paths still name it.
pub use crate::status::{control, metrics, telemetry};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::mpsc;

use crate::source::kmsg::follow;
use crate::state::{self, StateDir};
use alert_stage::AlertStage;
use events::{Event, Sources};
pub use handover::{catalog_text, runbook_env};
pub use options::{Output, RunOptions, SourceStats};
use pipeline::Pipeline;
pub use signals::{Hangup, Shutdown, StopHandle};
use telemetry::Telemetry;

/// The daemon, built and not yet running: every part constructed once, from its config section.
pub struct Daemon {
    output: Output,
    tel: Arc<Telemetry>,
    notifier: notify::Notifier,
    pipeline: Pipeline,
    sources: Sources,
    /// The kernel log reader thread, and what tells it to stop.
    kmsg_thread: std::thread::JoinHandle<()>,
    kmsg_stop: Arc<AtomicBool>,
    /// Handled batches go back to the reader, which reuses their records' buffers.
    kmsg_return: std::sync::mpsc::SyncSender<Vec<follow::KmsgEvent>>,
    ops: ops::Ops,
    alerts: AlertStage,
    /// Held while the loop runs: dropping it stops the watching.
    watcher: Option<::notify::RecommendedWatcher>,
    reload_tx: mpsc::Sender<()>,
    /// The status file is written after the flush that follows its tick.
    status_due: bool,
}

/// Builds the daemon: state, the alert stage (what an earlier run left in the outbox goes out
/// meanwhile), the pipeline as the checkpoint left it, the kernel log reader, NVML (the kernel
/// log waits for its init at most `nvml.call_timeout_secs`), the operations side and the other
/// sources. `hangup` is SIGHUP, from [`signals::install`].
pub async fn build(opts: &RunOptions, hangup: Hangup) -> anyhow::Result<Daemon> {
    let cfg = &opts.config;
    let state = StateDir::open(&cfg.state_dir)?;
    let boot = state::current_boot_id(&opts.boot_id_path)?;
    let tel = Arc::new(Telemetry::new());
    tel.set_xid_overrides(cfg.overrides.clone());
    tel.set_kmsg_path(&cfg.kmsg.path);
    let nvml_state = if cfg.nvml.enabled {
        "starting"
    } else {
        "disabled"
    };
    tel.set_nvml(false, nvml_state);
    let alerts = AlertStage::start(cfg, opts.output)?;
    alert_stage::set_alert_provider(&tel, &alerts);
    let (mut p, probe_memory) = Pipeline::restore(opts, &state, boot, tel.clone(), alerts.sender());
    // An AER error the kernel reports on a port is tied to the one GPU below it.
    for (port, gpu) in crate::source::probe::ports_of_single_gpus(&cfg.nvml.sysfs_root) {
        p.classifier.learn_port(port, gpu);
    }

    let kmsg_stop = Arc::new(AtomicBool::new(false));
    let (ktx, krx) = mpsc::channel(follow::CHANNEL_BATCHES);
    let (kmsg_return, kmsg_returned) = follow::returns();
    let kfile = follow::open(&cfg.kmsg.path)?;
    let kmsg_thread = follow::spawn(
        cfg.kmsg.path.clone(),
        kfile,
        p.last_seq,
        ktx,
        Some(kmsg_returned),
        kmsg_stop.clone(),
    )
    .context("starting the kernel log reader")?;
    match p.last_seq {
        Some(seq) => tracing::info!("kernel log: resuming after record {seq} of this boot"),
        None => {
            tracing::info!("kernel log: first start in this boot, reading the whole buffer once")
        }
    }

    let link = cfg.nvml_link(&p.ckpt.boot_hex, tel.probe_rounds());
    let (nvml, nvml_now, diff) = crate::source::nvml::link::start(link, probe_memory).await?;
    for v in nvml_now {
        p.apply_nvml(v, true);
    }
    // Runbook `nvml` steps are answered through the NVML worker, under its deadline.
    p.out.env.nvml = nvml.probe_handle();
    let pages = crate::history::pages::Pages::open(cfg.state_dir.clone(), cfg.history.clone());
    pages.set_diff(diff);
    p.out.pages = Some(pages);

    let ops = ops::Ops::start(cfg, &tel).await?;
    let (services, svc_idle) = services::start(cfg);
    let (fabric, fm_idle) = fabricmanager::start(cfg, &state);
    let notifier = notify::Notifier::from_env();
    let (reload_tx, reloads) = mpsc::channel::<()>(1);
    let sources = Sources {
        kmsg: krx,
        nvml,
        services,
        fabric,
        watchdog: tokio::time::interval(
            notifier.watchdog_every.unwrap_or(Duration::from_secs(3600)),
        ),
        status: tokio::time::interval(control::STATUS_FILE_INTERVAL),
        reloads,
        hangup,
        _idle: (svc_idle, fm_idle),
    };
    Ok(Daemon {
        output: opts.output,
        watcher: crate::config::watch::watch_config(cfg, reload_tx.clone()),
        tel,
        notifier,
        pipeline: p,
        sources,
        kmsg_thread,
        kmsg_stop,
        kmsg_return,
        ops,
        alerts,
        reload_tx,
        status_due: false,
    })
}

/// Runs until `shutdown` is requested (or the kernel log reader ends). Returns after
/// persisting state.
///
/// The shape: the kernel log reader thread and the NVML side feed this task; the pipeline
/// classifies, correlates and hands incidents to the runbooks and the alert stage (which lives
/// for the whole run); the checkpoint moves only behind alerts the stage has made durable.
pub async fn run(mut d: Daemon, mut shutdown: Shutdown) -> anyhow::Result<()> {
    d.notifier.notify("READY=1");
    let cfg = &d.pipeline.current;
    tracing::info!(
        "xidwatch watching {} (state in {})",
        cfg.kmsg.path.display(),
        cfg.state_dir.display()
    );
    d.after().await;
    loop {
        let ev = d.sources.next(d.pipeline.waits(), &mut shutdown).await;
        if matches!(ev, Event::Shutdown) {
            break;
        }
        d.handle(ev).await?;
        d.after().await;
    }
    d.stop().await;
    Ok(())
}

impl Daemon {
    /// One event into the pipeline (the flush follows in [`Daemon::after`]).
    async fn handle(&mut self, ev: Event) -> anyhow::Result<()> {
        let p = &mut self.pipeline;
        match ev {
            Event::Kmsg(batch) => {
                p.kmsg(&batch)?;
                // Back to the reader for its buffers; dropped when it has enough waiting.
                let _ = self.kmsg_return.try_send(batch);
            }
            Event::Nvml(msg) => {
                for v in self.sources.nvml.handle(msg) {
                    p.apply_nvml(v, false);
                }
            }
            Event::Service(ev) => p.apply_service(*ev),
            Event::FabricLog(ev) => p.apply_fabric_log(ev),
            Event::FoldQuiet => p.fold_quiet(),
            Event::Deadline => p.tick(),
            Event::StatusTick => {
                self.tel.heartbeat();
                self.status_due = true;
            }
            Event::Watchdog => self.notifier.notify("WATCHDOG=1"),
            Event::Hangup | Event::ConfigChanged => {
                if p.reload(self.output, matches!(ev, Event::Hangup)).await {
                    // The runbook directories may have changed (or appeared): watch what is in
                    // force now.
                    self.watcher =
                        crate::config::watch::watch_config(&p.current, self.reload_tx.clone());
                }
            }
            Event::SaveDue | Event::Shutdown => {}
        }
        Ok(())
    }

    /// After every event: hand over what the engine released, save the checkpoint if due.
    async fn after(&mut self) {
        self.pipeline.flush(false).await;
        if std::mem::take(&mut self.status_due) {
            self.pipeline.write_status_file();
        }
    }

    /// Graceful shutdown, in order: stop the sources, keep what is in flight, hand it over,
    /// save, then end the operations side and the alert stage last.
    async fn stop(self) {
        let Daemon {
            notifier,
            mut pipeline,
            sources,
            kmsg_thread,
            kmsg_stop,
            ops,
            alerts,
            ..
        } = self;
        notifier.notify("STOPPING=1");
        kmsg_stop.store(true, Ordering::Relaxed);
        let Sources { kmsg, nvml, .. } = sources;
        nvml.stop();
        pipeline.shut_down().await;
        drop(kmsg);
        let _ = kmsg_thread.join();
        ops.stop();
        pipeline.stopped();
        drop(pipeline);
        alerts.stop().await;
    }
}
