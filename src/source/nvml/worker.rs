//! The NVML worker: one thread that owns the NVML handle and makes every NVML call, each under a
//! deadline.
//!
//! Why one thread: an NVML call into a wedged driver does not return, and no timeout can take the
//! thread back. Calls made on the async runtime would freeze the kernel-log pipeline with it;
//! calls made on throw-away threads pile up, one stuck thread per attempt. Here exactly one thread
//! can be stuck. Callers wait for its answer with a deadline; the first call that misses it
//! reports the stuck episode ([`NvmlEvent::Unresponsive`], with the tasks in D state), and every
//! later call fails at once with what the worker is stuck in, instead of queueing behind it. When
//! the stuck call returns, the worker says so ([`NvmlEvent::Answering`]) and serves again.
//!
//! Between requests the worker waits for NVML events in short waits, so requests and events
//! interleave on the one handle.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{
    sync_channel, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError,
};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;

use super::query::{self, NvmlError, NvmlProbe, NvmlQuery};
use super::{blocked, deliver, NvmlEvent, NvmlFailure, Opened, Stall, Watch, WAIT_MS};
use crate::model::PciAddress;

/// Requests that may wait for the worker at once. Callers only queue while the worker is healthy
/// (a stuck worker fails them at once), so a few cover a runbook burst and the probe.
const QUEUE: usize = 8;

/// What the worker needs to know.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Path of `libnvidia-ml.so`; `None` = the dynamic loader's search.
    pub library: Option<PathBuf>,
    /// How long one request may take before the driver counts as unresponsive.
    pub call_timeout: Duration,
    /// How long init (load, init, inventory) may take: longer than a call, since a machine
    /// without the persistence daemon initialises its GPUs one by one.
    pub open_timeout: Duration,
    /// Root of procfs, read for the tasks in D state when a call is stuck.
    pub procfs_root: PathBuf,
}

/// Why a request got no answer from NVML.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// This request waited its whole deadline.
    #[error("NVML did not answer {call} within {:.1} s: the driver is unresponsive", waited.as_secs_f64())]
    Timeout { call: String, waited: Duration },
    /// The worker is stuck in an earlier call; this request was not tried.
    #[error("NVML worker busy since {:.1} s with {call}: the driver is unresponsive", since.as_secs_f64())]
    Busy { call: String, since: Duration },
    /// Init has not answered within the caller's hold, but is within its own limit yet.
    #[error("NVML has not finished its init after {:.1} s; it goes on", waited.as_secs_f64())]
    Opening { waited: Duration },
    /// Too many requests are waiting already.
    #[error("NVML worker has {QUEUE} requests waiting already")]
    QueueFull,
    /// The worker has ended (NVML did not open, or the daemon is stopping).
    #[error("NVML is not running")]
    Closed,
    /// NVML answered with a failure.
    #[error("{0}")]
    Failed(NvmlFailure),
}

/// A call the worker is in.
#[derive(Debug, Clone)]
struct Running {
    call: String,
    since: Instant,
    limit: Duration,
    /// The request being served; `None` for the worker's own calls (init, events).
    job: Option<u64>,
}

/// What the worker and its callers share. Held only for a moment, never across an NVML call.
#[derive(Debug)]
struct Shared {
    running: Option<Running>,
    /// The stuck call of the episode that has been reported and has not ended.
    stalled: Option<(String, Instant)>,
    /// [`NvmlWorker::wait_open`] still waits for init's answer.
    open_waiter: bool,
}

type Task = Box<dyn FnOnce(&Nvml, &Opened) + Send>;

struct Job {
    id: u64,
    call: String,
    task: Task,
}

/// The handle to the NVML worker. Cheap to clone; the worker ends when [`NvmlWorker::stop`] is
/// called or the last handle is dropped.
#[derive(Clone)]
pub struct NvmlWorker {
    inner: Arc<Inner>,
}

struct Inner {
    jobs: SyncSender<Job>,
    shared: Arc<Mutex<Shared>>,
    events: SyncSender<NvmlEvent>,
    stop: Arc<AtomicBool>,
    call_timeout: Duration,
    open_timeout: Duration,
    procfs_root: PathBuf,
    open_rx: Mutex<Option<Receiver<Result<Opened, NvmlFailure>>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    next_job: std::sync::atomic::AtomicU64,
}

impl fmt::Debug for NvmlWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NvmlWorker")
            .field("call_timeout", &self.inner.call_timeout)
            .field("running", &lock(&self.inner.shared).running)
            .finish()
    }
}

/// A poisoned lock means a caller panicked between two plain assignments; the data is whole.
fn lock(m: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl NvmlWorker {
    /// [`NvmlWorker::spawn`] for an async reader: the worker's events reach `events` through a
    /// small thread of their own, so the worker never waits on the runtime.
    pub fn spawn_for_async(
        opts: WorkerOptions,
        events: tokio::sync::mpsc::Sender<NvmlEvent>,
        queue: usize,
    ) -> std::io::Result<NvmlWorker> {
        let (tx, rx) = sync_channel::<NvmlEvent>(queue);
        let worker = NvmlWorker::spawn(opts, tx)?;
        std::thread::Builder::new()
            .name("xidwatch-nvml-bridge".into())
            .spawn(move || {
                while let Ok(ev) = rx.recv() {
                    if events.blocking_send(ev).is_err() {
                        break;
                    }
                }
            })?;
        Ok(worker)
    }

    /// Starts the worker, which opens NVML at once ([`NvmlWorker::wait_open`] gets the answer),
    /// registers for events, and then serves requests and hands events to `events`.
    pub fn spawn(
        opts: WorkerOptions,
        events: SyncSender<NvmlEvent>,
    ) -> std::io::Result<NvmlWorker> {
        let (jobs_tx, jobs_rx) = sync_channel(QUEUE);
        let (open_tx, open_rx) = sync_channel(1);
        let shared = Arc::new(Mutex::new(Shared {
            running: None,
            stalled: None,
            open_waiter: true,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let worker = Thread {
            shared: shared.clone(),
            events: events.clone(),
            stop: stop.clone(),
            call_timeout: opts.call_timeout,
            open_timeout: opts.open_timeout,
        };
        let library = opts.library.clone();
        let thread = std::thread::Builder::new()
            .name("xidwatch-nvml".into())
            .spawn(move || worker.serve(library, jobs_rx, open_tx))?;
        Ok(NvmlWorker {
            inner: Arc::new(Inner {
                jobs: jobs_tx,
                shared,
                events,
                stop,
                call_timeout: opts.call_timeout,
                open_timeout: opts.open_timeout,
                procfs_root: opts.procfs_root,
                open_rx: Mutex::new(Some(open_rx)),
                thread: Mutex::new(Some(thread)),
                next_job: std::sync::atomic::AtomicU64::new(0),
            }),
        })
    }

    /// Waits (blocking, at most the open timeout) for NVML's init and inventory. Answers once; an
    /// init that misses the deadline is reported as a stuck episode, and if it answers later the
    /// inventory comes as [`NvmlEvent::Opened`].
    pub fn wait_open(&self) -> Result<Opened, CallError> {
        self.wait_open_for(self.inner.open_timeout)
    }

    /// Like [`NvmlWorker::wait_open`], but gives up waiting after `hold` (if shorter than the open
    /// timeout) with [`CallError::Opening`]: init goes on, its inventory comes as
    /// [`NvmlEvent::Opened`], and an init that overruns the open timeout is reported by
    /// [`NvmlWorker::check`]. The daemon holds the kernel log only this long for NVML's GPU
    /// identities.
    pub fn wait_open_for(&self, hold: Duration) -> Result<Opened, CallError> {
        let Some(rx) = self
            .inner
            .open_rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return Err(CallError::Closed);
        };
        let hold = hold.min(self.inner.open_timeout);
        match rx.recv_timeout(hold) {
            Ok(r) => r.map_err(CallError::Failed),
            Err(RecvTimeoutError::Disconnected) => Err(CallError::Closed),
            Err(RecvTimeoutError::Timeout) => {
                // Waiting the whole open limit: init may have started after the wait did (a
                // busy machine), so give the call itself its full limit before calling it late.
                if hold >= self.inner.open_timeout {
                    if let Some(left) = self
                        .running()
                        .and_then(|r| r.limit.checked_sub(r.since.elapsed()))
                    {
                        if let Ok(r) = rx.recv_timeout(left) {
                            return r.map_err(CallError::Failed);
                        }
                    }
                }
                lock(&self.inner.shared).open_waiter = false;
                // The worker hands the answer over under the lock, so it is either here now or
                // will go to the event channel.
                if let Ok(r) = rx.try_recv() {
                    return r.map_err(CallError::Failed);
                }
                match self.running() {
                    Some(r) if r.since.elapsed() < r.limit => {
                        Err(CallError::Opening { waited: hold })
                    }
                    running => {
                        let (call, since) =
                            running.map(|r| (r.call, r.since)).unwrap_or_else(|| {
                                // `checked_sub`: the monotonic clock may be younger than the wait.
                                let since = Instant::now().checked_sub(hold);
                                (INIT.to_string(), since.unwrap_or_else(Instant::now))
                            });
                        self.raise(&call, since);
                        Err(CallError::Timeout {
                            call: INIT.into(),
                            waited: hold,
                        })
                    }
                }
            }
        }
    }

    /// Runs `f` on the worker with the NVML handle and waits for its answer, at most the call
    /// timeout. `call` names it in reports (`nvmlDeviceGetCount`, ...). Blocks the calling
    /// thread: async callers use `spawn_blocking`, which returns within the deadline.
    pub fn call<T: Send + 'static>(
        &self,
        call: &str,
        f: impl FnOnce(&Nvml, &Opened) -> T + Send + 'static,
    ) -> Result<T, CallError> {
        self.fail_fast()?;
        let (tx, rx) = sync_channel(1);
        let id = self.inner.next_job.fetch_add(1, Ordering::Relaxed);
        let job = Job {
            id,
            call: call.to_string(),
            task: Box::new(move |nvml, opened| {
                let _ = tx.send(f(nvml, opened));
            }),
        };
        let sent = Instant::now();
        match self.inner.jobs.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(CallError::QueueFull),
            Err(TrySendError::Disconnected(_)) => return Err(CallError::Closed),
        }
        let mut until = sent + self.inner.call_timeout;
        loop {
            match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(v) => return Ok(v),
                Err(RecvTimeoutError::Disconnected) => return Err(CallError::Closed),
                Err(RecvTimeoutError::Timeout) => {}
            }
            if let Ok(v) = rx.try_recv() {
                return Ok(v);
            }
            let timeout = CallError::Timeout {
                call: call.to_string(),
                waited: sent.elapsed(),
            };
            match self.running() {
                // Stuck, whether in this request or in a call before it: report the episode.
                Some(r) if r.since.elapsed() >= r.limit => {
                    self.raise(&r.call, r.since);
                    return Err(timeout);
                }
                // This request, taken up late (after an event wait): it gets its full deadline.
                Some(r) if r.job == Some(id) => until = r.since + r.limit,
                // Behind calls that are slow but within their limits: this caller gives up,
                // and nothing is stuck.
                _ => return Err(timeout),
            }
        }
    }

    /// Notices a call that has overrun its limit though no request waits for it (an event
    /// wait, say), and reports the episode. Cheap unless it reports; the daemon calls it every
    /// second. `true` while the worker is stuck.
    pub fn check(&self) -> bool {
        self.fail_fast().is_err()
    }

    /// The PCI addresses NVML reaches now, for the lost-GPU probe.
    pub fn reachable_gpus(&self) -> Result<Vec<PciAddress>, CallError> {
        self.call("nvmlDeviceGetCount", |nvml, _| super::reachable(nvml))?
            .map_err(CallError::Failed)
    }

    /// The GPUs NVML reaches now with who each says it is (UUID, serial), so the probe can tell
    /// a lost board that came back from another board at its address.
    pub fn reached_gpus(&self) -> Result<Vec<crate::model::Reached>, CallError> {
        self.call("nvmlDeviceGetCount", |nvml, _| super::reached(nvml))?
            .map_err(CallError::Failed)
    }

    /// One poll's health readings for every GPU NVML enumerated at init, in one request. The
    /// pids NVML lists are looked up in procfs afterwards, on the caller's thread, so the worker
    /// never waits on the filesystem.
    pub fn health_readings(&self) -> Result<Vec<super::health::GpuReading>, CallError> {
        let mut readings = self.call("health readings", |nvml, opened| {
            super::health::read_all(nvml, opened)
        })?;
        crate::health::holder::look_up(&mut readings, &self.inner.procfs_root);
        Ok(readings)
    }

    /// What the inventory needs beyond the readings: the init inventory (identities, driver)
    /// and each GPU's VBIOS version.
    pub fn inventory(&self) -> Result<(Opened, Vec<Option<String>>), CallError> {
        self.call("inventory (VBIOS versions)", |nvml, opened| {
            (opened.clone(), super::health::read_vbios(nvml, opened))
        })
    }

    /// How long one request may take.
    pub fn call_timeout(&self) -> Duration {
        self.inner.call_timeout
    }

    /// Asks the worker to end after the call it is in, and waits up to `wait` for it. `false`
    /// when it is still in a call (a stuck driver): the thread is left to the process's exit.
    pub fn stop(&self, wait: Duration) -> bool {
        self.inner.stop.store(true, Ordering::Relaxed);
        let mut slot = self.inner.thread.lock().unwrap_or_else(|p| p.into_inner());
        let Some(handle) = slot.take() else {
            return true;
        };
        let start = Instant::now();
        while !handle.is_finished() {
            if start.elapsed() >= wait {
                *slot = Some(handle);
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        handle.join().is_ok()
    }

    fn running(&self) -> Option<Running> {
        lock(&self.inner.shared).running.clone()
    }

    /// Refuses a request at once while the worker is stuck, and notices a stuck call (an event
    /// wait, say) that no request has timed out on yet.
    fn fail_fast(&self) -> Result<(), CallError> {
        let overdue = {
            let s = lock(&self.inner.shared);
            if let Some((call, since)) = &s.stalled {
                return Err(CallError::Busy {
                    call: call.clone(),
                    since: since.elapsed(),
                });
            }
            s.running.clone().filter(|r| r.since.elapsed() > r.limit)
        };
        match overdue {
            Some(r) => {
                self.raise(&r.call, r.since);
                Err(CallError::Busy {
                    call: r.call,
                    since: r.since.elapsed(),
                })
            }
            None => Ok(()),
        }
    }

    /// Reports a stuck episode, once: the first caller to notice scans procfs and sends the
    /// report; the episode ends when the worker finishes a call.
    fn raise(&self, call: &str, since: Instant) {
        if lock(&self.inner.shared).stalled.is_some() {
            return;
        }
        let scan = blocked::scan(&self.inner.procfs_root);
        let mut s = lock(&self.inner.shared);
        if s.stalled.is_some() {
            return;
        }
        s.stalled = Some((call.to_string(), since));
        let stall = Stall {
            call: call.to_string(),
            running: since.elapsed(),
            blocked: scan.tasks,
            blocked_omitted: scan.omitted,
            blocked_note: scan.note,
        };
        // Sent under the lock, so the worker's "answering again" cannot overtake it.
        if let Err(e) = self
            .inner
            .events
            .try_send(NvmlEvent::Unresponsive(Box::new(stall)))
        {
            let why = match e {
                TrySendError::Full(_) => "its queue is full",
                TrySendError::Disconnected(_) => "nobody reads it",
            };
            tracing::error!(
                "NVML is stuck in {call}, and the report cannot be handed to the daemon: {why}"
            );
        }
    }
}

/// Runbook `nvml` steps, answered through the worker, under its deadline.
impl NvmlProbe for NvmlWorker {
    fn query(&self, query: NvmlQuery, gpu: PciAddress) -> Result<String, NvmlError> {
        match self.call(&format!("runbook query {query}"), move |nvml, opened| {
            query::answer(nvml, opened, query, gpu)
        }) {
            Ok(answer) => answer,
            Err(e) => Err(NvmlError::Failed(e.to_string())),
        }
    }
}

/// How init is named in reports.
const INIT: &str = "nvmlInit (and the GPU inventory)";

/// The worker thread's side.
struct Thread {
    shared: Arc<Mutex<Shared>>,
    events: SyncSender<NvmlEvent>,
    stop: Arc<AtomicBool>,
    call_timeout: Duration,
    open_timeout: Duration,
}

impl Thread {
    fn serve(
        self,
        library: Option<PathBuf>,
        jobs: Receiver<Job>,
        open_tx: SyncSender<Result<Opened, NvmlFailure>>,
    ) {
        // The mark stays set until init's answer is handed over, so a late inventory reaches
        // the daemon before the news that NVML answers again.
        self.mark(INIT, self.open_timeout);
        let opened = super::open(library.as_deref());
        let (nvml, opened) = match opened {
            Ok((nvml, opened)) => {
                self.hand_open(&open_tx, Ok(opened.clone()));
                self.unmark();
                (nvml, opened)
            }
            Err(failure) => {
                self.hand_open(&open_tx, Err(failure));
                self.unmark();
                return;
            }
        };
        let (mut watch, registered) =
            self.run("nvmlDeviceRegisterEvents", self.call_timeout, || {
                Watch::register(&nvml, &opened.inventory)
            });
        match registered {
            Ok(notes) => self.send(NvmlEvent::Watching { notes }),
            Err(failure) => {
                self.send(NvmlEvent::Watching {
                    notes: vec![format!("cannot create an NVML event set: {failure}")],
                });
                self.send(NvmlEvent::Failed(failure));
            }
        }
        let wait_limit = Duration::from_millis(u64::from(WAIT_MS)) + self.call_timeout;
        while !self.stop.load(Ordering::Relaxed) {
            // Requests first: someone waits for each.
            loop {
                match jobs.try_recv() {
                    Ok(job) => self.serve_job(job, &nvml, &opened),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            if watch.is_waiting() {
                let events = self.run("nvmlEventSetWait", wait_limit, || {
                    watch.wait(&nvml, &opened.inventory)
                });
                for ev in events {
                    self.send(ev);
                }
            } else {
                match jobs.recv_timeout(Duration::from_millis(u64::from(WAIT_MS))) {
                    Ok(job) => self.serve_job(job, &nvml, &opened),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            // An episode a caller reported just after the stuck call returned ends here.
            self.finished();
        }
    }

    fn serve_job(&self, job: Job, nvml: &Nvml, opened: &Opened) {
        let Job { id, call, task } = job;
        // A panic in a query (a wrapper bug) must not take the worker down: the caller sees its
        // reply channel close, and the next request is served.
        self.run_job(Some(id), &call, self.call_timeout, || {
            if catch_unwind(AssertUnwindSafe(|| task(nvml, opened))).is_err() {
                tracing::error!("an NVML request ({call}) panicked; the worker goes on");
            }
        });
    }

    /// Runs one call with the shared "running" mark set, so callers can tell a stuck worker.
    fn run<T>(&self, call: &str, limit: Duration, f: impl FnOnce() -> T) -> T {
        self.run_job(None, call, limit, f)
    }

    fn run_job<T>(
        &self,
        job: Option<u64>,
        call: &str,
        limit: Duration,
        f: impl FnOnce() -> T,
    ) -> T {
        self.mark_job(job, call, limit);
        let out = f();
        self.unmark();
        out
    }

    fn mark(&self, call: &str, limit: Duration) {
        self.mark_job(None, call, limit);
    }

    fn mark_job(&self, job: Option<u64>, call: &str, limit: Duration) {
        lock(&self.shared).running = Some(Running {
            call: call.to_string(),
            since: Instant::now(),
            limit,
            job,
        });
    }

    fn unmark(&self) {
        lock(&self.shared).running = None;
        self.finished();
    }

    /// Ends a reported episode once the worker is out of its calls.
    fn finished(&self) {
        let mut s = lock(&self.shared);
        if s.running.is_some() {
            return;
        }
        if let Some((call, since)) = s.stalled.take() {
            let ev = NvmlEvent::Answering {
                call,
                stuck_for: since.elapsed(),
            };
            if self.events.try_send(ev).is_err() {
                tracing::warn!("NVML answers again; the daemon's queue could not take the news");
            }
        }
    }

    /// Hands init's answer to [`NvmlWorker::wait_open`], or to the event channel once that has
    /// given up.
    fn hand_open(
        &self,
        open_tx: &SyncSender<Result<Opened, NvmlFailure>>,
        result: Result<Opened, NvmlFailure>,
    ) {
        let late = {
            let s = lock(&self.shared);
            if s.open_waiter {
                let _ = open_tx.try_send(result);
                None
            } else {
                Some(result)
            }
        };
        match late {
            Some(Ok(opened)) => self.send(NvmlEvent::Opened(Box::new(opened))),
            Some(Err(failure)) => self.send(NvmlEvent::Failed(failure)),
            None => {}
        }
    }

    fn send(&self, ev: NvmlEvent) {
        // A reader that is gone (a test that only asks) is no reason to stop serving.
        let _ = deliver(&self.events, &self.stop, ev);
    }
}
