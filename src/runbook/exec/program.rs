//! `run` steps: a program from its argv, matched again as filled in, resolved and confined
//! (see `sandbox` and `confine`), its output read as it comes up to a cap, its process group
//! killed on timeout or when the step is abandoned.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

use crate::model::StepStatus;
use crate::runbook::confine::{Confinement, Support};
use crate::runbook::interpret;
use crate::runbook::safety::Pattern;
use crate::runbook::sandbox::{self, NotRun, Sandbox};

use super::env::CHILD_PATH;
use super::outcome::{ms, Outcome};
use super::text::decode;

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

pub(super) async fn run_program(
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

#[cfg(test)]
mod tests {
    use super::*;

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
