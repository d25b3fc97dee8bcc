//! The daemon (`xidwatch run`): wires sources -> classifier -> incidents -> outputs, keeps the
//! kernel log position, and speaks systemd's notification protocol.
//!
//! Threads: one follows `/dev/kmsg`, one waits on NVML events (both calls block); everything else
//! runs on a single-threaded tokio runtime, so the classifier and the incident engine need no
//! locks. Channels between them are bounded: when the pipeline falls behind, the kmsg thread
//! waits, the kernel ring buffer overwrites, and the loss is reported as an overrun rather than
//! hidden in an ever-growing queue.

pub mod control;
pub mod metrics;
pub mod notify;
pub mod probe;
pub mod serve;
pub mod telemetry;

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use tokio::sync::mpsc;

use crate::classify::{Classifier, LineOrigin};
use crate::config::Config;
use crate::incident::{Engine, EngineConfig, Origin, Persisted};
use crate::model::{Category, Detail, Finding, FindingKind, GpuIdentity, Incident, Severity};
use crate::source::kmsg::follow::{self, KmsgEvent};
use crate::source::nvml::{NvmlEvent, NvmlSource};
use crate::state::{self, Position, StateDir};
use telemetry::{GpuSummary, Telemetry};

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
}

/// How long a multi-line message may wait for its next line before it is reported as it is.
const FOLD_QUIET: Duration = Duration::from_millis(50);
/// How long NVML may take to initialise before xidwatch goes on without it.
const NVML_OPEN_LIMIT: Duration = Duration::from_secs(20);
/// How often the kmsg position is written while records flow.
const POSITION_EVERY: Duration = Duration::from_millis(250);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Saved open incidents, tied to the boot they belong to.
#[derive(serde::Serialize, serde::Deserialize)]
struct SavedIncidents {
    boot_id: String,
    open: Vec<Persisted>,
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
pub async fn run(opts: RunOptions) -> anyhow::Result<()> {
    let cfg = &opts.config;
    let notifier = notify::Notifier::from_env();
    let state = StateDir::open(&cfg.state_dir)?;
    let boot = state::current_boot_id(&opts.boot_id_path)?;
    let boot_hex = state::hex(&boot);
    let position = match state.load_position() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("{e:#}; reading the whole kernel log again");
            None
        }
    };
    let resume_after = position.filter(|p| p.boot_id == boot).map(|p| p.last_seq);
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
    let host = cfg.incidents.host.clone().unwrap_or_else(hostname);

    let mut engine = Engine::new(EngineConfig {
        window_ms: cfg.incidents.window_secs.saturating_mul(1000),
        max_open: cfg.incidents.max_open,
        nvml_match_ms: cfg.incidents.nvml_match_ms,
        host: host.clone(),
        boot_id: boot_hex.clone(),
        overrides: cfg.overrides.clone(),
    });
    match state.load_json::<SavedIncidents>("incidents.json") {
        Ok(Some(saved)) if saved.boot_id == boot_hex => {
            engine.restore(saved.open);
            // Restored once: after a crash, an old snapshot must not come back a second time.
            if let Err(e) = std::fs::remove_file(state.path().join("incidents.json")) {
                tracing::warn!("removing incidents.json after restoring it: {e}");
            }
        }
        Ok(_) => {}
        // Say so, and go on: the kernel log position still prevents duplicates; only the counts
        // of incidents open before the restart start again.
        Err(e) => tracing::warn!("{e:#}; open incidents of the previous run are not restored"),
    }

    let stop = Arc::new(AtomicBool::new(false));
    let (ktx, mut krx) = mpsc::channel::<KmsgEvent>(1024);
    let kfile = follow::open(&cfg.kmsg.path)?;
    let kthread = follow::spawn(
        cfg.kmsg.path.clone(),
        kfile,
        resume_after,
        ktx,
        stop.clone(),
    )
    .context("starting the kernel log reader")?;
    match resume_after {
        Some(seq) => tracing::info!("kernel log: resuming after record {seq} of this boot"),
        None => {
            tracing::info!("kernel log: first start in this boot, reading the whole buffer once")
        }
    }

    let mut classifier = Classifier::new();
    let mut stats = SourceStats::default();
    let mut out_buf: Vec<Incident> = Vec::new();
    let mut findings: Vec<Finding> = Vec::new();

    // NVML, on its own thread; failures become findings, said once.
    let (ntx, mut nrx) = mpsc::channel::<NvmlEvent>(256);
    let mut nvml_source: Option<NvmlSource> = None;
    if cfg.nvml.enabled {
        let lib = cfg.nvml.library.clone();
        // NVML can hang on a wedged GPU: wait a bounded time, then go on without it, so the
        // kernel log is watched (and READY=1 sent) whatever the driver does.
        let (otx, orx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("nvml-open".into())
            .spawn(move || {
                let _ = otx.send(NvmlSource::open(lib.as_deref()));
            })
            .context("starting NVML")?;
        let opened = match tokio::time::timeout(NVML_OPEN_LIMIT, orx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(crate::source::nvml::NvmlFailure::Other(
                "NVML start-up thread ended".into(),
            )),
            Err(_) => Err(crate::source::nvml::NvmlFailure::Other(format!(
                "NVML did not answer within {} s (a wedged GPU or driver)",
                NVML_OPEN_LIMIT.as_secs()
            ))),
        };
        match opened {
            Ok(src) => {
                for g in src.inventory() {
                    classifier.learn_gpu(
                        g.pci,
                        GpuIdentity {
                            index: Some(g.index),
                            uuid: g.uuid.clone(),
                            serial: g.serial.clone(),
                            name: g.name.clone(),
                        },
                    );
                }
                if let Some(v) = src.driver_version() {
                    classifier.set_driver_version(v);
                }
                stats.nvml_up = true;
                stats.gpus_seen = src.inventory().len();
                tel.set_nvml(true, "ok");
                tel.set_gpus(src.inventory().iter().map(GpuSummary::from).collect());
                tracing::info!(
                    "NVML: {} GPU(s), driver {}",
                    src.inventory().len(),
                    src.driver_version().unwrap_or("?")
                );
                nvml_source = Some(src.clone());
                let (stx, srx) = std::sync::mpsc::sync_channel::<NvmlEvent>(256);
                let stop2 = stop.clone();
                let spawned =
                    tokio::task::spawn_blocking(move || src.spawn_events(stx, stop2)).await;
                match spawned {
                    Ok(Ok(t)) => {
                        for n in t.notes {
                            tracing::warn!("NVML: {n}");
                        }
                    }
                    Ok(Err(e)) => tracing::warn!("NVML events unavailable: {e}"),
                    Err(e) => tracing::warn!("NVML events unavailable: {e}"),
                }
                std::thread::Builder::new()
                    .name("nvml-bridge".into())
                    .spawn(move || {
                        while let Ok(ev) = srx.recv() {
                            if ntx.blocking_send(ev).is_err() {
                                break;
                            }
                        }
                    })
                    .context("starting the NVML bridge")?;
            }
            Err(failure) => {
                tracing::warn!(
                    "NVML unavailable: {}; watching the kernel log only",
                    failure.describe()
                );
                tel.set_nvml(false, &failure.describe());
                if let Some(f) = failure.to_finding() {
                    push(
                        &tel,
                        &mut engine,
                        f,
                        Origin::Nvml,
                        now_ms(),
                        true,
                        &mut out_buf,
                    );
                }
            }
        }
    }
    let mut probe = probe::Probe::new(cfg.nvml.sysfs_root.clone());
    let mut probe_timer = tokio::time::interval(Duration::from_secs(cfg.nvml.probe_interval_secs));
    probe_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("installing the SIGINT handler")?;
    let watchdog_every = notifier.watchdog_every.unwrap_or(Duration::from_secs(3600));
    let mut watchdog = tokio::time::interval(watchdog_every);

    // Runbook `nvml` steps are answered through the same NVML handle.
    let nvml_probe: Option<Arc<dyn crate::runbook::NvmlProbe>> = nvml_source
        .clone()
        .map(|s| Arc::new(s) as Arc<dyn crate::runbook::NvmlProbe>);
    let mut alerts = AlertStage::start(cfg, opts.output)?;
    set_alert_provider(&tel, &alerts);
    let (ops_shutdown, ops_rx) = tokio::sync::watch::channel(false);
    let metrics_settings = cfg.metrics.validate().map_err(|e| anyhow::anyhow!(e))?;
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
    match control::bind_status_socket(&control::socket_path(&cfg.state_dir)) {
        Ok(sock) => {
            tokio::spawn(control::serve_status_on(sock, tel.clone(), ops_rx.clone()));
        }
        Err(e) => {
            tracing::warn!("status socket unavailable ({e:#}); `xidwatch status` reads status.json")
        }
    }
    let mut status_timer = tokio::time::interval(control::STATUS_FILE_INTERVAL);
    let mut current = cfg.clone();
    let mut sighup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    let (reload_tx, mut reload_rx) = mpsc::channel::<()>(1);
    // Held for as long as the loop runs: dropping it stops the watching.
    let mut _watcher = watch_config(cfg, reload_tx.clone());
    let mut last_reload_error: Option<String> = None;

    notifier.notify("READY=1");
    tracing::info!(
        "xidwatch watching {} (state in {})",
        cfg.kmsg.path.display(),
        cfg.state_dir.display()
    );

    let mut out = Emitter {
        output: opts.output,
        stdout: std::io::stdout(),
        alerts: alerts.sender(),
        runbooks: cfg.runbook_set.clone(),
        env: {
            let mut env = runbook_env(cfg);
            env.nvml = nvml_probe.clone();
            env
        },
        limits: cfg.runbook_limits,
        permits: Arc::new(tokio::sync::Semaphore::new(
            cfg.runbooks.max_parallel_runbooks(),
        )),
        log: std::collections::VecDeque::with_capacity(LOG_RING),
        tel: tel.clone(),
        tasks: tokio::task::JoinSet::new(),
        inflight: Arc::default(),
        stop_runbooks: tokio::sync::watch::channel(false).0,
    };
    out.emit_all(&mut out_buf).await;
    let mut last_seq: Option<u64> = resume_after;
    let mut saved_seq: Option<u64> = resume_after;
    let mut last_save = tokio::time::Instant::now();
    let mut last_record = tokio::time::Instant::now();
    let mut caught_up = false;

    loop {
        let deadline = engine
            .next_deadline()
            .map(|d| d.saturating_sub(now_ms()))
            .unwrap_or(3_600_000);
        let fold_wait = if classifier.has_pending() {
            FOLD_QUIET
        } else {
            Duration::from_secs(3600)
        };
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
                let now = now_ms();
                for ev in batch {
                    match ev {
                        KmsgEvent::Record { rec, at_startup } => {
                            stats.kmsg_records += 1;
                            tel.kmsg_records(1);
                            last_seq = Some(rec.seq);
                            if !rec.is_kernel() && !current.kmsg.accept_userspace {
                                stats.kmsg_userspace_ignored += 1;
                                tel.kmsg_userspace_ignored(1);
                                continue;
                            }
                            let at = LineOrigin { line: 0, seq: Some(rec.seq), ts_usec: Some(rec.ts_usec), timestamp: Some(format!("[{:>5}.{:06}]", rec.ts_usec / 1_000_000, rec.ts_usec % 1_000_000)) };
                            for line in rec.lines() {
                                out.remember(rec.seq, rec.ts_usec, line);
                                if crate::classify::prefix::message_start(line) == Some(0) {
                                    classifier.push(line, &at, &mut findings);
                                }
                            }
                            for f in findings.drain(..) {
                                push(&tel, &mut engine, f, Origin::Kmsg, now, at_startup, &mut out_buf);
                            }
                        }
                        KmsgEvent::Overrun { lost, next_seq, at_startup } => {
                            stats.kmsg_lost += lost;
                            tel.kmsg_lost(lost);
                            tracing::warn!("kernel log overrun: {lost} records lost before record {next_seq}");
                            push(&tel, &mut engine, overrun_finding(lost, next_seq), Origin::Kmsg, now, at_startup, &mut out_buf);
                        }
                        KmsgEvent::Malformed(why) => {
                            stats.kmsg_malformed += 1;
                            tel.kmsg_malformed(1);
                            if stats.kmsg_malformed <= 10 || stats.kmsg_malformed.is_power_of_two() {
                                tracing::warn!("kernel log: skipped a malformed record ({why}); {} so far", stats.kmsg_malformed);
                            }
                        }
                        KmsgEvent::CaughtUp => {
                            if !caught_up {
                                caught_up = true;
                                tracing::info!("kernel log: caught up ({} records read at start-up)", stats.kmsg_records);
                            }
                        }
                        KmsgEvent::Failed(why) => {
                            anyhow::bail!("kernel log reader stopped: {why}");
                        }
                    }
                }
                last_record = tokio::time::Instant::now();
                let opened = !out_buf.is_empty();
                out.emit_all(&mut out_buf).await;
                // Move the position promptly after an incident, otherwise at a steady pace.
                let ckpt = out.checkpoint(last_seq);
                if (opened || last_save.elapsed() >= POSITION_EVERY) && ckpt != saved_seq {
                    save_position(&state, &tel, boot, ckpt, &mut saved_seq);
                    last_save = tokio::time::Instant::now();
                }
            }
            ev = nrx.recv(), if nvml_source.is_some() => {
                if let Some(ev) = ev {
                    let inv = nvml_source.as_ref().map(|s| s.inventory().to_vec()).unwrap_or_default();
                    if let NvmlEvent::Failed(f) = &ev {
                        tracing::warn!("NVML: {}", f.describe());
                        stats.nvml_up = false;
                        tel.set_nvml(false, &f.describe());
                    }
                    let mut f = ev.to_finding(&inv);
                    if f.kind == FindingKind::Xid {
                        crate::classify::catalog::apply_to(&mut f);
                    }
                    push(&tel, &mut engine, f, Origin::Nvml, now_ms(), false, &mut out_buf);
                    out.emit_all(&mut out_buf).await;
                }
            }
            _ = tokio::time::sleep(fold_wait.saturating_sub(last_record.elapsed())), if classifier.has_pending() => {
                classifier.flush(&mut findings);
                let now = now_ms();
                for f in findings.drain(..) {
                    push(&tel, &mut engine, f, Origin::Kmsg, now, false, &mut out_buf);
                }
                out.emit_all(&mut out_buf).await;
            }
            _ = tokio::time::sleep(Duration::from_millis(deadline)) => {
                engine.tick(now_ms(), &mut out_buf);
                out.emit_all(&mut out_buf).await;
            }
            _ = probe_timer.tick() => {
                let reachable = nvml_source.as_ref().and_then(|s| s.reachable_gpus().ok());
                for mut f in probe.check(reachable.as_deref()) {
                    // What NVML told us about this GPU when it could still see it.
                    if let Some(g) = nvml_source.as_ref().and_then(|s| s.inventory().iter().find(|g| Some(g.pci) == f.pci)) {
                        f.gpu = GpuIdentity { index: Some(g.index), uuid: g.uuid.clone(), serial: g.serial.clone(), name: g.name.clone() };
                    }
                    push(&tel, &mut engine, f, Origin::Probe, now_ms(), false, &mut out_buf);
                }
                out.emit_all(&mut out_buf).await;
            }
            _ = status_timer.tick() => {
                // Runbooks finish between records: let the position catch up.
                let ckpt = out.checkpoint(last_seq);
                if ckpt != saved_seq {
                    save_position(&state, &tel, boot, ckpt, &mut saved_seq);
                }
                tel.set_open_incidents_from(engine.open_incidents());
                let (dir, snap) = (cfg.state_dir.clone(), tel.snapshot());
                tokio::task::spawn_blocking(move || {
                    if let Err(e) = control::write_status_file(&dir, &snap) {
                        tracing::warn!("{e:#}");
                    }
                });
            }
            _ = watchdog.tick() => {
                notifier.notify("WATCHDOG=1");
                let ckpt = out.checkpoint(last_seq);
                if ckpt != saved_seq {
                    save_position(&state, &tel, boot, ckpt, &mut saved_seq);
                }
            }
            _ = sighup.recv() => {
                reload(&opts, &mut current, &mut engine, &mut out, &mut alerts, &mut last_reload_error, &mut out_buf).await;
                // The runbook directories may have changed (or appeared): watch what is in force now.
                _watcher = watch_config(&current, reload_tx.clone());
                out.emit_all(&mut out_buf).await;
            }
            Some(()) = reload_rx.recv() => {
                // Editors write a file in several steps: let them finish.
                tokio::time::sleep(Duration::from_millis(300)).await;
                while reload_rx.try_recv().is_ok() {}
                reload(&opts, &mut current, &mut engine, &mut out, &mut alerts, &mut last_reload_error, &mut out_buf).await;
                // The runbook directories may have changed (or appeared): watch what is in force now.
                _watcher = watch_config(&current, reload_tx.clone());
                out.emit_all(&mut out_buf).await;
            }
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
        }
    }

    // Graceful shutdown: stop the sources, keep what is in flight.
    notifier.notify("STOPPING=1");
    stop.store(true, Ordering::Relaxed);
    classifier.flush(&mut findings);
    for f in findings.drain(..) {
        push(
            &tel,
            &mut engine,
            f,
            Origin::Kmsg,
            now_ms(),
            false,
            &mut out_buf,
        );
    }
    out.emit_all(&mut out_buf).await;
    // Runbooks still running give up; their alerts go out without evidence rather than not at all.
    out.finish().await;
    let ckpt = out.checkpoint(last_seq);
    save_position(&state, &tel, boot, ckpt, &mut saved_seq);
    state
        .save_json(
            "incidents.json",
            &SavedIncidents {
                boot_id: boot_hex,
                open: engine.snapshot(),
            },
        )
        .context("saving open incidents")?;
    drop(krx);
    let _ = kthread.join();
    drop(out);
    alerts.stop().await;
    let _ = ops_shutdown.send(true);
    tel.set_open_incidents_from(engine.open_incidents());
    let mut last = tel.snapshot();
    last.stopped_ms = Some(now_ms());
    if let Err(e) = control::write_status_file(&cfg.state_dir, &last) {
        tracing::warn!("{e:#}");
    }
    tracing::info!(
        "stopped: {} records read, {} lost, {} userspace ignored, {} malformed; {} incidents open",
        stats.kmsg_records,
        stats.kmsg_lost,
        stats.kmsg_userspace_ignored,
        stats.kmsg_malformed,
        engine.open_count()
    );
    Ok(())
}

/// Counts a finding for metrics and status, then hands it to the incident engine.
fn push(
    tel: &Telemetry,
    engine: &mut Engine,
    f: Finding,
    origin: Origin,
    now: u64,
    at_startup: bool,
    out: &mut Vec<Incident>,
) {
    tel.record_finding(&f);
    engine.push(f, origin, now, at_startup, out);
}

fn save_position(
    state: &StateDir,
    tel: &Telemetry,
    boot: [u8; 16],
    last_seq: Option<u64>,
    saved: &mut Option<u64>,
) {
    let Some(seq) = last_seq else { return };
    tel.set_kmsg_position(&state::hex(&boot), seq);
    match state.save_position(&Position {
        boot_id: boot,
        last_seq: seq,
    }) {
        Ok(()) => *saved = Some(seq),
        Err(e) => tracing::error!("{e:#}"),
    }
}

fn overrun_finding(lost: u64, next_seq: u64) -> Finding {
    let mut f = Finding::new(
        FindingKind::KmsgOverrun,
        Severity::Warning,
        Category::Informational,
        format!("kernel log overrun: {lost} records lost"),
    );
    f.message = format!("{lost} kernel log records were lost before record {next_seq}; faults in them may have been missed");
    f.detail = Some(Detail::Overrun { lost });
    f.origin.seq = Some(next_seq);
    f
}

fn set_alert_provider(tel: &Telemetry, alerts: &AlertStage) {
    match alerts.sender() {
        Some(s) => tel.set_alert_status_provider(Some(Arc::new(move || s.status()))),
        None => tel.set_alert_status_provider(None),
    }
}

/// The alert stage as the daemon runs it: restarted whole when a reload changes the channels
/// (the outbox on disk carries what was not delivered yet).
struct AlertStage {
    running: Option<(crate::alert::AlertSender, tokio::task::JoinHandle<()>)>,
    shutdown: tokio::sync::watch::Sender<bool>,
}

impl AlertStage {
    fn start(cfg: &Config, output: Output) -> anyhow::Result<AlertStage> {
        // With --json, standard output belongs to the incident stream.
        let mut alert_cfg = cfg.alerts.clone();
        if output == Output::Json {
            alert_cfg.stdout.enabled = Some(false);
        }
        for w in alert_cfg.secret_warnings(cfg.source.as_deref()) {
            tracing::warn!("{w}");
        }
        let (shutdown, rx) = tokio::sync::watch::channel(false);
        let running = if alert_cfg.channels().is_empty() {
            None
        } else {
            Some(
                crate::alert::Dispatcher::start(&alert_cfg, &cfg.state_dir, rx)
                    .map_err(|e| anyhow::anyhow!("starting the alert stage: {e}"))?,
            )
        };
        Ok(AlertStage { running, shutdown })
    }

    fn sender(&self) -> Option<crate::alert::AlertSender> {
        self.running.as_ref().map(|(s, _)| s.clone())
    }

    async fn stop(self) {
        let _ = self.shutdown.send(true);
        if let Some((sender, handle)) = self.running {
            drop(sender);
            // The outbox keeps whatever is not delivered yet; give in-flight sends a moment.
            let _ = tokio::time::timeout(Duration::from_secs(5), handle).await;
        }
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
    alerts: &mut AlertStage,
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
                let mut f = Finding::new(
                    FindingKind::ConfigRejected,
                    Severity::Warning,
                    Category::Informational,
                    "config reload refused: the previous config stays in force".into(),
                );
                f.message = text;
                out.tel.record_finding(&f);
                engine.push(f, Origin::Probe, now_ms(), false, out_buf);
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
    );
    out.runbooks = new.runbook_set.clone();
    let nvml = out.env.nvml.take();
    out.env = runbook_env(&new);
    out.env.nvml = nvml;
    out.limits = new.runbook_limits;
    out.permits = Arc::new(tokio::sync::Semaphore::new(
        new.runbooks.max_parallel_runbooks(),
    ));
    match AlertStage::start(&new, opts.output) {
        Ok(stage) => {
            let old = std::mem::replace(alerts, stage);
            old.stop().await;
            out.alerts = alerts.sender();
        }
        Err(e) => tracing::error!("alert stage not restarted, keeping the old channels: {e:#}"),
    }
    // Settings that need a restart keep their old values until then.
    let mut applied = new;
    applied.kmsg.path = current.kmsg.path.clone();
    applied.state_dir = current.state_dir.clone();
    applied.nvml = current.nvml.clone();
    applied.incidents.host = current.incidents.host.clone();
    applied.metrics = current.metrics.clone();
    *current = applied;
    out.tel.set_xid_overrides(current.overrides.clone());
    out.tel.config_reloaded(true, now_ms());
    set_alert_provider(&out.tel, alerts);
    tracing::info!("config reloaded from {}", path.display());
}

/// Kernel log lines kept for runbook excerpts ("the kernel log around the incident").
const LOG_RING: usize = 2000;

/// Hands incidents on: JSON on standard output with `--json`; to the runbooks and then the alert
/// stage. A new incident gets its runbook (bounded concurrency, off the processing loop); a digest
/// goes straight to the alert stage, so a storm never runs a runbook per line.
struct Emitter {
    output: Output,
    stdout: std::io::Stdout,
    alerts: Option<crate::alert::AlertSender>,
    runbooks: Arc<crate::runbook::RunbookSet>,
    env: crate::runbook::RunbookEnv,
    limits: crate::runbook::RunLimits,
    permits: Arc<tokio::sync::Semaphore>,
    log: std::collections::VecDeque<crate::runbook::LogLine>,
    tel: Arc<Telemetry>,
    /// Runbooks running for new incidents; their alerts are not in the outbox yet.
    tasks: tokio::task::JoinSet<()>,
    /// First kernel log sequence number of each incident whose alert waits for its runbook.
    /// The saved position never moves past them, so a crash meanwhile re-reads the record and
    /// the incident (same id) is opened and alerted again rather than lost.
    inflight: Arc<std::sync::Mutex<std::collections::BTreeMap<u64, usize>>>,
    /// Tells running runbooks to give up (shutdown).
    stop_runbooks: tokio::sync::watch::Sender<bool>,
}

/// New incidents waiting for (or running) their runbook, at most.
const MAX_WAITING_RUNBOOKS: usize = 64;

/// How long shutdown waits for runbook tasks to hand their alerts over.
const RUNBOOK_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

fn lock_inflight(
    m: &std::sync::Mutex<std::collections::BTreeMap<u64, usize>>,
) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<u64, usize>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Emitter {
    /// The position that may be saved: `last_seq`, or just before the first record of an
    /// incident whose alert is still waiting for its runbook.
    fn checkpoint(&self, last_seq: Option<u64>) -> Option<u64> {
        match lock_inflight(&self.inflight).keys().next() {
            Some(&first) => {
                let before = first.checked_sub(1)?;
                last_seq.map(|l| l.min(before))
            }
            None => last_seq,
        }
    }

    /// Stops waiting runbooks and lets every task hand its alert over.
    async fn finish(&mut self) {
        let _ = self.stop_runbooks.send(true);
        let drained = tokio::time::timeout(RUNBOOK_SHUTDOWN_GRACE, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("runbook tasks did not finish in time; their incidents are re-read at the next start");
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

    async fn emit_all(&mut self, incidents: &mut Vec<Incident>) {
        if incidents.is_empty() {
            return;
        }
        for inc in incidents.iter() {
            self.tel.record_incident(inc);
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
        for inc in incidents.drain(..) {
            let Some(sender) = self.alerts.clone() else {
                continue;
            };
            let catalog = Some(catalog_text(&inc));
            if inc.phase != crate::model::IncidentPhase::Opened || inc.test {
                let alert = crate::alert::Alert {
                    catalog,
                    incident: inc,
                    evidence: Vec::new(),
                };
                if let Err(e) = sender.send(alert).await {
                    tracing::error!("alert stage: {e}");
                }
                continue;
            }
            if self.tasks.len() >= MAX_WAITING_RUNBOOKS {
                // More new incidents than runbooks can keep up with: alert now, without evidence,
                // rather than queue tasks (each holding a log excerpt) without bound.
                tracing::warn!(
                    "{} runbooks waiting: incident {} is alerted without evidence",
                    self.tasks.len(),
                    inc.id
                );
                let alert = crate::alert::Alert {
                    catalog,
                    incident: inc,
                    evidence: Vec::new(),
                };
                if let Err(e) = sender.send(alert).await {
                    tracing::error!("alert stage: {e}");
                }
                continue;
            }
            let lines: Vec<_> = self.log.iter().cloned().collect();
            let first_seq = inc.findings.first().and_then(|f| f.origin.seq);
            let anchor = first_seq.and_then(|s| lines.iter().rposition(|l| l.seq == Some(s)));
            let subject = crate::runbook::Subject::from(&inc).with_kernel_log(lines, anchor);
            let (set, env, limits, permits, tel) = (
                self.runbooks.clone(),
                self.env.clone(),
                self.limits,
                self.permits.clone(),
                self.tel.clone(),
            );
            let inflight = self.inflight.clone();
            if let Some(seq) = first_seq {
                *lock_inflight(&inflight).entry(seq).or_default() += 1;
            }
            let mut stop = self.stop_runbooks.subscribe();
            self.tasks.spawn(async move {
                let run = async {
                    match permits.acquire_owned().await {
                        Ok(_permit) => set.run_for(&subject, &env, &limits).await,
                        Err(_) => None,
                    }
                };
                let evidence: Vec<crate::model::Evidence> = tokio::select! {
                    ev = run => ev.into_iter().collect(),
                    _ = stop.wait_for(|stop| *stop) => {
                        tracing::warn!("shutting down: incident {} is alerted without its runbook's evidence", inc.id);
                        Vec::new()
                    }
                };
                for ev in &evidence {
                    let ok = !ev.steps.iter().any(|s| {
                        matches!(
                            s.status,
                            crate::model::StepStatus::Failed { .. }
                                | crate::model::StepStatus::TimedOut { .. }
                        )
                    });
                    tel.runbook_run(&ev.runbook, Duration::from_millis(ev.duration_ms), ok);
                }
                let alert = crate::alert::Alert {
                    catalog,
                    incident: inc,
                    evidence,
                };
                if let Err(e) = sender.send(alert).await {
                    tracing::error!("alert stage: {e}");
                }
                if let Some(seq) = first_seq {
                    let mut m = lock_inflight(&inflight);
                    if let Some(n) = m.get_mut(&seq) {
                        *n -= 1;
                        if *n == 0 {
                            m.remove(&seq);
                        }
                    }
                }
            });
        }
    }
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

/// Real evidence from this machine for `test-alert`: the fallback runbook's checks.
pub async fn test_evidence(config: &Config) -> Vec<crate::model::Evidence> {
    let Some(rb) = config.runbook_set.fallback() else {
        return Vec::new();
    };
    let subject = crate::runbook::Subject::manual(None, None, None);
    vec![
        rb.run(&subject, &runbook_env(config), &config.runbook_limits)
            .await,
    ]
}

/// Where runbooks find programs, sysfs and procfs, as the config says.
pub fn runbook_env(config: &Config) -> crate::runbook::RunbookEnv {
    let mut env = config.runbooks.env();
    env.host = config.incidents.host.clone().unwrap_or_else(hostname);
    env.secrets = crate::runbook::Redactor::new(config.alerts.secret_values());
    env
}

/// This machine's name, for alerts.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}
