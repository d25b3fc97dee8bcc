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

mod env;
mod outcome;
mod program;
mod read;
pub(crate) mod text;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::model::{Evidence, PciAddress, StepResult, StepStatus};

use super::excerpt;
use super::excerpt::KmsgSpec;
use super::interpret;
use super::nvml::{NvmlError, NvmlProbe, NvmlQuery};
use super::process::Claim;
use super::render::secs;
use super::safety::Pattern;
use super::sandbox;
use super::subject::Subject;
use super::sysfs;
use super::template::{Placeholder, Template, Values};
use super::{Action, Runbook, Step};

pub use env::{RunLimits, RunbookEnv, CHILD_PATH};
use outcome::{ms, Outcome};
use program::run_program;
use read::read_paths;
pub use text::sanitize;

/// What a step will do once its placeholders are filled.
enum Job {
    Run(Vec<String>, Option<Arc<Pattern>>),
    /// Paths, and what the log line said about its process (checked before /proc/PID is quoted).
    Read(Vec<String>, Option<Claim>),
    Nvml(NvmlQuery, PciAddress),
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
