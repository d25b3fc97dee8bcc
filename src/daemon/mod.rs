//! The daemon (`xidwatch run`): wires sources -> classifier -> incidents -> outputs, keeps the
//! kernel log position, and speaks systemd's notification protocol.
//!
//! Threads: one follows `/dev/kmsg`, one owns NVML and makes every NVML call (both block; see
//! [`nvml`]); everything else runs on a single-threaded tokio runtime, so the classifier and the
//! incident engine need no locks. Channels between them are bounded: when the pipeline falls
//! behind, the kmsg thread waits, the kernel ring buffer overwrites, and the loss is reported as an
//! overrun rather than hidden in an ever-growing queue.

pub(crate) mod checkpoint;
pub mod control;
mod fabricmanager;
pub mod health;
pub mod metrics;
pub(crate) mod notify;
pub(crate) mod nvml;
pub(crate) mod probe;
pub(crate) mod serve;
mod services;
pub mod telemetry;

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::mpsc;

use crate::classify::{Classifier, LineOrigin};
use crate::clock::Now;
use crate::config::Config;
use crate::host::alert_host;
use crate::incident::{Engine, EngineConfig, Origin};
use crate::model::{Detail, Finding, FindingKind, Incident};
use crate::source::kmsg::follow::{self, KmsgEvent};
use crate::source::kmsg::KernelClock;
use crate::state::{self, StateDir};
use checkpoint::{Acks, Checkpointer, SavedIncidents, CHECKPOINT};
use telemetry::Telemetry;

/// Where `run` sends incidents when no alert channel takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// The readable report, for a terminal or the journal.
    Text,
    /// One JSON object per incident.
    Json,
}

/// Options of one daemon run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub config: Config,
    pub output: Output,
    /// `/proc/sys/kernel/random/boot_id`, replaceable for tests.
    pub boot_id_path: PathBuf,
    /// `/proc/stat`, whose `btime` dates kernel log records; replaceable for tests, which set the
    /// boot's time to make a record as old as they need.
    pub boot_time_path: PathBuf,
}

/// How long a multi-line message may wait for its next line before it is reported as it is.
const FOLD_QUIET: Duration = Duration::from_millis(50);

fn now_ms() -> u64 {
    crate::clock::wall_ms()
}

/// Counters the daemon keeps about its sources.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct SourceStats {
    pub kmsg_records: u64,
    pub kmsg_userspace_ignored: u64,
    pub kmsg_malformed: u64,
    pub kmsg_lost: u64,
    pub nvml_up: bool,
    pub gpus_seen: usize,
}

/// Runs until SIGTERM/SIGINT. Returns after persisting state.
///
/// The shape: the kernel log reader thread and the NVML worker feed this task; the [`Pipeline`]
/// classifies, correlates and hands incidents to the runbooks and the alert stage (which lives for
/// the whole run); the checkpoint moves only behind alerts the stage has made durable.
pub async fn run(opts: RunOptions) -> anyhow::Result<()> {
    // The handlers first: a stop requested while the rest is set up (NVML can take seconds to
    // open) waits for the loop and is a clean shutdown with the checkpoint saved, not a death
    // by the signal's default action.
    let signal = |kind| tokio::signal::unix::signal(kind).context("installing the signal handlers");
    use tokio::signal::unix::SignalKind;
    let (mut sigterm, mut sigint, mut sighup) = (
        signal(SignalKind::terminate())?,
        signal(SignalKind::interrupt())?,
        signal(SignalKind::hangup())?,
    );
    let cfg = &opts.config;
    let notifier = notify::Notifier::from_env();
    let state = StateDir::open(&cfg.state_dir)?;
    let boot = state::current_boot_id(&opts.boot_id_path)?;
    let tel = Arc::new(Telemetry::new());
    tel.set_xid_overrides(cfg.overrides.clone());
    tel.set_kmsg_path(&cfg.kmsg.path);
    tel.set_nvml(
        false,
        if cfg.nvml.enabled {
            "starting"
        } else {
            "disabled"
        },
    );
    // The alert stage first: what an earlier run left in the outbox goes out meanwhile.
    let alerts = AlertStage::start(cfg, opts.output)?;
    set_alert_provider(&tel, &alerts);
    let (mut p, probe_memory) =
        Pipeline::restore(&opts, &state, boot, tel.clone(), alerts.sender())?;
    learn_topology(&mut p.classifier, &cfg.nvml.sysfs_root);

    let stop = Arc::new(AtomicBool::new(false));
    let (ktx, mut krx) = mpsc::channel::<KmsgEvent>(1024);
    let kfile = follow::open(&cfg.kmsg.path)?;
    let kthread = follow::spawn(cfg.kmsg.path.clone(), kfile, p.last_seq, ktx, stop.clone())
        .context("starting the kernel log reader")?;
    match p.last_seq {
        Some(seq) => tracing::info!("kernel log: resuming after record {seq} of this boot"),
        None => {
            tracing::info!("kernel log: first start in this boot, reading the whole buffer once")
        }
    }

    // NVML, on its own worker thread; the kernel log waits for its init at most
    // nvml.call_timeout_secs (capped at nvml::NVML_OPEN_LIMIT). Failures become findings, said
    // once.
    let (mut nvml_link, nvml_now) = nvml::start(
        cfg,
        &tel,
        &mut p.classifier,
        &mut p.stats,
        probe_memory,
        &p.ckpt.boot_hex,
    )
    .await?;
    // Without NVML a lost GPU's recovery cannot be verified: its page says so.
    p.engine.set_can_verify(nvml_link.can_verify());
    for f in nvml_now {
        p.feed(f, Origin::Nvml, Now::read(), true);
    }
    // Runbook `nvml` steps are answered through the NVML worker, under its deadline.
    p.out.env.nvml = nvml_link.probe_handle();
    p.out.pages = Some(nvml_link.pages());

    let (ops_shutdown, status_socket) = start_ops(cfg, &tel).await?;
    let (mut svc_rx, _svc_keep) = services::start(cfg);
    let (mut fm_rx, _fm_keep) = fabricmanager::start(cfg, &state);
    let mut fm_saved = None;

    let mut watchdog =
        tokio::time::interval(notifier.watchdog_every.unwrap_or(Duration::from_secs(3600)));
    let mut status_timer = tokio::time::interval(control::STATUS_FILE_INTERVAL);
    let (reload_tx, mut reload_rx) = mpsc::channel::<()>(1);
    // Held for as long as the loop runs: dropping it stops the watching.
    let mut _watcher = watch_config(cfg, reload_tx.clone());

    notifier.notify("READY=1");
    tracing::info!(
        "xidwatch watching {} (state in {})",
        cfg.kmsg.path.display(),
        cfg.state_dir.display()
    );
    p.flush(&nvml_link.probe_memory, false).await;

    loop {
        let deadline = p
            .engine
            .next_deadline()
            .map(|d| d.saturating_sub(crate::clock::mono_ms()))
            .unwrap_or(3_600_000);
        let save_at = p.ckpt.due_at(&p.acks, p.last_seq, &p.engine);
        let fold_wait = FOLD_QUIET.saturating_sub(p.last_record.elapsed());
        tokio::select! {
            ev = krx.recv() => {
                let Some(ev) = ev else { break };
                let mut batch = vec![ev];
                // Drain what is already queued so a storm is handled in batches.
                while batch.len() < 512 {
                    match krx.try_recv() {
                        Ok(ev) => batch.push(ev),
                        Err(_) => break,
                    }
                }
                p.kmsg(batch)?;
                p.flush(&nvml_link.probe_memory, false).await;
            }
            Some(msg) = nvml_link.next() => {
                for (f, origin) in nvml_link.handle(msg, &tel, &mut p.classifier, &mut p.stats) {
                    p.feed(f, origin, Now::read(), false);
                }
                for f in nvml_link.take_verified() {
                    health::verified(&mut p, &f);
                }
                p.engine.set_can_verify(nvml_link.can_verify());
                if let Some(v) = nvml_link.take_lost_check() {
                    p.engine.verify_lost(&v, Now::read(), &mut p.out_buf);
                }
                // The probe's memory is part of the checkpoint: save it promptly when it moved.
                let moved = nvml_link.probe_memory != p.ckpt.saved_probe;
                p.flush(&nvml_link.probe_memory, moved).await;
            }
            Some(ev) = svc_rx.recv() => {
                services::apply(&mut p, ev);
                p.flush(&nvml_link.probe_memory, false).await;
            }
            Some(ev) = fm_rx.recv() => {
                let pos = fabricmanager::apply(&mut p, ev);
                // The position moves only once what was read is handed over and durable.
                if p.flush(&nvml_link.probe_memory, false).await {
                    if let Some(pos) = pos {
                        fabricmanager::save(&state, &mut fm_saved, pos);
                    }
                }
            }
            _ = tokio::time::sleep(fold_wait), if p.classifier.has_pending() => {
                p.fold_quiet();
                p.flush(&nvml_link.probe_memory, false).await;
            }
            _ = tokio::time::sleep(Duration::from_millis(deadline)) => {
                p.engine.tick(Now::read(), &mut p.out_buf);
                p.flush(&nvml_link.probe_memory, false).await;
            }
            _ = status_timer.tick() => {
                tel.heartbeat();
                p.flush(&nvml_link.probe_memory, false).await;
                p.write_status_file();
            }
            _ = watchdog.tick() => {
                notifier.notify("WATCHDOG=1");
                p.flush(&nvml_link.probe_memory, false).await;
            }
            _ = sighup.recv() => {
                p.reload(&opts, true).await;
                // The runbook directories may have changed (or appeared): watch what is in force now.
                _watcher = watch_config(&p.current, reload_tx.clone());
                p.flush(&nvml_link.probe_memory, false).await;
            }
            Some(()) = reload_rx.recv() => {
                // Editors write a file in several steps: let them finish.
                tokio::time::sleep(Duration::from_millis(300)).await;
                while reload_rx.try_recv().is_ok() {}
                if p.reload(&opts, false).await {
                    _watcher = watch_config(&p.current, reload_tx.clone());
                    p.flush(&nvml_link.probe_memory, false).await;
                }
            }
            _ = tokio::time::sleep_until(save_at.unwrap_or_else(tokio::time::Instant::now)), if save_at.is_some() => {
                p.flush(&nvml_link.probe_memory, false).await;
            }
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
        }
    }

    // Graceful shutdown: stop the sources, keep what is in flight.
    notifier.notify("STOPPING=1");
    stop.store(true, Ordering::Relaxed);
    let probe_memory = nvml_link.probe_memory.clone();
    nvml_link.stop();
    p.fold_quiet();
    // Runbooks still running give up; their alerts go out without evidence rather than not at all.
    p.out.emit_all(&mut p.out_buf, &mut p.acks).await;
    p.out.finish().await;
    if !p.flush(&probe_memory, true).await {
        tracing::warn!("some alerts were not written to the outbox in time; the kernel log position stays before them and they are raised again at the next start");
    }
    drop(krx);
    let _ = kthread.join();
    let _ = ops_shutdown.send(true);
    // The socket this daemon bound goes with it: a clean stop leaves no file that `status`
    // would have to tell from a crash's.
    if let Some(path) = status_socket {
        if let Err(e) = std::fs::remove_file(&path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!("cannot remove the status socket {}: {e}", path.display());
            }
        }
    }
    p.stopped();
    drop(p);
    alerts.stop().await;
    Ok(())
}

/// Tells the classifier which PCIe port sits above which GPU (from sysfs), so an AER error the
/// kernel reports on a root or switch port is tied to the GPU below it. A port with several GPUs
/// below is left out: an error there cannot be pinned on one of them.
fn learn_topology(classifier: &mut Classifier, sysfs_root: &std::path::Path) {
    let Ok(gpus) = probe::Probe::new(sysfs_root.to_path_buf()).gpus_on_bus() else {
        return;
    };
    let mut below: std::collections::BTreeMap<
        crate::model::PciAddress,
        Vec<crate::model::PciAddress>,
    > = Default::default();
    for gpu in &gpus {
        for port in crate::runbook::sysfs::ports_above(sysfs_root, *gpu) {
            below.entry(port).or_default().push(*gpu);
        }
    }
    for (port, gpus) in below {
        if let [gpu] = gpus[..] {
            classifier.learn_port(port, gpu);
        }
    }
}

/// The Prometheus endpoint (when configured) and the status socket; they end when the returned
/// sender says so. Also gives the socket's path when this daemon bound it, for the stop to remove.
async fn start_ops(
    cfg: &Config,
    tel: &Arc<Telemetry>,
) -> anyhow::Result<(tokio::sync::watch::Sender<bool>, Option<std::path::PathBuf>)> {
    let (ops_shutdown, ops_rx) = tokio::sync::watch::channel(false);
    let metrics_settings = &cfg.metrics_settings;
    for w in &metrics_settings.warnings {
        tracing::warn!("{w}");
    }
    if let Some(addr) = metrics_settings.listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("metrics: listening on {addr}"))?;
        tracing::info!("metrics on http://{addr}/metrics");
        tokio::spawn(metrics::serve(l, tel.clone(), ops_rx.clone()));
    }
    let path = control::socket_path(&cfg.state_dir);
    let bound = match control::bind_status_socket(&path) {
        Ok(sock) => {
            tokio::spawn(control::serve_status_on(sock, tel.clone(), ops_rx.clone()));
            Some(path)
        }
        Err(e) => {
            tracing::warn!(
                "status socket unavailable ({e:#}); `xidwatch status` reads status.json"
            );
            None
        }
    };
    Ok((ops_shutdown, bound))
}

/// Classify, correlate, hand over, checkpoint: everything the processing task owns. Nothing in
/// here blocks on NVML, a child process or the network.
struct Pipeline {
    tel: Arc<Telemetry>,
    classifier: Classifier,
    engine: Engine,
    stats: SourceStats,
    out: Emitter,
    acks: Acks,
    ckpt: Checkpointer,
    /// Incidents the engine produced and not yet handed over.
    out_buf: Vec<Incident>,
    findings: Vec<Finding>,
    /// The last kernel log record read.
    last_seq: Option<u64>,
    last_record: tokio::time::Instant,
    caught_up: bool,
    /// The config in force (settings that need a restart keep their start-up values).
    current: Config,
    last_reload_error: Option<String>,
    fingerprint: Fingerprint,
    /// Whether the log said that a program's kernel log line that looked like a GPU fault was
    /// ignored: said once, so that whoever tests with `echo ... > /dev/kmsg` learns the key.
    said_userspace: bool,
    /// Dates kernel log records on the wall clock (boot time plus the record's timestamp).
    kclock: KernelClock,
}

impl Pipeline {
    /// The pipeline as the last checkpoint of this boot left it (or new), and the probe's
    /// memory from that checkpoint.
    fn restore(
        opts: &RunOptions,
        state: &StateDir,
        boot: [u8; 16],
        tel: Arc<Telemetry>,
        alerts: crate::alert::AlertSender,
    ) -> anyhow::Result<(Pipeline, Option<probe::Memory>)> {
        let cfg = &opts.config;
        let boot_hex = state::hex(&boot);
        let position = match state.load_position() {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("{e:#}; reading the whole kernel log again");
                None
            }
        };
        let mut resume_after = position.filter(|p| p.boot_id == boot).map(|p| p.last_seq);
        let mut engine = Engine::new(EngineConfig {
            window_ms: cfg.incidents.window_secs.saturating_mul(1000),
            max_open: cfg.incidents.max_open,
            nvml_match_ms: cfg.incidents.nvml_match_ms,
            host: alert_host(cfg.incidents.host.as_deref()),
            boot_id: boot_hex.clone(),
            overrides: cfg.overrides.clone(),
            settle_ms: cfg.incidents.settle_ms,
            quiet_ms: cfg.incidents.quiet_secs.saturating_mul(1000),
            remind_ms: cfg.incidents.remind_secs.saturating_mul(1000),
        });
        let mut probe_memory = None;
        // The previous boot's open incidents and their notices ([`Engine::carry_over`]).
        let mut carried = Vec::new();
        match state.load_json::<SavedIncidents>(CHECKPOINT) {
            Ok(Some(saved)) if saved.boot_id != boot_hex => {
                engine.carry_over(saved.open, &saved.boot_id, Now::read(), &mut carried);
                let open = engine.open_count();
                if open > 0 || !carried.is_empty() {
                    tracing::info!(
                        "new boot: {open} incident(s) of the previous boot still open until verified; {} ended by the reboot",
                        carried.len()
                    );
                }
            }
            Ok(Some(saved)) => {
                engine.restore(saved.open);
                probe_memory = saved.probe;
                // The snapshot accounts for every record up to its own position: go on from
                // there, so nothing is counted twice (the position file is only a fallback).
                if saved.last_seq.is_some() {
                    resume_after = saved.last_seq;
                }
            }
            Ok(_) => {}
            // Say so, and go on: the kernel log position still prevents duplicates; only the
            // counts of incidents open before the restart start again.
            Err(e) => {
                tracing::warn!("{e:#}; open incidents of the previous run are not restored")
            }
        }
        // The first start of a boot reads the whole ring buffer: what the kernel logged before
        // the look-back is recorded, not paged. A restart within the boot reads only what came
        // after its saved position: all of it is new.
        let lookback_ms = cfg.kmsg.lookback_secs.saturating_mul(1000);
        let lookback_from = (resume_after.is_none() && lookback_ms > 0)
            .then(|| now_ms().saturating_sub(lookback_ms));
        engine.set_lookback(lookback_from);
        let out = Emitter {
            lookback_secs: cfg.kmsg.lookback_secs,
            before_lookback: 0,
            told_before_lookback: false,
            output: opts.output,
            stdout: std::io::stdout(),
            alerts,
            runbooks: cfg.runbook_set.clone(),
            env: runbook_env(cfg),
            limits: cfg.runbook_limits,
            permits: Arc::new(tokio::sync::Semaphore::new(
                cfg.runbooks.max_parallel_runbooks(),
            )),
            parallel: cfg.runbooks.max_parallel_runbooks(),
            log: std::collections::VecDeque::with_capacity(LOG_RING),
            tel: tel.clone(),
            pages: None,
            tasks: tokio::task::JoinSet::new(),
            stop_runbooks: tokio::sync::watch::channel(false).0,
        };
        let ckpt = Checkpointer {
            state: state.clone(),
            boot,
            boot_hex,
            saved_seq: resume_after,
            // What was carried over from the previous boot is saved under this boot at the
            // first save (after the notices it sent are durable).
            saved_changes: if engine.open_count() > 0 || !carried.is_empty() {
                engine.changes().wrapping_add(1)
            } else {
                engine.changes()
            },
            saved_probe: probe::Memory::default(),
            shown_changes: u64::MAX,
            last_save: tokio::time::Instant::now(),
            errors: 0,
        };
        let p = Pipeline {
            tel,
            classifier: Classifier::new(),
            engine,
            stats: SourceStats::default(),
            out,
            acks: Acks::default(),
            ckpt,
            out_buf: carried,
            findings: Vec::new(),
            last_seq: resume_after,
            last_record: tokio::time::Instant::now(),
            caught_up: false,
            current: cfg.clone(),
            last_reload_error: None,
            fingerprint: Fingerprint::of(cfg),
            said_userspace: false,
            kclock: KernelClock::read(&opts.boot_time_path),
        };
        Ok((p, probe_memory))
    }

    /// Counts a finding and hands it to the incident engine.
    fn feed(&mut self, f: Finding, origin: Origin, now: Now, at_startup: bool) {
        push(
            &self.tel,
            &mut self.engine,
            f,
            origin,
            now,
            at_startup,
            &mut self.out_buf,
        );
    }

    /// One batch from the kernel log reader.
    fn kmsg(&mut self, batch: Vec<KmsgEvent>) -> anyhow::Result<()> {
        let now = Now::read();
        for ev in batch {
            match ev {
                KmsgEvent::Record { rec, at_startup } => {
                    self.stats.kmsg_records += 1;
                    self.tel.kmsg_records(1);
                    self.last_seq = Some(rec.seq);
                    if !rec.is_kernel() && !self.current.kmsg.accept_userspace {
                        self.stats.kmsg_userspace_ignored += 1;
                        self.tel.kmsg_userspace_ignored(1);
                        // Only a line that looks like a GPU fault: programs (systemd among them)
                        // write other lines to the kernel log at every boot.
                        if !self.said_userspace
                            && crate::classify::prefilter::Prefilter::shared()
                                .is_candidate(rec.message.as_bytes())
                        {
                            self.said_userspace = true;
                            tracing::info!(
                                "a kernel log line written by a program, not the kernel, is ignored (kmsg record {}): set [kmsg] accept_userspace = true to accept such lines (fire drills); said once, the rest are counted in `xidwatch status`",
                                rec.seq
                            );
                        }
                        continue;
                    }
                    let at = LineOrigin {
                        line: 0,
                        seq: Some(rec.seq),
                        ts_usec: Some(rec.ts_usec),
                        timestamp: Some(format!(
                            "[{:>5}.{:06}]",
                            rec.ts_usec / 1_000_000,
                            rec.ts_usec % 1_000_000
                        )),
                    };
                    for line in rec.lines() {
                        self.out.remember(rec.seq, rec.ts_usec, line);
                        if crate::classify::prefix::message_start(line) == Some(0) {
                            self.classifier.push(line, &at, &mut self.findings);
                        }
                    }
                    for mut f in std::mem::take(&mut self.findings) {
                        self.date(&mut f, now);
                        self.feed(f, Origin::Kmsg, now, at_startup);
                    }
                }
                KmsgEvent::Overrun {
                    lost,
                    next_seq,
                    at_startup,
                } => {
                    self.stats.kmsg_lost += lost;
                    self.tel.kmsg_lost(lost);
                    tracing::warn!(
                        "kernel log overrun: {lost} records lost before record {next_seq}"
                    );
                    self.feed(
                        overrun_finding(lost, next_seq),
                        Origin::Kmsg,
                        now,
                        at_startup,
                    );
                }
                KmsgEvent::SequenceAnomaly {
                    anomaly,
                    at_startup,
                } => {
                    // Counted; reported once as a finding, later ones sparingly in the log.
                    self.tel.kmsg_out_of_sequence(1);
                    if anomaly.count == 1 {
                        tracing::warn!("kernel log: {anomaly}; later records are still read");
                        self.feed(sequence_finding(&anomaly), Origin::Kmsg, now, at_startup);
                    } else if anomaly.count <= 10 || anomaly.count.is_power_of_two() {
                        tracing::warn!(
                            "kernel log: {anomaly}; {} records out of sequence so far",
                            anomaly.count
                        );
                    }
                }
                KmsgEvent::Malformed(why) => {
                    self.stats.kmsg_malformed += 1;
                    self.tel.kmsg_malformed(1);
                    let n = self.stats.kmsg_malformed;
                    if n <= 10 || n.is_power_of_two() {
                        tracing::warn!(
                            "kernel log: skipped a malformed record ({why}); {n} so far"
                        );
                    }
                }
                KmsgEvent::CaughtUp => {
                    if !self.caught_up {
                        self.caught_up = true;
                        tracing::info!(
                            "kernel log: caught up ({} records read at start-up)",
                            self.stats.kmsg_records
                        );
                    }
                }
                KmsgEvent::Failed(why) => {
                    anyhow::bail!("kernel log reader stopped: {why}");
                }
            }
        }
        self.last_record = tokio::time::Instant::now();
        Ok(())
    }

    /// A multi-line message got no next line in time: report it as it is.
    fn fold_quiet(&mut self) {
        self.classifier.flush(&mut self.findings);
        let now = Now::read();
        // Lines read before the reader caught up were in the buffer at start-up.
        let at_startup = !self.caught_up;
        for mut f in std::mem::take(&mut self.findings) {
            self.date(&mut f, now);
            self.feed(f, Origin::Kmsg, now, at_startup);
        }
    }

    /// Dates a kernel log finding when the kernel logged it, not when it was read: at start-up
    /// that may be hours earlier.
    fn date(&self, f: &mut Finding, now: Now) {
        if let Some(ts) = f.origin.ts_usec {
            f.logged_ms = Some(self.kclock.wall_ms(ts, now));
        }
    }

    /// Hands what the engine produced over, then writes the checkpoint if it is due and every
    /// alert is durable. False when an alert is still not durable.
    async fn flush(&mut self, probe: &probe::Memory, force: bool) -> bool {
        if !self.out_buf.is_empty() {
            // The pages report the GPU's state as of these incidents ([`state_doc`]).
            self.tel
                .set_open_incidents_from(self.engine.open_incidents());
        }
        self.out.emit_all(&mut self.out_buf, &mut self.acks).await;
        self.ckpt
            .save(
                &mut self.acks,
                self.last_seq,
                &self.engine,
                probe,
                &self.tel,
                force,
            )
            .await
    }

    /// Reloads on SIGHUP (`explicit`), or on a file change when what is in force really
    /// changed. True when it reloaded.
    async fn reload(&mut self, opts: &RunOptions, explicit: bool) -> bool {
        // Only a real change of what is in force reloads: not a stray file, not a save without
        // edits.
        if !explicit && Fingerprint::of(&self.current) == self.fingerprint {
            return false;
        }
        reload(
            opts,
            &mut self.current,
            &mut self.engine,
            &mut self.out,
            &mut self.last_reload_error,
            &mut self.out_buf,
        )
        .await;
        self.fingerprint = Fingerprint::of(&self.current);
        true
    }

    fn write_status_file(&self) {
        self.tel
            .set_open_incidents_from(self.engine.open_incidents());
        let (dir, snap) = (self.current.state_dir.clone(), self.tel.snapshot());
        tokio::task::spawn_blocking(move || {
            if let Err(e) = control::write_status_file(&dir, &snap) {
                state::log_write_error("status", &format!("{e:#}"));
            }
        });
    }

    /// The last status file, and the last log line.
    fn stopped(&self) {
        self.tel
            .set_open_incidents_from(self.engine.open_incidents());
        let mut last = self.tel.snapshot();
        last.stopped_ms = Some(now_ms());
        if let Err(e) = control::write_status_file(&self.current.state_dir, &last) {
            tracing::warn!("{e:#}");
        }
        let st = &self.stats;
        tracing::info!(
            "stopped: {} records read, {} lost, {} userspace ignored, {} malformed; {} incidents open",
            st.kmsg_records,
            st.kmsg_lost,
            st.kmsg_userspace_ignored,
            st.kmsg_malformed,
            self.engine.open_count()
        );
    }
}

/// Counts a finding for metrics and status, then hands it to the incident engine.
fn push(
    tel: &Telemetry,
    engine: &mut Engine,
    f: Finding,
    origin: Origin,
    now: impl Into<Now>,
    at_startup: bool,
    out: &mut Vec<Incident>,
) {
    tel.record_finding(&f);
    engine.push(f, origin, now, at_startup, out);
}

/// What is in force: the config file's bytes and every runbook file's name and bytes. Reload
/// happens when this changes, not whenever something touches the folders.
#[derive(Debug, PartialEq, Eq)]
struct Fingerprint(u64);

impl Fingerprint {
    fn of(cfg: &Config) -> Fingerprint {
        let mut h = crate::model::Fnv::default();
        let mut eat = |bytes: &[u8]| h.eat(bytes);
        let read = |p: &std::path::Path| {
            // Bounded: a runbook or config larger than this is refused by the loader anyway.
            use std::io::Read;
            let mut buf = Vec::new();
            if let Ok(f) = std::fs::File::open(p) {
                let _ = f.take(4 << 20).read_to_end(&mut buf);
            }
            buf
        };
        if let Some(p) = &cfg.source {
            eat(p.as_os_str().as_encoded_bytes());
            eat(&read(p));
        }
        for d in cfg.runbooks.dirs() {
            eat(d.as_os_str().as_encoded_bytes());
            let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&d)
                .map(|rd| {
                    rd.filter_map(|e| e.ok())
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
                        .collect()
                })
                .unwrap_or_default();
            files.sort();
            for f in files {
                eat(f.as_os_str().as_encoded_bytes());
                eat(&read(&f));
            }
        }
        Fingerprint(h.finish())
    }
}

fn overrun_finding(lost: u64, next_seq: u64) -> Finding {
    let mut f = crate::classify::signals::finding(
        FindingKind::KmsgOverrun,
        None,
        format!("kernel log overrun: {lost} records lost"),
    );
    f.message = format!("{lost} kernel log records were lost before record {next_seq}; faults in them may have been missed");
    f.detail = Some(Detail::Overrun { lost });
    f.origin.seq = Some(next_seq);
    f
}

fn sequence_finding(a: &follow::SeqAnomaly) -> Finding {
    let mut f = crate::classify::signals::finding(
        FindingKind::KmsgSequence,
        None,
        format!("kernel log: {a}"),
    );
    f.message = format!(
        "{a}. The kernel numbers its records one by one, so the log being read is not what it \
         seems (a rewritten or concatenated file, or a bug); records after it are still read. \
         Later ones are counted in the daemon's log, not reported again."
    );
    f.origin.seq = Some(a.seq);
    f
}

fn set_alert_provider(tel: &Telemetry, alerts: &AlertStage) {
    let s = alerts.sender();
    tel.set_alert_status_provider(Some(Arc::new(move || s.status())));
}

/// The `[alerts]` config as the daemon applies it: with `--json`, standard output belongs to the
/// incident stream.
fn alert_config(cfg: &Config, output: Output) -> crate::alert::AlertConfig {
    let mut alert_cfg = cfg.alerts.clone();
    if output == Output::Json {
        alert_cfg.stdout.enabled = Some(false);
    }
    alert_cfg
}

/// The channels built when the config was loaded, as the daemon uses them (see
/// [`alert_config`]).
fn alert_channels(cfg: &Config, output: Output) -> crate::alert::channel::BuiltChannels {
    if output == Output::Json {
        cfg.alert_channels
            .without(crate::alert::config::STDOUT_CHANNEL)
    } else {
        cfg.alert_channels.clone()
    }
}

/// The alert stage as the daemon runs it: started once, for the whole run, and reconfigured in
/// place on reload, so a runbook that outlives a reload still hands its evidence to the same
/// stage and one outbox is ever open on the state directory.
struct AlertStage {
    sender: crate::alert::AlertSender,
    handle: tokio::task::JoinHandle<()>,
    shutdown: tokio::sync::watch::Sender<bool>,
}

impl AlertStage {
    fn start(cfg: &Config, output: Output) -> anyhow::Result<AlertStage> {
        let alert_cfg = alert_config(cfg, output);
        for w in alert_cfg
            .secret_warnings(cfg.source.as_deref())
            .into_iter()
            .chain(alert_cfg.cleartext_warnings())
        {
            tracing::warn!("{w}");
        }
        let (shutdown, rx) = tokio::sync::watch::channel(false);
        let built = alert_channels(cfg, output);
        let (sender, handle) =
            crate::alert::Dispatcher::start_built(&alert_cfg, &built, &cfg.state_dir, rx)
                .map_err(|e| anyhow::anyhow!("starting the alert stage: {e}"))?;
        Ok(AlertStage {
            sender,
            handle,
            shutdown,
        })
    }

    fn sender(&self) -> crate::alert::AlertSender {
        self.sender.clone()
    }

    async fn stop(self) {
        let _ = self.shutdown.send(true);
        drop(self.sender);
        // The outbox keeps whatever is not delivered yet; give in-flight sends a moment.
        let _ = tokio::time::timeout(Duration::from_secs(5), self.handle).await;
    }
}

/// Watches the config file and the runbook directories; any change asks for a reload. The
/// directory of the config is watched, not the file, since editors replace files by renaming.
fn watch_config(cfg: &Config, tx: mpsc::Sender<()>) -> Option<::notify::RecommendedWatcher> {
    use ::notify::Watcher;
    let path = cfg.source.clone()?;
    let file_name = path.file_name().map(|n| n.to_os_string());
    let dir = path
        .parent()
        .map(|p| {
            if p.as_os_str().is_empty() {
                std::path::Path::new(".")
            } else {
                p
            }
        })?
        .to_path_buf();
    let runbook_dirs = cfg.runbooks.dirs();
    let mut w = match ::notify::recommended_watcher(move |ev: ::notify::Result<::notify::Event>| {
        let Ok(ev) = ev else { return };
        if matches!(ev.kind, ::notify::EventKind::Access(_)) {
            return;
        }
        let relevant = ev.paths.iter().any(|p| {
            p.file_name().map(|n| n.to_os_string()) == file_name
                || p.extension().is_some_and(|e| e == "toml")
        });
        if relevant {
            let _ = tx.try_send(());
        }
    }) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(
                "cannot watch {} for changes ({e}); reload with SIGHUP",
                path.display()
            );
            return None;
        }
    };
    if let Err(e) = w.watch(&dir, ::notify::RecursiveMode::NonRecursive) {
        tracing::warn!(
            "cannot watch {} for changes ({e}); reload with SIGHUP",
            dir.display()
        );
        return None;
    }
    for d in runbook_dirs {
        let _ = w.watch(&d, ::notify::RecursiveMode::NonRecursive);
    }
    Some(w)
}

/// Reloads the config (and its runbooks and channels). A config that does not validate is
/// refused: the old one stays in force, and the refusal is logged and alerted once per distinct
/// error.
#[allow(clippy::too_many_arguments)]
async fn reload(
    opts: &RunOptions,
    current: &mut Config,
    engine: &mut Engine,
    out: &mut Emitter,
    last_error: &mut Option<String>,
    out_buf: &mut Vec<Incident>,
) {
    let Some(path) = current.source.clone() else {
        tracing::info!(
            "reload requested, but xidwatch runs on built-in defaults: nothing to reload"
        );
        return;
    };
    let new = match Config::load(Some(&path)) {
        Ok(c) => c,
        Err(e) => {
            let text = e.to_string();
            tracing::error!("config reload refused, the previous config stays in force: {text}");
            out.tel.config_reloaded(false, now_ms());
            if last_error.as_deref() != Some(text.as_str()) {
                *last_error = Some(text.clone());
                // The page names file, line and key, never the value (it may be a secret).
                let refused = e.refusal(crate::config::read_config_file(&path).ok().as_deref());
                let mut f = crate::classify::signals::finding(
                    FindingKind::ConfigRejected,
                    None,
                    format!("config reload refused: {}", refused.words()),
                );
                f.message = format!(
                    "{} was refused; the previous config stays in force. `xidwatch check --config {}` prints the whole error.{}",
                    refused.words(),
                    path.display(),
                    refused.detail.as_deref().map(|d| format!("\n{d}")).unwrap_or_default()
                );
                out.tel.record_finding(&f);
                engine.push(f, Origin::Probe, Now::read(), false, out_buf);
            }
            return;
        }
    };
    *last_error = None;
    for (what, changed) in [
        ("kmsg.path", new.kmsg.path != current.kmsg.path),
        ("state.dir", new.state_dir != current.state_dir),
        ("nvml", new.nvml != current.nvml),
        (
            "incidents.host",
            new.incidents.host != current.incidents.host,
        ),
        ("metrics", new.metrics != current.metrics),
        ("health", new.health != current.health),
        ("inventory", new.inventory != current.inventory),
        ("history", new.history != current.history),
        ("services", new.services != current.services),
        ("fabricmanager", new.fabricmanager != current.fabricmanager),
    ] {
        if changed {
            tracing::warn!("{what} changed: it takes effect at the next restart");
        }
    }
    engine.reconfigure(
        new.incidents.window_secs.saturating_mul(1000),
        new.incidents.max_open,
        new.incidents.nvml_match_ms,
        new.overrides.clone(),
        new.incidents.settle_ms,
        new.incidents.quiet_secs.saturating_mul(1000),
    );
    engine.set_remind_ms(new.incidents.remind_secs.saturating_mul(1000));
    out.runbooks = new.runbook_set.clone();
    let nvml = out.env.nvml.take();
    out.env = runbook_env(&new);
    out.env.nvml = nvml;
    out.limits = new.runbook_limits;
    out.permits = Arc::new(tokio::sync::Semaphore::new(
        new.runbooks.max_parallel_runbooks(),
    ));
    out.parallel = new.runbooks.max_parallel_runbooks();
    match out
        .alerts
        .reconfigure(
            &alert_config(&new, opts.output),
            &alert_channels(&new, opts.output),
        )
        .await
    {
        Ok(warnings) => {
            for w in warnings {
                tracing::warn!("{w}");
            }
        }
        Err(e) => tracing::error!("alert channels not changed, keeping the old ones: {e}"),
    }
    // Settings that need a restart keep their old values until then.
    let mut applied = new;
    applied.kmsg.path = current.kmsg.path.clone();
    applied.state_dir = current.state_dir.clone();
    applied.nvml = current.nvml.clone();
    applied.incidents.host = current.incidents.host.clone();
    applied.metrics = current.metrics.clone();
    applied.health = current.health.clone();
    applied.inventory = current.inventory.clone();
    applied.history = current.history.clone();
    applied.services = current.services.clone();
    applied.fabricmanager = current.fabricmanager.clone();
    *current = applied;
    out.tel.set_xid_overrides(current.overrides.clone());
    out.tel.config_reloaded(true, now_ms());
    tracing::info!("config reloaded from {}", path.display());
}

/// Kernel log lines kept for runbook excerpts ("the kernel log around the incident").
const LOG_RING: usize = 2000;

/// Hands incidents on: JSON on standard output with `--json`; to the alert stage, which makes
/// each alert durable at once (the acknowledgement comes back to [`Acks`]); and to the runbooks.
/// A new incident's alert is held in the outbox while its runbook runs (bounded concurrency, off
/// the processing loop), and the evidence is attached when it is done; a digest goes straight
/// out, so a storm never runs a runbook per line.
struct Emitter {
    output: Output,
    stdout: std::io::Stdout,
    alerts: crate::alert::AlertSender,
    runbooks: Arc<crate::runbook::RunbookSet>,
    env: crate::runbook::RunbookEnv,
    limits: crate::runbook::RunLimits,
    permits: Arc<tokio::sync::Semaphore>,
    /// `[runbooks] max_parallel_runbooks`: the permits, for how long a host page waits.
    parallel: usize,
    log: std::collections::VecDeque<crate::runbook::LogLine>,
    tel: Arc<Telemetry>,
    /// Runbooks running (or waiting to run) for new incidents.
    tasks: tokio::task::JoinSet<()>,
    /// Tells running runbooks to give up (shutdown).
    stop_runbooks: tokio::sync::watch::Sender<bool>,
    /// The GPU's history and inventory diff, put on each page beside the runbook's evidence.
    pages: Option<health::Pages>,
    /// `[kmsg] lookback_secs`, for the note.
    lookback_secs: u64,
    /// Incidents opened before the look-back at start-up: recorded, not paged.
    before_lookback: u64,
    /// Whether a page already carried the note about them: said once.
    told_before_lookback: bool,
}

/// "6 h", "90 min", "45 s": the look-back as people read it.
fn lookback_words(secs: u64) -> String {
    if secs >= 3600 && secs.is_multiple_of(3600) {
        format!("{} h", secs / 3600)
    } else if secs >= 60 && secs.is_multiple_of(60) {
        format!("{} min", secs / 60)
    } else {
        format!("{secs} s")
    }
}

/// The note on the first page after start-up, as evidence of its own so every channel shows it.
fn before_lookback_evidence(note: &str, host: &str) -> crate::model::Evidence {
    use crate::model::{StepResult, StepStatus};
    crate::model::Evidence {
        runbook: "startup-lookback".into(),
        meaning: String::new(),
        next_steps: String::new(),
        steps: vec![StepResult {
            name: "older faults at start-up".into(),
            kind: "note".into(),
            target: Vec::new(),
            status: StepStatus::Done { exit_code: None },
            output: format!("{note}\n"),
            bytes_dropped: 0,
            duration_ms: 0,
            notes: vec![note.to_string()],
        }],
        started_ms: now_ms(),
        duration_ms: 0,
        host: host.to_string(),
    }
}

/// New incidents waiting for (or running) their runbook, at most; past this an incident's alert
/// goes out at once without evidence (and says so) rather than queue excerpts without bound.
const MAX_WAITING_RUNBOOKS: usize = 64;

/// How long shutdown waits for runbook tasks to hand their evidence over.
const RUNBOOK_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How long past a runbook's budget its alert stays held, in case the task itself is lost.
const HOLD_GRACE: Duration = Duration::from_secs(15);

impl Emitter {
    /// What the first page after start-up says about the old faults it did not page, once.
    fn before_lookback_note(&self) -> Option<String> {
        if self.before_lookback == 0 || self.told_before_lookback {
            return None;
        }
        let n = self.before_lookback;
        Some(format!(
            "{n} older fault{s} found at start-up (before the {} look-back) {were} recorded, not paged: see xidwatch history",
            lookback_words(self.lookback_secs),
            s = if n == 1 { "" } else { "s" },
            were = if n == 1 { "was" } else { "were" },
        ))
    }

    /// Stops waiting runbooks and lets every task hand its evidence (or its release) over.
    async fn finish(&mut self) {
        let _ = self.stop_runbooks.send(true);
        let drained = tokio::time::timeout(RUNBOOK_SHUTDOWN_GRACE, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("runbook tasks did not finish in time; their alerts go out without evidence after the restart");
            self.tasks.abort_all();
        }
    }

    fn remember(&mut self, seq: u64, ts_usec: u64, text: &str) {
        if self.log.len() == LOG_RING {
            self.log.pop_front();
        }
        self.log.push_back(crate::runbook::LogLine {
            seq: Some(seq),
            ts_usec: Some(ts_usec),
            text: text.to_string(),
        });
    }

    /// Hands every incident over. Waits while the alert stage's queue is full (back-pressure
    /// reaches the kernel log reader); each alert's acknowledgement goes into `acks`.
    async fn emit_all(&mut self, incidents: &mut Vec<Incident>, acks: &mut Acks) {
        if incidents.is_empty() {
            return;
        }
        for inc in incidents.iter() {
            self.tel.record_incident(inc);
            // Counted before any page of the batch goes out: old and recent faults read at
            // start-up are released together, and the page must count all the old ones.
            if inc.before_lookback && inc.phase == crate::model::IncidentPhase::Opened && !inc.test
            {
                self.before_lookback += 1;
            }
        }
        if self.output == Output::Json {
            let mut lock = self.stdout.lock();
            for inc in incidents.iter() {
                let _ = serde_json::to_writer(&mut lock, inc)
                    .map_err(std::io::Error::from)
                    .and_then(|_| lock.write_all(b"\n"));
            }
            let _ = lock.flush();
        }
        while self.tasks.try_join_next().is_some() {}
        let mut groups = host_groups(incidents, &self.env.sysfs_root);
        for inc in incidents.drain(..) {
            let opened = inc.phase == crate::model::IncidentPhase::Opened && !inc.test;
            let (host, members) = match groups.remove(&inc.id) {
                Some(HostRole::Lead(g, members)) => (Some(g), members),
                Some(HostRole::Folded(lead)) => {
                    // Its own incident and history go on; its opening page is the host page.
                    if let Some(p) = &self.pages {
                        p.annotate(&inc);
                    }
                    tracing::info!(
                        "incident {} ({}) opened with others on this host: paged in host page {lead}",
                        inc.id,
                        inc.title
                    );
                    continue;
                }
                None => (None, Vec::new()),
            };
            if inc.before_lookback {
                // An old fault read at start-up: into the history (and status, above), no page.
                if opened {
                    if let Some(p) = &self.pages {
                        p.annotate(&inc);
                    }
                    tracing::info!(
                        "incident {} ({}) was logged before the {} look-back: recorded, not paged",
                        inc.id,
                        inc.title,
                        lookback_words(self.lookback_secs)
                    );
                }
                continue;
            }
            let catalog = Some(catalog_text(&inc));
            let mut evidence = self
                .pages
                .as_ref()
                .map(|p| p.annotate(&inc))
                .unwrap_or_default();
            if opened {
                if let Some(note) = self.before_lookback_note() {
                    self.told_before_lookback = true;
                    evidence.push(before_lookback_evidence(&note, &inc.host));
                }
            }
            let alert = crate::alert::Alert {
                catalog,
                evidence,
                gpu_state: Some(state_doc(&self.tel, inc.pci)),
                incident: inc,
            };
            if !opened {
                acks.submitted(self.alerts.submit(alert, None, None).await);
                continue;
            }
            if self.tasks.len() >= MAX_WAITING_RUNBOOKS {
                tracing::warn!(
                    "{} runbooks waiting: incident {} is alerted without evidence",
                    self.tasks.len(),
                    alert.incident.id
                );
                let note = format!(
                    "no evidence: {} runbooks were already waiting when this incident opened",
                    self.tasks.len()
                );
                acks.submitted(self.alerts.submit_host(alert, None, Some(note), host).await);
                continue;
            }
            // A host page waits for every GPU's runbook; they share the runbook permits, so
            // as many budgets as rounds of them.
            let rounds = (members.len() + 1).div_ceil(self.parallel.max(1)) as u32;
            let hold = self
                .limits
                .max_budget
                .saturating_mul(rounds)
                .saturating_add(HOLD_GRACE);
            acks.submitted(
                self.alerts
                    .submit_host(alert.clone(), Some(hold), None, host)
                    .await,
            );
            self.spawn_runbook(alert, members);
        }
    }

    /// Runs the incident's runbook off the loop and attaches its evidence to the held alert.
    /// For a host page, `members` are the other GPUs' incidents: each one's runbook runs too
    /// (its placeholders are that GPU's), and every GPU's evidence goes on the one page, named
    /// by its GPU.
    fn spawn_runbook(&mut self, mut alert: crate::alert::Alert, members: Vec<Incident>) {
        let lines: Vec<_> = self.log.iter().cloned().collect();
        let subject_of = |inc: &Incident| {
            let first_seq = inc.findings.first().and_then(|f| f.origin.seq);
            let anchor = first_seq.and_then(|s| lines.iter().rposition(|l| l.seq == Some(s)));
            crate::runbook::Subject::from(inc).with_kernel_log(lines.clone(), anchor)
        };
        let grouped = !members.is_empty();
        let subjects: Vec<(Option<crate::model::PciAddress>, crate::runbook::Subject)> =
            std::iter::once(&alert.incident)
                .chain(members.iter())
                .map(|i| (i.pci, subject_of(i)))
                .collect();
        let (set, env, limits, permits, tel, sender) = (
            self.runbooks.clone(),
            self.env.clone(),
            self.limits,
            self.permits.clone(),
            self.tel.clone(),
            self.alerts.clone(),
        );
        let mut stop = self.stop_runbooks.subscribe();
        self.tasks.spawn(async move {
            // Every GPU's runbook at once, each under a permit (so the bound on runbooks
            // running holds), in the group's order.
            let run = futures_util::future::join_all(subjects.iter().map(|(pci, subject)| {
                let (set, env, permits) = (&set, &env, &permits);
                async move {
                    let ev = match permits.clone().acquire_owned().await {
                        Ok(_permit) => set.run_for(subject, env, &limits).await,
                        Err(_) => None,
                    };
                    (*pci, ev)
                }
            }));
            let stopped = async {
                let _ = stop.wait_for(|stop| *stop).await;
            };
            let found = tokio::select! {
                ev = run => ev,
                () = stopped => {
                    tracing::warn!("shutting down: incident {} is alerted without its runbook's evidence", alert.incident.id);
                    let note = "xidwatch stopped while this incident's runbook ran: the alert is sent without its evidence".to_string();
                    if let Err(e) = sender.release(alert.incident.id.clone(), note).await {
                        tracing::debug!("alert stage: {e}");
                    }
                    return;
                }
            };
            let mut runs = Vec::new();
            for (pci, ev) in found {
                let Some(mut ev) = ev else { continue };
                let ok = !ev.steps.iter().any(|s| {
                    matches!(
                        s.status,
                        crate::model::StepStatus::Failed { .. }
                            | crate::model::StepStatus::TimedOut { .. }
                    )
                });
                tel.runbook_run(&ev.runbook, Duration::from_millis(ev.duration_ms), ok);
                if let (true, Some(pci)) = (grouped, pci) {
                    // One page, several GPUs' evidence: each says whose it is.
                    ev.runbook = format!("{} ({pci})", ev.runbook);
                }
                runs.push(ev);
            }
            alert.evidence = health::merge(std::mem::take(&mut alert.evidence), runs);
            if let Err(e) = sender.attach_evidence(alert).await {
                tracing::error!("alert stage: {e}");
            }
        });
    }
}

/// The verdict's word on `pci`'s GPU (the host's for a host-level incident) as of now, the one
/// `status` and `npd-check` would give, for the page.
fn state_doc(
    tel: &Telemetry,
    pci: Option<crate::model::PciAddress>,
) -> crate::alert::gpu_state::GpuStateDoc {
    let judged = tel.with_open(|open, up| crate::verdict::judge_one(open, up, pci));
    crate::alert::gpu_state::GpuStateDoc {
        state: judged.state.as_str().to_string(),
        reasons: judged.reasons.iter().map(|r| r.title.clone()).collect(),
        incidents: judged.incidents,
    }
}

/// What an opening incident is in a host page.
enum HostRole {
    /// It carries the host page, and the other GPUs' incidents, whose runbooks run with its own.
    Lead(crate::alert::document::HostGroup, Vec<Incident>),
    /// Its opening page is folded into the host page with this incident id.
    Folded(String),
}

/// The host pages of a batch, as the engine marked them ([`Incident::host_page`]: the same
/// critical fault opening on several GPUs together): the lead carries the group, the others
/// fold into it. Keyed by incident id. A member whose lead is not in the batch (which the engine
/// never does) is paged on its own rather than lost.
fn host_groups(
    incidents: &[Incident],
    sysfs_root: &std::path::Path,
) -> std::collections::HashMap<String, HostRole> {
    use crate::model::IncidentPhase;
    let opened = |i: &&Incident| i.phase == IncidentPhase::Opened && !i.test;
    let mut members: std::collections::BTreeMap<&str, Vec<&Incident>> = Default::default();
    for inc in incidents.iter().filter(opened) {
        if let Some(lead) = &inc.host_page {
            members.entry(lead.as_str()).or_default().push(inc);
        }
    }
    let mut out = std::collections::HashMap::new();
    for (lead_id, others) in members {
        let Some(lead) = incidents.iter().filter(opened).find(|i| i.id == lead_id) else {
            continue;
        };
        for o in &others {
            out.insert(o.id.clone(), HostRole::Folded(lead.id.clone()));
        }
        let g = crate::alert::document::HostGroup::new(lead, &others, sysfs_root);
        let others = others.into_iter().cloned().collect();
        out.insert(lead.id.clone(), HostRole::Lead(g, others));
    }
    out
}

/// The catalog's words (or, for findings without an Xid, xidwatch's guidance) for an incident.
pub fn catalog_text(inc: &Incident) -> crate::alert::CatalogText {
    use crate::classify::{catalog, guidance};
    let first = inc.findings.first();
    let g = first.map(guidance::for_finding);
    match (inc.kind, inc.xid.and_then(catalog::lookup)) {
        (FindingKind::Xid, Some(e)) => {
            let meaning = |cell: &str| {
                let m: Vec<String> = catalog::bucket_meanings(cell)
                    .iter()
                    .map(|b| b.meaning.to_string())
                    .collect();
                (!m.is_empty()).then(|| m.join(" / "))
            };
            crate::alert::CatalogText {
                mnemonic: e.mnemonic.to_string(),
                summary: e.summary.to_string(),
                causes: e.causes.to_string(),
                check: g.map(|g| g.action).unwrap_or_else(|| e.check.to_string()),
                immediate_bucket: (!e.immediate.is_empty()).then(|| e.immediate.to_string()),
                immediate_meaning: meaning(e.immediate),
                investigatory_bucket: (!e.investigatory.is_empty())
                    .then(|| e.investigatory.to_string()),
                investigatory_meaning: meaning(e.investigatory),
                applies_to: e.applies_to.iter().map(|s| s.to_string()).collect(),
                source: catalog::SOURCE.to_string(),
            }
        }
        _ => {
            let g = g.unwrap_or_else(|| guidance::Guidance {
                meaning: String::new(),
                action: String::new(),
                nvidia: Vec::new(),
            });
            crate::alert::CatalogText {
                mnemonic: inc.kind.as_str().to_string(),
                summary: g.meaning,
                check: g.action,
                ..Default::default()
            }
        }
    }
}

/// Real evidence from this machine for `test-alert`: the checks of the runbook a real Xid 79 gets.
pub async fn test_evidence(config: &Config) -> Vec<crate::model::Evidence> {
    // The runbook a real Xid 79 gets (the one `xidwatch explain 79` names), run without a GPU
    // address: the synthetic GPU does not exist, so steps about one GPU say so and are skipped.
    let mut subject = crate::runbook::Subject::manual(None, Some(79), None);
    if let Some(e) = crate::classify::catalog::lookup(79) {
        subject.category = e.category;
        subject.severity = e.severity;
    }
    let Some(rb) = config.runbook_set.select(&subject) else {
        return Vec::new();
    };
    vec![
        rb.run(&subject, &runbook_env(config), &config.runbook_limits)
            .await,
    ]
}

/// Where runbooks find programs, sysfs and procfs, as the config says.
pub fn runbook_env(config: &Config) -> crate::runbook::RunbookEnv {
    let mut env = config.runbooks.env();
    env.host = alert_host(config.incidents.host.as_deref());
    env.secrets = crate::runbook::Redactor::new(config.alerts.secret_values());
    env
}
