//! Running a runbook's steps.
//!
//! A program runs from its argv (never a shell), after the argv as filled in is matched again
//! against the pattern the step was checked against at load. It is resolved in the absolute
//! search directories and run through the descriptor that was checked (see `sandbox`), as an
//! unprivileged user with no new privileges and no capabilities, with a cleared environment (only
//! `PATH` and `LC_ALL=C`), stdin from /dev/null, `/` as its working directory and its own process
//! group. On timeout the whole group is killed with SIGKILL, so children it started die with it.
//! Output is read as it comes and kept up to a cap; the rest is counted and dropped. Steps run
//! concurrently up to the runbook's limit, inside its budget. Every configured secret is cut out
//! of the evidence before it is returned.

use std::fmt;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::model::{Evidence, PciAddress, StepResult, StepStatus};

use super::confine::{Confinement, Support};
use super::excerpt;
use super::excerpt::KmsgSpec;
use super::interpret;
use super::nvml::{NvmlError, NvmlProbe, NvmlQuery};
use super::process::{self, Claim};
use super::redact::Redactor;
use super::render::secs;
use super::safety::{self, Pattern};
use super::sandbox::{self, NotRun, Sandbox};
use super::subject::Subject;
use super::sysfs;
use super::template::{Placeholder, Template, Values};
use super::{Action, Runbook, Step};

/// The only `PATH` a program sees.
pub const CHILD_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// How far a file is read to count what was dropped past the cap.
const MAX_COUNT_BYTES: u64 = 64 * 1024 * 1024;

/// Everything that ties runbooks to a machine: where programs are found, where /sys and /proc
/// are, NVML, the secrets to keep out of evidence. Tests point these at fixtures.
#[derive(Clone)]
pub struct RunbookEnv {
    /// Absolute directories searched, in order, for a step's program; a relative one refuses
    /// the step. Default: the system directories.
    pub search_path: Vec<PathBuf>,
    /// Stands for `/sys` in `read` steps and the PCI topology.
    pub sysfs_root: PathBuf,
    /// Stands for `/proc` in `read` steps.
    pub procfs_root: PathBuf,
    /// Answers `nvml` steps; `None` skips them.
    pub nvml: Option<Arc<dyn NvmlProbe>>,
    /// Host name written into the evidence.
    pub host: String,
    /// Secret values cut out of the evidence (the alert channels' tokens and passwords).
    pub secrets: Redactor,
    /// `[runbooks] show_arguments`: a process's command line whole, not its program and option
    /// names only (see [`super::process::render_cmdline`]).
    pub show_arguments: bool,
}

impl RunbookEnv {
    /// The real machine: system program directories, `/sys`, `/proc`, no NVML.
    pub fn system() -> RunbookEnv {
        RunbookEnv {
            search_path: [
                "/usr/local/sbin",
                "/usr/local/bin",
                "/usr/sbin",
                "/usr/bin",
                "/sbin",
                "/bin",
            ]
            .iter()
            .map(PathBuf::from)
            .collect(),
            sysfs_root: PathBuf::from("/sys"),
            procfs_root: PathBuf::from("/proc"),
            nvml: None,
            host: crate::host::hostname(),
            secrets: Redactor::default(),
            show_arguments: false,
        }
    }
}

impl fmt::Debug for RunbookEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunbookEnv")
            .field("search_path", &self.search_path)
            .field("sysfs_root", &self.sysfs_root)
            .field("procfs_root", &self.procfs_root)
            .field("nvml", &self.nvml.is_some())
            .field("host", &self.host)
            .field("secrets", &self.secrets)
            .field("show_arguments", &self.show_arguments)
            .finish()
    }
}

/// Ceilings the caller (configuration) puts on every runbook; the smaller of these and the
/// runbook's own values applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    pub max_budget: Duration,
    pub max_step_timeout: Duration,
    pub max_output_bytes: usize,
    pub max_concurrency: usize,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            max_budget: Duration::from_secs(120),
            max_step_timeout: Duration::from_secs(60),
            max_output_bytes: 256 * 1024,
            max_concurrency: 8,
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What a step will do once its placeholders are filled.
enum Job {
    Run(Vec<String>, Option<Arc<Pattern>>),
    /// Paths, and what the log line said about its process (checked before /proc/PID is quoted).
    Read(Vec<String>, Option<Claim>),
    Nvml(NvmlQuery, PciAddress),
}

struct Outcome {
    status: StepStatus,
    output: String,
    bytes_dropped: u64,
    notes: Vec<String>,
}

impl Outcome {
    fn status(status: StepStatus) -> Outcome {
        Outcome {
            status,
            output: String::new(),
            bytes_dropped: 0,
            notes: Vec::new(),
        }
    }
}

fn result(step: &Step, target: Vec<String>, o: Outcome, took: Duration) -> StepResult {
    StepResult {
        name: step.name.clone(),
        kind: step.action.kind().to_string(),
        target,
        status: o.status,
        output: o.output,
        bytes_dropped: o.bytes_dropped,
        duration_ms: ms(took),
        notes: o.notes,
    }
}

/// A step ready to run.
enum Prepared<'a> {
    /// A job for the pool, and its target as run (placeholders filled).
    Job(Job, Vec<String>),
    /// The kernel log excerpt: no job, its lines come with the subject.
    Excerpt(&'a KmsgSpec),
    /// A placeholder without a value: the step is skipped.
    Lacks(Placeholder),
}

fn prepare<'a>(step: &'a Step, values: &Values) -> Prepared<'a> {
    let expand_all = |ts: &[Template]| {
        ts.iter()
            .map(|t| t.expand(values))
            .collect::<Result<Vec<_>, _>>()
    };
    let job = match &step.action {
        Action::Run(argv) => {
            expand_all(argv).map(|a| (Job::Run(a.clone(), step.pattern.clone()), a))
        }
        Action::Read(paths) => expand_all(paths).map(|p| (Job::Read(p.clone(), None), p)),
        Action::Nvml(q) => values
            .pci
            .ok_or(Placeholder::Pci)
            .map(|pci| (Job::Nvml(*q, pci), vec![q.to_string(), pci.to_string()])),
        Action::Kmsg(spec) => return Prepared::Excerpt(spec),
    };
    match job {
        Ok((job, target)) => Prepared::Job(job, target),
        Err(p) => Prepared::Lacks(p),
    }
}

pub(super) async fn run_runbook(
    rb: &Runbook,
    subject: &Subject,
    env: &RunbookEnv,
    limits: &RunLimits,
) -> Evidence {
    sandbox::protect_self();
    let started_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, ms);
    let t0 = Instant::now();
    let own = rb.limits();
    let budget = own.budget.min(limits.max_budget);
    let deadline = t0 + budget;
    let concurrency = own.concurrency.min(limits.max_concurrency).max(1);

    let parent_pci = match subject.pci {
        Some(pci) => {
            let root = env.sysfs_root.clone();
            tokio::task::spawn_blocking(move || sysfs::parent_port(&root, pci))
                .await
                .ok()
                .flatten()
        }
        None => None,
    };
    // A GPU gone from the bus is often gone from sysfs too: the AER report names its port.
    let parent_pci = parent_pci.or(subject.port_from_log);
    let values = Values::for_subject(subject, parent_pci);

    let steps = rb.steps();
    let mut results: Vec<Option<StepResult>> = vec![None; steps.len()];
    let permits = Arc::new(Semaphore::new(concurrency));
    let mut tasks = JoinSet::new();
    for (i, step) in steps.iter().enumerate() {
        let timeout = step
            .timeout
            .unwrap_or(own.step_timeout)
            .min(limits.max_step_timeout);
        let cap = step
            .max_output_bytes
            .unwrap_or(own.max_output_bytes)
            .min(limits.max_output_bytes);
        let (job, target) = match prepare(step, &values) {
            Prepared::Job(Job::Read(paths, _), target) => {
                (Job::Read(paths, Claim::of(subject)), target)
            }
            Prepared::Job(job, target) => (job, target),
            Prepared::Excerpt(spec) => {
                let e = excerpt::excerpt(spec, subject, cap);
                let o = Outcome {
                    status: e.status,
                    output: e.output,
                    bytes_dropped: e.bytes_dropped,
                    notes: e.notes,
                };
                results[i] = Some(result(step, step.action.describe(), o, Duration::ZERO));
                continue;
            }
            Prepared::Lacks(p) => {
                let reason = format!(
                    "needs {p} ({}), which this incident does not have",
                    p.describe()
                );
                let o = Outcome::status(StepStatus::Skipped { reason });
                results[i] = Some(result(step, step.action.describe(), o, Duration::ZERO));
                continue;
            }
        };
        let step = step.clone();
        let env = env.clone();
        let permits = permits.clone();
        tasks.spawn(async move {
            let skipped = || {
                Outcome::status(StepStatus::Skipped {
                    reason: format!(
                        "the runbook's budget of {} ran out before this step could start",
                        secs(budget)
                    ),
                })
            };
            let permit = tokio::time::timeout_at(deadline.into(), permits.acquire_owned()).await;
            let now = Instant::now();
            let o = match permit {
                Ok(Ok(_permit)) if now < deadline => {
                    let left = deadline - now;
                    let cut = left < timeout;
                    let mut o = run_job(job, &env, timeout.min(left), cap).await;
                    if cut && matches!(o.status, StepStatus::TimedOut { .. }) {
                        o.notes.push(format!(
                            "cut short by the runbook's budget of {}",
                            secs(budget)
                        ));
                    }
                    o
                }
                _ => skipped(),
            };
            (i, result(&step, target, o, now.elapsed()))
        });
    }
    while let Some(joined) = tasks.join_next().await {
        if let Ok((i, r)) = joined {
            results[i] = Some(r);
        }
    }
    let mut steps_out: Vec<StepResult> = results
        .into_iter()
        .zip(steps)
        .map(|(r, step)| {
            r.unwrap_or_else(|| {
                let o = Outcome::status(StepStatus::Failed {
                    error: "internal error: the step's task ended without a result".into(),
                });
                result(step, step.action.describe(), o, Duration::ZERO)
            })
        })
        .collect();
    for (i, note) in interpret::cross_notes(&steps_out) {
        steps_out[i].notes.push(note);
    }
    let mut ev = Evidence {
        runbook: rb.name().to_string(),
        meaning: rb.meaning().to_string(),
        next_steps: rb.next_steps().to_string(),
        steps: steps_out,
        started_ms,
        duration_ms: ms(t0.elapsed()),
        host: env.host.clone(),
    };
    env.secrets.evidence(&mut ev);
    ev
}

async fn run_job(job: Job, env: &RunbookEnv, timeout: Duration, cap: usize) -> Outcome {
    match job {
        Job::Run(argv, pattern) => {
            run_program(&argv, pattern.as_deref(), &env.search_path, timeout, cap).await
        }
        Job::Read(paths, claim) => read_paths(paths, claim, env, timeout, cap).await,
        Job::Nvml(q, pci) => nvml(q, pci, env.nvml.clone(), timeout).await,
    }
}

/// Output kept up to a cap, the rest counted.
struct Capture {
    kept: Vec<u8>,
    cap: usize,
    dropped: u64,
}

impl Capture {
    fn new(cap: usize) -> Capture {
        Capture {
            kept: Vec::new(),
            cap,
            dropped: 0,
        }
    }

    fn push(&mut self, data: &[u8]) {
        let room = self.cap.saturating_sub(self.kept.len());
        let take = room.min(data.len());
        self.kept.extend_from_slice(&data[..take]);
        self.dropped += (data.len() - take) as u64;
    }
}

async fn pump<R: AsyncRead + Unpin>(reader: Option<R>, into: &mut Capture) {
    let Some(mut r) = reader else { return };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => into.push(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
}

/// Kills the process group if the step is abandoned (its task cancelled) while the leader has
/// not been reaped, so no child outlives a cancelled runbook.
struct GroupGuard {
    pgid: Option<i32>,
}

impl GroupGuard {
    fn kill(&mut self) {
        if let Some(pgid) = self.pgid.take() {
            // SAFETY: plain syscall. The leader is not yet reaped, so the group id still names
            // only this step's processes.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn run_program(
    argv: &[String],
    pattern: Option<&Pattern>,
    search_path: &[PathBuf],
    timeout: Duration,
    cap: usize,
) -> Outcome {
    let failed = |error: String| Outcome::status(StepStatus::Failed { error });
    let Some(program) = argv.first() else {
        return failed("empty argv".into());
    };
    // What runs is what was checked: the argv as filled in must still be the step's pattern.
    match pattern {
        Some(p) if p.matches(argv) => {}
        Some(p) => {
            return failed(format!(
                "refused: {:?} as filled in is not `{p}`",
                argv.join(" ")
            ))
        }
        None => return failed("refused: the step matched no pattern of the catalog".into()),
    }
    if let Some(reason) = crate::host::unavailable_here(program) {
        return Outcome::status(StepStatus::Skipped { reason });
    }
    let kernel_log = pattern.is_some_and(Pattern::kernel_log);
    let prog = match sandbox::resolve(program, search_path) {
        Ok(p) => p,
        Err(NotRun::Missing(what)) => return Outcome::status(StepStatus::Missing { what }),
        Err(NotRun::Refused(error)) => return failed(error),
    };
    let run_as = match sandbox::run_as() {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    let needs = pattern.map(Pattern::needs).unwrap_or_default();
    let mut program_dirs = search_path.to_vec();
    program_dirs.push(prog.real_dir.clone());
    let confine = match Confinement::prepare(needs, &program_dirs, Support::probe()) {
        Ok(c) => c,
        Err(e) => return failed(format!("not run: {e}")),
    };
    // SAFETY: plain syscall.
    let uid = run_as
        .as_ref()
        .map_or_else(|| unsafe { libc::getuid() }, |u| u.uid);
    let sb = Sandbox {
        run_as,
        kernel_log,
        program_fd: std::os::fd::AsRawFd::as_raw_fd(&prog.fd),
        cpu_secs: timeout.as_secs().saturating_add(2),
        max_processes: sandbox::process_limit(uid),
        confine,
    };

    let mut cmd = Command::new(prog.exec_path());
    cmd.arg0(program)
        .args(&argv[1..])
        .env_clear()
        .env("PATH", CHILD_PATH)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: `apply` makes only async-signal-safe system calls on values prepared before the
    // fork, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || sb.apply());
    }
    let spawned = cmd.spawn();
    drop(prog.fd);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => return failed(format!("cannot start {}: {e}", prog.path.display())),
    };
    let mut guard = GroupGuard {
        pgid: child.id().and_then(|p| i32::try_from(p).ok()),
    };
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let mut out = Capture::new(cap);
    let mut err = Capture::new(cap);
    let waited = tokio::time::timeout(timeout, async {
        tokio::join!(pump(stdout, &mut out), pump(stderr, &mut err));
        child.wait().await
    })
    .await;
    let mut notes = Vec::new();
    let status = match waited {
        Ok(Ok(st)) => {
            // Reaped: the group id may be reused from now on, so never signal it again.
            guard.pgid = None;
            if let Some(sig) = st.signal() {
                notes.push(format!("killed by signal {sig}"));
            }
            StepStatus::Done {
                exit_code: st.code(),
            }
        }
        Ok(Err(e)) => {
            guard.kill();
            StepStatus::Failed {
                error: format!("waiting for the program failed: {e}"),
            }
        }
        Err(_) => {
            // The leader is not reaped yet (its wait did not complete), so the group id is
            // still ours: kill every process in it, then reap the leader.
            guard.kill();
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
            StepStatus::TimedOut {
                after_ms: ms(timeout),
            }
        }
    };
    let (output, dropped) = combine(out, err, cap);
    notes.extend(interpret::program_notes(program, &output));
    Outcome {
        status,
        output,
        bytes_dropped: dropped,
        notes,
    }
}

/// stdout then stderr, together within the cap.
fn combine(out: Capture, err: Capture, cap: usize) -> (String, u64) {
    let mut bytes = out.kept;
    let mut dropped = out.dropped + err.dropped;
    let room = cap.saturating_sub(bytes.len());
    let take = room.min(err.kept.len());
    bytes.extend_from_slice(&err.kept[..take]);
    dropped += (err.kept.len() - take) as u64;
    (decode(&bytes), dropped)
}

/// Bytes to text of at most the same length: invalid UTF-8 and control characters become `?`
/// (NUL, the separator in /proc cmdline files, a space), so output can neither grow past its cap
/// nor drive a terminal.
pub(super) fn decode(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        s.push_str(&sanitize(chunk.valid()));
        s.extend(std::iter::repeat_n('?', chunk.invalid().len()));
    }
    s
}

/// Control characters other than newline and tab become `?` (NUL a space).
pub fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' | '\t' => c,
            '\0' => ' ',
            c if c.is_control() => '?',
            c => c,
        })
        .collect()
}

/// What reading one path gave.
enum FileRead {
    Text(Vec<u8>, u64),
    Dir(Vec<String>),
    Missing,
    Error(String),
    /// Not read: the pid belongs to another process now.
    Withheld,
}

/// The pid of a `/proc/PID/...` path.
fn proc_pid(logical: &str) -> Option<u32> {
    let rest = logical.strip_prefix("/proc/")?;
    rest.split('/').next()?.parse().ok()
}

fn physical(logical: &str, env: &RunbookEnv) -> Option<PathBuf> {
    if let Some(rest) = logical.strip_prefix("/sys/") {
        Some(env.sysfs_root.join(rest))
    } else {
        logical
            .strip_prefix("/proc/")
            .map(|rest| env.procfs_root.join(rest))
    }
}

fn read_one(path: &Path, room: usize) -> FileRead {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return FileRead::Missing,
        Err(e) => return FileRead::Error(e.to_string()),
    };
    if meta.is_dir() {
        return match std::fs::read_dir(path) {
            Ok(rd) => {
                let mut names: Vec<String> = rd
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                names.sort();
                FileRead::Dir(names)
            }
            Err(e) => FileRead::Error(e.to_string()),
        };
    }
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => return FileRead::Error(e.to_string()),
    };
    let mut kept = Vec::new();
    if let Err(e) = (&mut f).take(room as u64).read_to_end(&mut kept) {
        return FileRead::Error(e.to_string());
    }
    // Count, without keeping, what lies beyond the cap.
    let mut dropped = 0u64;
    let mut buf = [0u8; 8192];
    while dropped < MAX_COUNT_BYTES {
        match f.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => dropped += n as u64,
        }
    }
    FileRead::Text(kept, dropped)
}

async fn read_paths(
    paths: Vec<String>,
    claim: Option<Claim>,
    env: &RunbookEnv,
    timeout: Duration,
    cap: usize,
) -> Outcome {
    let env = env.clone();
    let work =
        tokio::task::spawn_blocking(move || read_paths_blocking(&paths, claim.as_ref(), &env, cap));
    match tokio::time::timeout(timeout, work).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => Outcome::status(StepStatus::Failed {
            error: format!("reading failed: {e}"),
        }),
        // A blocked sysfs read cannot be interrupted; the thread is left to finish.
        Err(_) => Outcome::status(StepStatus::TimedOut {
            after_ms: ms(timeout),
        }),
    }
}

fn read_paths_blocking(
    paths: &[String],
    claim: Option<&Claim>,
    env: &RunbookEnv,
    cap: usize,
) -> Outcome {
    // A pid the kernel reused: nothing under /proc/PID is read, and the evidence says why.
    let reused = claim.and_then(|c| c.check(&env.procfs_root).err().map(|note| (c.pid, note)));
    let mut reads = Vec::new();
    let mut room = cap;
    for logical in paths {
        let pid = proc_pid(logical);
        let r = match (safety::check_read_path(logical), physical(logical, env)) {
            _ if reused.as_ref().is_some_and(|(p, _)| pid == Some(*p)) => FileRead::Withheld,
            (Ok(()), Some(p)) if logical.ends_with("/cmdline") && pid.is_some() => {
                // A command line carries the job's secrets: program and option names only,
                // and the job it belongs to (see `process`).
                match read_one(&p, room) {
                    FileRead::Text(kept, more) => {
                        let pid = pid.map(|p| p.to_string()).unwrap_or_default();
                        let text = format!(
                            "{}\njob: {}\n",
                            process::render_cmdline(&kept, env.show_arguments),
                            process::job_line(&env.procfs_root, &pid)
                        );
                        let text = text.into_bytes();
                        let over = text.len().saturating_sub(room) as u64;
                        let kept = text[..text.len().min(room)].to_vec();
                        FileRead::Text(kept, more + over)
                    }
                    other => other,
                }
            }
            (Ok(()), Some(p)) => read_one(&p, room),
            (Err(r), _) => FileRead::Error(format!("refused: {}", r.reason)),
            (_, None) => FileRead::Error("not under /sys or /proc".into()),
        };
        if let FileRead::Text(kept, _) = &r {
            room = room.saturating_sub(kept.len());
        }
        reads.push((logical.as_str(), r));
    }

    let base = |p: &str| {
        p.trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or(p)
            .to_string()
    };
    let names: Vec<String> = paths.iter().map(|p| base(p)).collect();
    let unique = names
        .iter()
        .enumerate()
        .all(|(i, n)| !names[..i].contains(n));
    let label = |i: usize| {
        if unique {
            names[i].clone()
        } else {
            paths[i].clone()
        }
    };

    let mut output = String::new();
    let mut dropped = 0u64;
    let mut texts: Vec<(String, String)> = Vec::new();
    let mut missing = Vec::new();
    let mut errors = 0;
    let mut withheld = 0;
    let single = reads.len() == 1;
    for (i, (logical, r)) in reads.iter().enumerate() {
        match r {
            FileRead::Text(kept, more) => {
                let text = decode(kept);
                dropped += more;
                if single {
                    output.push_str(&text);
                } else if text.trim_end().contains('\n') {
                    output.push_str(&format!("==> {} <==\n{}\n", label(i), text.trim_end()));
                } else {
                    output.push_str(&format!("{}: {}\n", label(i), text.trim_end()));
                }
                texts.push((names[i].clone(), text));
            }
            FileRead::Dir(entries) => {
                let listing: String = entries
                    .iter()
                    .map(|e| format!("{}\n", sanitize(e)))
                    .collect();
                if single {
                    output.push_str(&listing);
                } else {
                    output.push_str(&format!("==> {}/ <==\n{listing}", label(i)));
                }
            }
            FileRead::Missing => {
                missing.push(*logical);
                if !single {
                    output.push_str(&format!("{}: (missing)\n", label(i)));
                }
            }
            FileRead::Error(e) => {
                errors += 1;
                output.push_str(&format!("{}: (cannot read: {e})\n", label(i)));
            }
            FileRead::Withheld => {
                withheld += 1;
                if !single {
                    output.push_str(&format!("{}: (not shown)\n", label(i)));
                }
            }
        }
    }
    if output.len() > cap {
        let mut cut = cap;
        while !output.is_char_boundary(cut) {
            cut -= 1;
        }
        dropped += (output.len() - cut) as u64;
        output.truncate(cut);
    }

    let mut notes = Vec::new();
    if let Some((_, note)) = &reused {
        if withheld > 0 {
            output.insert_str(0, &format!("{note}\n"));
            notes.push(note.clone());
        }
    }
    let files: Vec<(&str, &str)> = texts
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    notes.extend(sysfs::link_note(&files));
    notes.extend(sysfs::aer_notes(&files));
    for m in &missing {
        if let Some(note) = missing_note(m, env) {
            if !notes.contains(&note) {
                notes.push(note);
            }
        }
    }
    let status = if !missing.is_empty() && missing.len() == reads.len() {
        StepStatus::Missing {
            what: format!("no such file: {}", missing.join(", ")),
        }
    } else if errors == reads.len() {
        StepStatus::Failed {
            error: output.trim_end().to_string(),
        }
    } else {
        StepStatus::Done { exit_code: None }
    };
    Outcome {
        status,
        output,
        bytes_dropped: dropped,
        notes,
    }
}

/// What a missing file says: a device gone from the bus, a process that has exited.
fn missing_note(logical: &str, env: &RunbookEnv) -> Option<String> {
    let parts: Vec<&str> = logical.split('/').collect();
    if let ["", "sys", "bus", "pci", "devices", dev, ..] = parts.as_slice() {
        let dir = env.sysfs_root.join("bus/pci/devices").join(dev);
        if !dir.exists() {
            return Some(format!(
                "{dev} has no entry under /sys/bus/pci/devices: the device is not on the PCI bus \
                 (fallen off, or removed)"
            ));
        }
    }
    if let ["", "proc", pid, ..] = parts.as_slice() {
        if pid.bytes().all(|b| b.is_ascii_digit()) && !env.procfs_root.join(pid).exists() {
            return Some(format!("process {pid} is no longer running"));
        }
    }
    None
}

async fn nvml(
    q: NvmlQuery,
    pci: PciAddress,
    probe: Option<Arc<dyn NvmlProbe>>,
    timeout: Duration,
) -> Outcome {
    let Some(probe) = probe else {
        return Outcome::status(StepStatus::Skipped {
            reason: "NVML is not available".into(),
        });
    };
    let work = tokio::task::spawn_blocking(move || probe.query(q, pci));
    match tokio::time::timeout(timeout, work).await {
        Ok(Ok(Ok(text))) => Outcome {
            status: StepStatus::Done { exit_code: None },
            notes: super::interpret::nvml_notes(&text),
            output: sanitize(&text),
            bytes_dropped: 0,
        },
        Ok(Ok(Err(NvmlError::NotSupported))) => Outcome::status(StepStatus::Skipped {
            reason: format!("NVML does not support {q} on this GPU or driver"),
        }),
        Ok(Ok(Err(NvmlError::GpuNotFound))) => Outcome::status(StepStatus::Missing {
            what: format!("NVML has no GPU at {pci}"),
        }),
        Ok(Ok(Err(NvmlError::Failed(e)))) => Outcome::status(StepStatus::Failed {
            error: sanitize(&e),
        }),
        Ok(Err(e)) => Outcome::status(StepStatus::Failed {
            error: format!("the NVML query failed: {e}"),
        }),
        Err(_) => Outcome::status(StepStatus::TimedOut {
            after_ms: ms(timeout),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_keeps_length_and_neutralises() {
        let b = b"ok\n\x1b[2J\x00arg\xff\xfe\tend";
        let s = decode(b);
        assert_eq!(s, "ok\n?[2J arg??\tend");
        assert!(s.len() <= b.len());
        // A multi-byte character cut by the cap.
        let cut = &"é".as_bytes()[..1];
        assert_eq!(decode(cut), "?");
    }

    #[test]
    fn capture_counts_what_it_drops() {
        let mut c = Capture::new(5);
        c.push(b"abc");
        c.push(b"defgh");
        assert_eq!(c.kept, b"abcde");
        assert_eq!(c.dropped, 3);
        let mut e = Capture::new(5);
        e.push(b"XY");
        let (text, dropped) = combine(c, e, 5);
        assert_eq!(text, "abcde");
        assert_eq!(dropped, 5);
    }
}
