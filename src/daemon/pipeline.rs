//! The pipeline: classify, correlate, hand over, checkpoint. Everything the processing task
//! owns: the classifier, the incident engine, the counters, the hand-over and the checkpoint.
//! Sources send it values; nothing in here blocks on NVML, a child process or the network.
//!
//! Where incidents move: [`Pipeline::feed`] opens or joins them (through the engine),
//! [`Pipeline::apply_nvml`] ends verified ones, and [`Pipeline::flush`] hands what the engine
//! released to the [`Emitter`] and saves the checkpoint behind it.

use std::sync::Arc;
use std::time::Duration;

use super::checkpoint::{Checkpointer, SavedIncidents, CHECKPOINT};
use super::events::Waits;
use super::handover::Emitter;
use super::options::{Output, RunOptions, SourceStats};
use crate::alert::dispatch::Acks;
use crate::classify::{Classifier, LineOrigin};
use crate::clock::Now;
use crate::config::watch::Fingerprint;
use crate::config::Config;
use crate::incident::{Engine, Origin};
use crate::model::{Finding, Incident};
use crate::source::fabricmanager::{FmLogEvent, LogPosition};
use crate::source::kmsg::follow::{self, KmsgEvent};
use crate::source::kmsg::KernelClock;
use crate::source::nvml::link::{FoundBy, NvmlValue};
use crate::source::probe;
use crate::source::services::ServiceEvent;
use crate::state::{self, StateDir};
use crate::status::control;
use crate::status::telemetry::Telemetry;

/// How long a multi-line message may wait for its next line before it is reported as it is.
const FOLD_QUIET: Duration = Duration::from_millis(50);

fn now_ms() -> u64 {
    crate::clock::wall_ms()
}

/// Classify, correlate, hand over, checkpoint: everything the processing task owns. Nothing in
/// here blocks on NVML, a child process or the network.
pub(super) struct Pipeline {
    pub(super) tel: Arc<Telemetry>,
    pub(super) classifier: Classifier,
    pub(super) engine: Engine,
    pub(super) stats: SourceStats,
    pub(super) out: Emitter,
    pub(super) acks: Acks,
    pub(super) ckpt: Checkpointer,
    /// Incidents the engine produced and not yet handed over.
    pub(super) out_buf: Vec<Incident>,
    pub(super) findings: Vec<Finding>,
    /// The last kernel log record read.
    pub(super) last_seq: Option<u64>,
    pub(super) last_record: tokio::time::Instant,
    pub(super) caught_up: bool,
    /// The config in force (settings that need a restart keep their start-up values).
    pub(super) current: Config,
    pub(super) last_reload_error: Option<String>,
    pub(super) fingerprint: Fingerprint,
    /// Whether the log said that a program's kernel log line that looked like a GPU fault was
    /// ignored: said once, so that whoever tests with `echo ... > /dev/kmsg` learns the key.
    pub(super) said_userspace: bool,
    /// Dates kernel log records on the wall clock (boot time plus the record's timestamp).
    pub(super) kclock: KernelClock,
    /// What the lost-GPU probe remembers, as of its last round (saved with the checkpoint): a
    /// GPU that stays missing across a restart is not reported again.
    pub(super) probe_memory: probe::Memory,
    /// The Fabric Manager log position read up to, saved once what was read is durable.
    pub(super) fm_position: Option<LogPosition>,
    /// The position last saved.
    pub(super) fm_saved: Option<LogPosition>,
    /// Held by every write of `status.json`, and true once the last one (the stopped status)
    /// is written: a periodic write still waiting for its thread when the daemon stopped then
    /// writes nothing, where it used to replace the stopped status with a running one.
    pub(super) status_written_stopped: Arc<std::sync::Mutex<bool>>,
}

impl Pipeline {
    /// The pipeline as the last checkpoint of this boot left it (or new), and the probe's
    /// memory from that checkpoint.
    pub(super) fn restore(
        opts: &RunOptions,
        state: &StateDir,
        boot: [u8; 16],
        tel: Arc<Telemetry>,
        alerts: crate::alert::AlertSender,
    ) -> (Pipeline, Option<probe::Memory>) {
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
        let mut engine = Engine::new(cfg.engine_config(boot_hex.clone()));
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
        let mut out = Emitter::new(cfg, opts.output, alerts, tel.clone());
        out.lookback_secs = cfg.kmsg.lookback_secs;
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
            classifier: {
                let mut c = Classifier::new();
                c.set_site(cfg.site_shapes.clone());
                c
            },
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
            probe_memory: probe_memory.clone().unwrap_or_default(),
            fm_position: None,
            fm_saved: None,
            status_written_stopped: Arc::default(),
        };
        (p, probe_memory)
    }

    /// One value from the NVML side: its findings to the engine, its inventory to the
    /// classifier, its state to the counters, its verified ends to their incidents.
    pub(super) fn apply_nvml(&mut self, v: NvmlValue, at_startup: bool) {
        match v {
            NvmlValue::Finding(f, by) => {
                let origin = match by {
                    FoundBy::Nvml => Origin::Nvml,
                    FoundBy::Probe => Origin::Probe,
                };
                self.feed(f, origin, Now::read(), at_startup)
            }
            NvmlValue::Learned {
                gpus,
                driver_version,
            } => {
                for g in &gpus {
                    self.classifier.learn_gpu(g.pci, g.identity());
                }
                if let Some(v) = &driver_version {
                    self.classifier.set_driver_version(v);
                }
                self.stats.gpus_seen = gpus.len();
                self.tel.set_gpus(
                    gpus.iter()
                        .map(crate::status::telemetry::GpuSummary::from)
                        .collect(),
                );
            }
            NvmlValue::Up { up, state } => {
                self.stats.nvml_up = up;
                if let Some(s) = state {
                    self.tel.set_nvml(up, &s);
                }
            }
            NvmlValue::Health(gauges) => self.tel.set_health(gauges),
            // A health check passed again (for its window): its incident (same kind and GPU)
            // ends now with a resolved notice, not after a quiet period.
            NvmlValue::Verified(f) => self
                .engine
                .resolve_state(&f, Now::read(), &mut self.out_buf),
            NvmlValue::LostCheck(v) => self.engine.verify_lost(&v, Now::read(), &mut self.out_buf),
            NvmlValue::ProbeMemory(m) => self.probe_memory = m,
            NvmlValue::CanVerify(can) => self.engine.set_can_verify(can),
        }
    }

    /// One event from the service watch: a down unit is a finding pushed to the engine (paged
    /// once; repeats fold in), and "verified active" ends that incident with a resolved notice.
    pub(super) fn apply_service(&mut self, ev: ServiceEvent) {
        match ev {
            ServiceEvent::Down(f) => {
                tracing::warn!("service watch: {}", f.title);
                self.feed(f, Origin::Probe, Now::read(), false);
            }
            ServiceEvent::Active(f) => {
                tracing::info!("service watch: {} (verified active)", f.title);
                self.engine
                    .resolve_state(&f, Now::read(), &mut self.out_buf);
            }
            ServiceEvent::Note { warn: true, text } => tracing::warn!("{text}"),
            ServiceEvent::Note { warn: false, text } => tracing::info!("{text}"),
        }
    }

    /// One event from the Fabric Manager log. The position it read up to is saved by the
    /// flush, once the findings are handed over and durable.
    pub(super) fn apply_fabric_log(&mut self, ev: FmLogEvent) {
        match ev {
            FmLogEvent::Read { findings, pos } => {
                let now = Now::read();
                for f in findings {
                    self.feed(f, Origin::Kmsg, now, false);
                }
                self.fm_position = Some(pos);
            }
            FmLogEvent::Note { warn: true, text } => tracing::warn!("{text}"),
            FmLogEvent::Note { warn: false, text } => tracing::info!("{text}"),
        }
    }

    /// What the loop waits for besides the sources: the engine's next deadline, the
    /// checkpoint, a multi-line message waiting for its next line.
    pub(super) fn waits(&self) -> Waits {
        let deadline = self
            .engine
            .next_deadline()
            .map(|d| d.saturating_sub(crate::clock::mono_ms()))
            .unwrap_or(3_600_000);
        Waits {
            deadline: Duration::from_millis(deadline),
            save_at: self.ckpt.due_at(&self.acks, self.last_seq, &self.engine),
            fold: self
                .classifier
                .has_pending()
                .then(|| FOLD_QUIET.saturating_sub(self.last_record.elapsed())),
        }
    }

    /// The engine's deadlines: settle delays, quiet periods, reminders.
    pub(super) fn tick(&mut self) {
        self.engine.tick(Now::read(), &mut self.out_buf);
    }

    /// Hands what the engine released over. The pages report each GPU's state as of these
    /// incidents (`handover::state_doc`), so the open set is refreshed first.
    async fn hand_over(&mut self) {
        if !self.out_buf.is_empty() {
            self.tel
                .set_open_incidents_from(self.engine.open_incidents());
        }
        self.out.emit_all(&mut self.out_buf, &mut self.acks).await;
    }

    /// The pipeline's part of the stop, once the sources are stopped: what is in flight is
    /// reported, runbooks still running give up (their alerts go out without evidence rather
    /// than not at all), and the checkpoint is saved behind the last hand-over.
    pub(super) async fn shut_down(&mut self) {
        self.fold_quiet();
        self.hand_over().await;
        self.out.finish().await;
        if !self.flush(true).await {
            tracing::warn!("some alerts were not written to the outbox in time; the kernel log position stays before them and they are raised again at the next start");
        }
    }

    /// Counts a finding and hands it to the incident engine.
    pub(super) fn feed(&mut self, f: Finding, origin: Origin, now: Now, at_startup: bool) {
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
    pub(super) fn kmsg(&mut self, batch: &[KmsgEvent]) -> anyhow::Result<()> {
        let now = Now::read();
        for ev in batch {
            match ev {
                KmsgEvent::Record { rec, at_startup } => self.record(rec, *at_startup, now),
                KmsgEvent::Overrun {
                    lost,
                    next_seq,
                    at_startup,
                } => {
                    let (lost, next_seq, at_startup) = (*lost, *next_seq, *at_startup);
                    self.stats.kmsg_lost += lost;
                    self.tel.kmsg_lost(lost);
                    tracing::warn!(
                        "kernel log overrun: {lost} records lost before record {next_seq}"
                    );
                    self.feed(
                        follow::overrun_finding(lost, next_seq),
                        Origin::Kmsg,
                        now,
                        at_startup,
                    );
                }
                KmsgEvent::SequenceAnomaly {
                    anomaly,
                    at_startup,
                } => {
                    let at_startup = *at_startup;
                    // Counted; reported once as a finding, later ones sparingly in the log.
                    self.tel.kmsg_out_of_sequence(1);
                    if anomaly.count == 1 {
                        tracing::warn!("kernel log: {anomaly}; later records are still read");
                        self.feed(
                            follow::sequence_finding(anomaly),
                            Origin::Kmsg,
                            now,
                            at_startup,
                        );
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

    /// One kernel log record: counted, its lines kept for runbook excerpts, and classified;
    /// each finding dated and fed to the engine. The per-record path.
    fn record(
        &mut self,
        rec: &crate::source::kmsg::record::KmsgRecord,
        at_startup: bool,
        now: Now,
    ) {
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
            return;
        }
        // Built at the first line the classifier reads ([`origin`]).
        let mut at: Option<LineOrigin> = None;
        for line in rec.lines() {
            self.out.remember(rec.seq, rec.ts_usec, line);
            // A reader that fails on a line (a defect: reading never panics by design) costs
            // that line, not the watch: a panic here ended the daemon, and the record that caused
            // it was read again after every restart.
            let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.read_line(rec, line, &mut at)
            }));
            if read.is_err() {
                self.stats.kmsg_unread += 1;
                self.tel.kmsg_unread(1);
                let n = self.stats.kmsg_unread;
                if n <= 10 || n.is_power_of_two() {
                    tracing::error!(
                        "kernel log: a reader failed on a line of record {} and skipped it (a defect in xidwatch: please report it with the line, whose start follows); the watch goes on; {n} so far: {}",
                        rec.seq,
                        // A kernel line may be a megabyte long.
                        crate::classify::trim::chars(line, 200)
                    );
                }
            }
        }
        if self.findings.is_empty() {
            return;
        }
        // Drained, not taken: the vector keeps its allocation for the next record.
        let mut found = std::mem::take(&mut self.findings);
        for mut f in found.drain(..) {
            self.date(&mut f, now);
            self.feed(f, Origin::Kmsg, now, at_startup);
        }
        self.findings = found;
    }

    /// One line of a record, read when a message starts it (a built-in one, or one of the site's
    /// rows: `[[classify.shape]]`, `[[classify.silence]]`), or when it is a line of a pending
    /// crash report that names an NVIDIA module.
    fn read_line(
        &mut self,
        rec: &crate::source::kmsg::record::KmsgRecord,
        line: &str,
        at: &mut Option<LineOrigin>,
    ) {
        if crate::classify::prefix::message_start(line) == Some(0)
            || self
                .classifier
                .site()
                .is_some_and(|t| t.message_start(line).is_some())
        {
            let at = origin(rec, at);
            self.classifier.push(line, at, &mut self.findings);
        } else if self.classifier.has_pending()
            && (crate::classify::shapes::named_module(line).is_some()
                || crate::classify::shapes::modules_linked_in(line).is_some()
                || crate::classify::shapes::ip_line_module(line).is_some())
        {
            // A line of a pending crash report with no message of its own that names an
            // NVIDIA module (`... provided by nvidia_frontend_exit_module [nvidia].` under a
            // DRM core warning): it ties the report to the driver, as `scan` reads it.
            let at = origin(rec, at);
            self.classifier.report_line(line, at);
        }
    }

    /// A multi-line message got no next line in time: report it as it is.
    pub(super) fn fold_quiet(&mut self) {
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
    pub(super) async fn flush(&mut self, force: bool) -> bool {
        self.hand_over().await;
        // The probe's memory is part of the checkpoint: saved promptly when it moved.
        let force = force || self.probe_memory != self.ckpt.saved_probe;
        let durable = self
            .ckpt
            .save(
                &mut self.acks,
                self.last_seq,
                &self.engine,
                &self.probe_memory,
                &self.tel,
                force,
            )
            .await;
        // The Fabric Manager position moves only once what was read is handed over and durable.
        if durable {
            if let Some(pos) = self.fm_position.take() {
                crate::source::fabricmanager::save_position(
                    &self.ckpt.state,
                    &mut self.fm_saved,
                    pos,
                );
            }
        }
        durable
    }

    /// Reloads on SIGHUP (`explicit`), or on a file change when what is in force really
    /// changed. True when it reloaded.
    pub(super) async fn reload(&mut self, output: Output, explicit: bool) -> bool {
        // Only a real change of what is in force reloads: not a stray file, not a save without
        // edits.
        self.tel.config_checked();
        if !explicit && Fingerprint::of(&self.current) == self.fingerprint {
            return false;
        }
        super::reload::reload(
            output,
            &mut self.current,
            &mut self.engine,
            &mut self.out,
            &mut self.last_reload_error,
            &mut self.out_buf,
        )
        .await;
        // The site's rows in force now (the old ones when the reload was refused).
        self.classifier.set_site(self.current.site_shapes.clone());
        self.fingerprint = Fingerprint::of(&self.current);
        true
    }

    pub(super) fn write_status_file(&self) {
        self.tel
            .set_open_incidents_from(self.engine.open_incidents());
        let (dir, snap) = (self.current.state_dir.clone(), self.tel.snapshot());
        let stopped = self.status_written_stopped.clone();
        tokio::task::spawn_blocking(move || {
            let stopped = stopped
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if *stopped {
                return;
            }
            if let Err(e) = control::write_status_file(&dir, &snap) {
                state::log_write_error("status", &format!("{e:#}"));
            }
        });
    }

    /// The last status file, and the last log line.
    pub(super) fn stopped(&self) {
        self.tel
            .set_open_incidents_from(self.engine.open_incidents());
        let mut last = self.tel.snapshot();
        last.stopped_ms = Some(now_ms());
        {
            let mut stopped = self
                .status_written_stopped
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Err(e) = control::write_status_file(&self.current.state_dir, &last) {
                tracing::warn!("{e:#}");
            }
            *stopped = true;
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

/// A record's origin, built at its first line the classifier reads: the stamp is text, and
/// formatting it for every ordinary record cost a twentieth of the daemon's time.
fn origin<'a>(
    rec: &crate::source::kmsg::record::KmsgRecord,
    at: &'a mut Option<LineOrigin>,
) -> &'a LineOrigin {
    at.get_or_insert_with(|| LineOrigin {
        line: 0,
        seq: Some(rec.seq),
        ts_usec: Some(rec.ts_usec),
        timestamp: Some(crate::source::kmsg::time::kernel_stamp_inline(rec.ts_usec)),
    })
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
