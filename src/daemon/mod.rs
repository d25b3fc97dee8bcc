//! The daemon (`xidwatch run`): wires sources -> classifier -> incidents -> outputs, keeps the
//! kernel log position, and speaks systemd's notification protocol.
//!
//! Threads: one follows `/dev/kmsg`, one owns NVML and makes every NVML call (both block; see
//! [`nvml`]); everything else runs on a single-threaded tokio runtime, so the classifier and the
//! incident engine need no locks. Channels between them are bounded: when the pipeline falls
//! behind, the kmsg thread waits, the kernel ring buffer overwrites, and the loss is reported as an
//! overrun rather than hidden in an ever-growing queue.

pub mod control;
pub mod metrics;
pub mod notify;
pub mod health;
pub mod nvml;
pub mod probe;
pub mod serve;
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
use crate::host::hostname;
use crate::incident::{Engine, EngineConfig, Origin, Persisted};
use crate::model::{Detail, Finding, FindingKind, Incident};
use crate::source::kmsg::follow::{self, KmsgEvent};
use crate::state::{self, Position, StateDir};
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
}

/// How long a multi-line message may wait for its next line before it is reported as it is.
const FOLD_QUIET: Duration = Duration::from_millis(50);
/// How often the kmsg position is written while records flow.
const POSITION_EVERY: Duration = Duration::from_millis(250);

fn now_ms() -> u64 {
    crate::clock::wall_ms()
}

/// The checkpoint: open incidents, the lost-GPU probe's memory and the kernel log record they
/// account for, tied to the boot they belong to. Written as one file, so after a crash the
/// incidents restored and the records read again never overlap.
#[derive(serde::Serialize, serde::Deserialize)]
struct SavedIncidents {
    boot_id: String,
    open: Vec<Persisted>,
    /// The last kernel log record the snapshot includes.
    #[serde(default)]
    last_seq: Option<u64>,
    #[serde(default)]
    probe: Option<probe::Memory>,
}

/// Where the checkpoint is.
const CHECKPOINT: &str = "incidents.json";

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
    let mut resume_after = position.filter(|p| p.boot_id == boot).map(|p| p.last_seq);
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
    let mut probe_memory: Option<probe::Memory> = None;
    match state.load_json::<SavedIncidents>(CHECKPOINT) {
        Ok(Some(saved)) if saved.boot_id == boot_hex => {
            engine.restore(saved.open);
            probe_memory = saved.probe;
            // The snapshot accounts for every record up to its own position: go on from there,
            // so nothing is counted twice (the position file is only a fallback).
            if saved.last_seq.is_some() {
                resume_after = saved.last_seq;
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

    // NVML, on its own worker thread; the kernel log waits for its init at most
    // nvml.call_timeout_secs (capped at nvml::NVML_OPEN_LIMIT). Failures become findings, said
    // once.
    let (mut nvml_link, nvml_now) =
        nvml::start(cfg, &tel, &mut classifier, &mut stats, probe_memory, &boot_hex).await?;
    for f in nvml_now {
        push(
            &tel,
            &mut engine,
            f,
            Origin::Nvml,
            Now::read(),
            true,
            &mut out_buf,
        );
    }

    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("installing the SIGINT handler")?;
    let watchdog_every = notifier.watchdog_every.unwrap_or(Duration::from_secs(3600));
    let mut watchdog = tokio::time::interval(watchdog_every);

    // Runbook `nvml` steps are answered through the NVML worker, under its deadline.
    let nvml_probe = nvml_link.probe_handle();
    let alerts = AlertStage::start(cfg, opts.output)?;
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
    let mut fingerprint = Fingerprint::of(cfg);

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
        stop_runbooks: tokio::sync::watch::channel(false).0,
        pages: nvml_link.pages(),
    };
    let mut acks = Acks::default();
    let mut ckpt = Checkpointer {
        state: state.clone(),
        boot,
        boot_hex: boot_hex.clone(),
        saved_seq: resume_after,
        saved_changes: engine.changes(),
        saved_probe: probe::Memory::default(),
        last_save: tokio::time::Instant::now(),
        errors: 0,
    };
    out.emit_all(&mut out_buf, &mut acks).await;
    let mut last_seq: Option<u64> = resume_after;
    let mut last_record = tokio::time::Instant::now();
    let mut caught_up = false;

    loop {
        let deadline = engine
            .next_deadline()
            .map(|d| d.saturating_sub(crate::clock::mono_ms()))
            .unwrap_or(3_600_000);
        let save_at = ckpt.due_at(&acks, last_seq, &engine);
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
                let now = Now::read();
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
                        KmsgEvent::SequenceAnomaly { anomaly, at_startup } => {
                            // Counted; reported once as a finding, later ones sparingly in the log.
                            tel.kmsg_out_of_sequence(1);
                            if anomaly.count == 1 {
                                tracing::warn!("kernel log: {anomaly}; later records are still read");
                                push(&tel, &mut engine, sequence_finding(&anomaly), Origin::Kmsg, now, at_startup, &mut out_buf);
                            } else if anomaly.count <= 10 || anomaly.count.is_power_of_two() {
                                tracing::warn!("kernel log: {anomaly}; {} records out of sequence so far", anomaly.count);
                            }
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
                out.emit_all(&mut out_buf, &mut acks).await;
                // Move the position promptly after an alert, otherwise at a steady pace.
                ckpt.save(&mut acks, last_seq, &engine, &nvml_link.probe_memory, &tel, false).await;
            }
            Some(msg) = nvml_link.next() => {
                for (f, origin) in nvml_link.handle(msg, &tel, &mut classifier, &mut stats) {
                    push(&tel, &mut engine, f, origin, Now::read(), false, &mut out_buf);
                }
                out.emit_all(&mut out_buf, &mut acks).await;
                // The probe's memory is part of the checkpoint: save it promptly when it moved.
                let moved = nvml_link.probe_memory != ckpt.saved_probe;
                ckpt.save(&mut acks, last_seq, &engine, &nvml_link.probe_memory, &tel, moved).await;
            }
            _ = tokio::time::sleep(fold_wait.saturating_sub(last_record.elapsed())), if classifier.has_pending() => {
                classifier.flush(&mut findings);
                let now = Now::read();
                for f in findings.drain(..) {
                    push(&tel, &mut engine, f, Origin::Kmsg, now, false, &mut out_buf);
                }
                out.emit_all(&mut out_buf, &mut acks).await;
                ckpt.save(&mut acks, last_seq, &engine, &nvml_link.probe_memory, &tel, false).await;
            }
            _ = tokio::time::sleep(Duration::from_millis(deadline)) => {
                engine.tick(Now::read(), &mut out_buf);
                out.emit_all(&mut out_buf, &mut acks).await;
                ckpt.save(&mut acks, last_seq, &engine, &nvml_link.probe_memory, &tel, false).await;
            }
            _ = status_timer.tick() => {
                ckpt.save(&mut acks, last_seq, &engine, &nvml_link.probe_memory, &tel, false).await;
                tel.set_open_incidents_from(engine.open_incidents());
                let (dir, snap) = (cfg.state_dir.clone(), tel.snapshot());
                tokio::task::spawn_blocking(move || {
                    if let Err(e) = control::write_status_file(&dir, &snap) {
                        state::log_write_error("status", &format!("{e:#}"));
                    }
                });
            }
            _ = watchdog.tick() => {
                notifier.notify("WATCHDOG=1");
                ckpt.save(&mut acks, last_seq, &engine, &nvml_link.probe_memory, &tel, false).await;
            }
            _ = sighup.recv() => {
                reload(&opts, &mut current, &mut engine, &mut out, &mut last_reload_error, &mut out_buf).await;
                fingerprint = Fingerprint::of(&current);
                // The runbook directories may have changed (or appeared): watch what is in force now.
                _watcher = watch_config(&current, reload_tx.clone());
                out.emit_all(&mut out_buf, &mut acks).await;
                ckpt.save(&mut acks, last_seq, &engine, &nvml_link.probe_memory, &tel, false).await;
            }
            Some(()) = reload_rx.recv() => {
                // Editors write a file in several steps: let them finish.
                tokio::time::sleep(Duration::from_millis(300)).await;
                while reload_rx.try_recv().is_ok() {}
                // Only a real change of what is in force reloads: not a stray file, not a save
                // without edits.
                let now = Fingerprint::of(&current);
                if now != fingerprint {
                    reload(&opts, &mut current, &mut engine, &mut out, &mut last_reload_error, &mut out_buf).await;
                    fingerprint = Fingerprint::of(&current);
                    // The runbook directories may have changed (or appeared): watch what is in force now.
                    _watcher = watch_config(&current, reload_tx.clone());
                    out.emit_all(&mut out_buf, &mut acks).await;
                    ckpt.save(&mut acks, last_seq, &engine, &nvml_link.probe_memory, &tel, false).await;
                }
            }
            _ = tokio::time::sleep_until(save_at.unwrap_or_else(tokio::time::Instant::now)), if save_at.is_some() => {
                ckpt.save(&mut acks, last_seq, &engine, &nvml_link.probe_memory, &tel, false).await;
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
    classifier.flush(&mut findings);
    for f in findings.drain(..) {
        push(
            &tel,
            &mut engine,
            f,
            Origin::Kmsg,
            Now::read(),
            false,
            &mut out_buf,
        );
    }
    out.emit_all(&mut out_buf, &mut acks).await;
    // Runbooks still running give up; their alerts go out without evidence rather than not at all.
    out.finish().await;
    if !ckpt
        .save(
            &mut acks,
            last_seq,
            &engine,
            &probe_memory,
            &tel,
            true,
        )
        .await
    {
        tracing::warn!("some alerts were not written to the outbox in time; the kernel log position stays before them and they are raised again at the next start");
    }
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
    now: impl Into<Now>,
    at_startup: bool,
    out: &mut Vec<Incident>,
) {
    tel.record_finding(&f);
    engine.push(f, origin, now, at_startup, out);
}

/// Writes the checkpoint (open incidents, probe memory, the record they account for) and the
/// kernel log position, only once every alert handed over is durable.
struct Checkpointer {
    state: StateDir,
    boot: [u8; 16],
    boot_hex: String,
    saved_seq: Option<u64>,
    saved_changes: u64,
    saved_probe: probe::Memory,
    last_save: tokio::time::Instant,
    errors: u64,
}

/// The shortest time between two checkpoints, however many alerts arrive.
const SAVE_GAP: Duration = Duration::from_millis(100);

impl Checkpointer {
    /// When the loop must call [`Checkpointer::save`] even if nothing else happens.
    fn due_at(
        &self,
        acks: &Acks,
        last_seq: Option<u64>,
        engine: &Engine,
    ) -> Option<tokio::time::Instant> {
        let changed = last_seq != self.saved_seq || engine.changes() != self.saved_changes;
        if acks.since_save {
            Some(self.last_save + SAVE_GAP)
        } else if changed {
            Some(self.last_save + POSITION_EVERY)
        } else {
            None
        }
    }

    /// Saves when something changed and either an alert was handed over since the last save,
    /// `force`, or [`POSITION_EVERY`] has passed. Returns false when alerts are still not
    /// durable (nothing is saved then: the position must not pass them).
    async fn save(
        &mut self,
        acks: &mut Acks,
        last_seq: Option<u64>,
        engine: &Engine,
        probe: &probe::Memory,
        tel: &Telemetry,
        force: bool,
    ) -> bool {
        if !acks.settle(ACK_WAIT).await {
            return false;
        }
        // Promptly after an alert (a crash then re-sends little), but not after every small
        // batch of a burst: the snapshot grows with the open incidents.
        let gap = if acks.since_save {
            SAVE_GAP
        } else {
            POSITION_EVERY
        };
        let due = force || self.last_save.elapsed() >= gap;
        let changed = last_seq != self.saved_seq || engine.changes() != self.saved_changes;
        if !due || !(changed || force) {
            return true;
        }
        let started = std::time::Instant::now();
        let snapshot = SavedIncidents {
            boot_id: self.boot_hex.clone(),
            open: engine.snapshot(),
            last_seq,
            probe: Some(probe.clone()),
        };
        // The snapshot first: it names the record it accounts for, and a start after a crash
        // between the two writes goes on from the snapshot.
        let result = self
            .state
            .save_json(CHECKPOINT, &snapshot)
            .and_then(|()| match last_seq {
                Some(seq) => self.state.save_position(&Position {
                    boot_id: self.boot,
                    last_seq: seq,
                }),
                None => Ok(()),
            });
        self.last_save = tokio::time::Instant::now();
        tracing::debug!(
            incidents = snapshot.open.len(),
            ms = started.elapsed().as_millis() as u64,
            "checkpoint saved"
        );
        match result {
            Ok(()) => {
                if let Some(seq) = last_seq {
                    tel.set_kmsg_position(&self.boot_hex, seq);
                }
                self.saved_seq = last_seq;
                self.saved_changes = engine.changes();
                self.saved_probe = probe.clone();
                acks.since_save = false;
                if self.errors > 0 {
                    tracing::info!("state saved again after {} failed attempts", self.errors);
                    self.errors = 0;
                }
            }
            Err(e) => {
                // A full disk: rate-limited, as this fails at every save.
                self.errors += 1;
                state::log_write_error("checkpoint", &format!("{e:#}"));
            }
        }
        true
    }
}

/// What is in force: the config file's bytes and every runbook file's name and bytes. Reload
/// happens when this changes, not whenever something touches the folders.
#[derive(Debug, PartialEq, Eq)]
struct Fingerprint(u64);

impl Fingerprint {
    fn of(cfg: &Config) -> Fingerprint {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for b in bytes {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            h ^= 0xff;
            h = h.wrapping_mul(0x0100_0000_01b3);
        };
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
        Fingerprint(h)
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
        for w in alert_cfg.secret_warnings(cfg.source.as_deref()) {
            tracing::warn!("{w}");
        }
        let (shutdown, rx) = tokio::sync::watch::channel(false);
        let (sender, handle) = crate::alert::Dispatcher::start(&alert_cfg, &cfg.state_dir, rx)
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
                let mut f = crate::classify::signals::finding(
                    FindingKind::ConfigRejected,
                    None,
                    "config reload refused: the previous config stays in force".into(),
                );
                f.message = text;
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
    match out
        .alerts
        .reconfigure(&alert_config(&new, opts.output))
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
    log: std::collections::VecDeque<crate::runbook::LogLine>,
    tel: Arc<Telemetry>,
    /// Runbooks running (or waiting to run) for new incidents.
    tasks: tokio::task::JoinSet<()>,
    /// Tells running runbooks to give up (shutdown).
    stop_runbooks: tokio::sync::watch::Sender<bool>,
    /// The GPU's history and inventory diff, put on each page beside the runbook's evidence.
    pages: health::Pages,
}

/// New incidents waiting for (or running) their runbook, at most; past this an incident's alert
/// goes out at once without evidence (and says so) rather than queue excerpts without bound.
const MAX_WAITING_RUNBOOKS: usize = 64;

/// How long shutdown waits for runbook tasks to hand their evidence over.
const RUNBOOK_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How long past a runbook's budget its alert stays held, in case the task itself is lost.
const HOLD_GRACE: Duration = Duration::from_secs(15);

impl Emitter {
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
            let catalog = Some(catalog_text(&inc));
            let alert = crate::alert::Alert {
                catalog,
                evidence: self.pages.annotate(&inc),
                incident: inc,
            };
            let opened =
                alert.incident.phase == crate::model::IncidentPhase::Opened && !alert.incident.test;
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
                acks.submitted(self.alerts.submit(alert, None, Some(note)).await);
                continue;
            }
            let hold = self.limits.max_budget.saturating_add(HOLD_GRACE);
            acks.submitted(self.alerts.submit(alert.clone(), Some(hold), None).await);
            self.spawn_runbook(alert);
        }
    }

    /// Runs the incident's runbook off the loop and attaches its evidence to the held alert.
    fn spawn_runbook(&mut self, mut alert: crate::alert::Alert) {
        let lines: Vec<_> = self.log.iter().cloned().collect();
        let first_seq = alert.incident.findings.first().and_then(|f| f.origin.seq);
        let anchor = first_seq.and_then(|s| lines.iter().rposition(|l| l.seq == Some(s)));
        let subject = crate::runbook::Subject::from(&alert.incident).with_kernel_log(lines, anchor);
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
            let run = async {
                match permits.acquire_owned().await {
                    Ok(_permit) => set.run_for(&subject, &env, &limits).await,
                    Err(_) => None,
                }
            };
            let stopped = async {
                let _ = stop.wait_for(|stop| *stop).await;
            };
            let evidence = tokio::select! {
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
            if let Some(ev) = &evidence {
                let ok = !ev.steps.iter().any(|s| {
                    matches!(
                        s.status,
                        crate::model::StepStatus::Failed { .. }
                            | crate::model::StepStatus::TimedOut { .. }
                    )
                });
                tel.runbook_run(&ev.runbook, Duration::from_millis(ev.duration_ms), ok);
            }
            alert.evidence = health::merge(std::mem::take(&mut alert.evidence), evidence);
            if let Err(e) = sender.attach_evidence(alert).await {
                tracing::error!("alert stage: {e}");
            }
        });
    }
}

/// Acknowledgements of alerts handed to the alert stage and not yet durable. The kernel log
/// position (and the incident snapshot saved with it) is written only when none is missing, so
/// the saved state never runs ahead of an alert that exists only in memory.
#[derive(Default)]
struct Acks {
    waiting: Vec<tokio::sync::oneshot::Receiver<crate::alert::dispatch::Ack>>,
    /// An alert was handed over since the last save: save promptly.
    since_save: bool,
}

/// How long the loop waits for the alert stage to make a batch's alerts durable before it goes
/// on reading (the position then simply stays where it is until they are).
const ACK_WAIT: Duration = Duration::from_secs(2);

impl Acks {
    fn submitted(
        &mut self,
        r: Result<
            tokio::sync::oneshot::Receiver<crate::alert::dispatch::Ack>,
            crate::alert::SendError,
        >,
    ) {
        match r {
            Ok(rx) => {
                self.waiting.push(rx);
                self.since_save = true;
            }
            // Only at shutdown: the alert stage is gone, so the position must not move.
            Err(e) => {
                tracing::error!("alert stage: {e}");
                self.waiting.push(tokio::sync::oneshot::channel().1);
            }
        }
    }

    /// Waits (bounded) for the outstanding acknowledgements; true when none is missing.
    async fn settle(&mut self, limit: Duration) -> bool {
        if self.waiting.is_empty() {
            return true;
        }
        let deadline = tokio::time::Instant::now() + limit;
        let mut left = Vec::new();
        for mut rx in std::mem::take(&mut self.waiting) {
            match tokio::time::timeout_at(deadline, &mut rx).await {
                Ok(Ok(_)) => {}
                // The stage dropped it without an answer: never durable.
                Ok(Err(_)) => left.push(tokio::sync::oneshot::channel().1),
                Err(_) => left.push(rx),
            }
        }
        self.waiting = left;
        self.waiting.is_empty()
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
