//! Who holds a GPU: the processes NVML lists on it, looked up in procfs, for the "GPU held by
//! nobody" checks and the fabric registration check.
//!
//! NVML only gives pids. Whether such a pid is a live process, a zombie, or no process at all in
//! xidwatch's pid namespace is procfs's answer, and so are the names an on-call needs to find the
//! owner: the program (`comm`, never its arguments, which may hold secrets), the user, and the
//! job from the cgroup (the same parser the runbooks use, [`job_identity`]). The lookup happens
//! on the health task's blocking thread, after the NVML worker has answered, so the worker never
//! waits on the filesystem.
//!
//! The episodes here follow the other checks' rule (a window before a report, one report per
//! episode) with one addition: an episode ends only when the GPU has been free for a whole
//! window too, so a holder that comes and goes between polls is not reported again and again.

use std::path::Path;
use std::time::Duration;

use crate::runbook::process::job_identity;
use crate::source::nvml::health::{GpuProcess, GpuReading};
/// Defined beside the readings they describe, so the source needs nothing from here.
pub use crate::source::nvml::health::{Liveness, ProcLook};

/// Fills in [`GpuProcess::look`] for every process of every reading.
pub fn look_up(readings: &mut [GpuReading], procfs_root: &Path) {
    for r in readings {
        for p in r.procs.iter_mut().flatten() {
            p.look = Some(look(procfs_root, p.pid));
        }
    }
}

/// Reads `<procfs_root>/<pid>/{stat,status,comm,cgroup}`. Unreadable parts stay `None`.
pub fn look(procfs_root: &Path, pid: u32) -> ProcLook {
    let dir = procfs_root.join(pid.to_string());
    if pid == 0 || !dir.is_dir() {
        return ProcLook {
            state: Liveness::Absent,
            ..ProcLook::default()
        };
    }
    let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
    // The name (field 2) is in parentheses and may hold spaces and `)`: the state follows the
    // last `)`.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("");
    let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let zombie = state == "Z" || field("State:").first().is_some_and(|s| s == "Z");
    let uid = field("Uid:").first().and_then(|u| u.parse::<u32>().ok());
    let ns_pid = field("NSpid:")
        .last()
        .and_then(|n| n.parse::<u32>().ok())
        .filter(|n| *n != pid);
    let comm = std::fs::read(dir.join("comm"))
        .ok()
        .map(|c| clean(String::from_utf8_lossy(&c).trim_end_matches('\n')))
        .or_else(|| field("Name:").first().map(|n| clean(n)))
        .or_else(|| {
            // A zombie's status may be gone while its stat still names it.
            let (_, after) = stat.split_once('(')?;
            let (name, _) = after.rsplit_once(')')?;
            Some(clean(name))
        });
    let job = std::fs::read_to_string(dir.join("cgroup"))
        .ok()
        .and_then(|c| job_identity(&c));
    ProcLook {
        state: if zombie {
            Liveness::Zombie
        } else {
            Liveness::Running
        },
        comm,
        uid,
        user: uid.and_then(user_name),
        job,
        ns_pid,
    }
}

/// At most 32 characters, anything but printable ASCII as `?`: a process names itself.
fn clean(s: &str) -> String {
    s.chars()
        .take(32)
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect()
}

/// The user database's name for `uid` (`getpwuid_r`), or `None`.
fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: all-zero is a valid `passwd` (null pointers, zero ids); it is only read after
    // getpwuid_r filled it.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: `pw`, `buf` (with its true length) and `out` are valid for the call; the strings
    // it points `pw` at live in `buf`, which outlives their use below.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() || pw.pw_name.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r succeeded, so `pw_name` is a NUL-terminated string inside `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) };
    Some(clean(&name.to_string_lossy()))
}

/// One process for people: `pid 4242 (python3, user alice (uid 1000), Slurm job 12345), 2048 MiB`.
pub fn describe(p: &GpuProcess) -> String {
    let mem = p
        .used
        .map_or_else(String::new, |b| format!(", {} MiB", b >> 20));
    let kind = if p.graphics { " graphics" } else { "" };
    let Some(l) = &p.look else {
        return format!("pid {}{kind}{mem}", p.pid);
    };
    let mut parts: Vec<String> = Vec::new();
    match l.state {
        Liveness::Absent => {
            return format!(
                "pid {}{kind}{mem}: no such process in xidwatch's pid namespace (it exited, or it runs in a pid namespace xidwatch cannot see)",
                p.pid
            )
        }
        Liveness::Zombie => parts.push("zombie: exited, not reaped".into()),
        Liveness::Running => {}
    }
    if let Some(c) = &l.comm {
        parts.push(c.clone());
    }
    match (&l.user, l.uid) {
        (Some(u), Some(id)) => parts.push(format!("user {u} (uid {id})")),
        (None, Some(id)) => parts.push(format!("uid {id}")),
        _ => {}
    }
    if let Some(j) = &l.job {
        parts.push(j.clone());
    }
    if let Some(n) = l.ns_pid {
        parts.push(format!("pid {n} in its own pid namespace"));
    }
    format!("pid {}{kind} ({}){mem}", p.pid, parts.join(", "))
}

/// One check's episode: when its condition began, whether it was reported, and since when the
/// GPU has been free of it.
#[derive(Debug, Clone, Default)]
pub struct Episode {
    pub since: Option<Duration>,
    pub told: bool,
    pub free_since: Option<Duration>,
}

/// What one poll did to an episode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Nothing,
    /// The condition has held for the whole window: report it.
    Raise,
    /// The condition has been gone for the whole window: the episode is over.
    Ended,
}

impl Episode {
    /// One poll: `on` is whether the condition holds now. A report needs `raise` of the
    /// condition, the end of a reported episode `clear` without it.
    pub fn step(&mut self, on: bool, now: Duration, raise: Duration, clear: Duration) -> Step {
        if on {
            self.free_since = None;
            let since = *self.since.get_or_insert(now);
            if !self.told && now.saturating_sub(since) >= raise {
                self.told = true;
                return Step::Raise;
            }
            return Step::Nothing;
        }
        self.since = None;
        if !self.told {
            return Step::Nothing;
        }
        let free = *self.free_since.get_or_insert(now);
        if now.saturating_sub(free) >= clear {
            self.told = false;
            self.free_since = None;
            return Step::Ended;
        }
        Step::Nothing
    }

    /// How long the condition has held, at `now`.
    pub fn held(&self, now: Duration) -> Duration {
        self.since.map_or(Duration::ZERO, |s| now.saturating_sub(s))
    }
}

/// One process's memory since it last fell: when that was, its bytes then, and the latest.
#[derive(Debug, Clone, Copy)]
pub struct Growth {
    pub since: Duration,
    pub from: u64,
    pub last: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn procfs_tells_running_zombie_and_absent_and_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir_all(p.join("4242")).unwrap();
        std::fs::write(p.join("4242/stat"), "4242 (py thon) x) S 1 1 1\n").unwrap();
        std::fs::write(p.join("4242/comm"), "python3\n").unwrap();
        std::fs::write(
            p.join("4242/status"),
            "Name:\tpython3\nState:\tS (sleeping)\nUid:\t54321\t54321\t54321\t54321\nNSpid:\t4242\t17\n",
        )
        .unwrap();
        std::fs::write(
            p.join("4242/cgroup"),
            "0::/system.slice/slurmstepd.scope/job_12345/step_0/user/task_0\n",
        )
        .unwrap();
        std::fs::create_dir_all(p.join("4343")).unwrap();
        std::fs::write(p.join("4343/stat"), "4343 (trainer) Z 1 1 1\n").unwrap();
        let live = look(p, 4242);
        assert_eq!(live.state, Liveness::Running);
        assert_eq!(live.comm.as_deref(), Some("python3"));
        assert_eq!(live.uid, Some(54321));
        assert_eq!(live.ns_pid, Some(17));
        assert!(
            live.job.as_deref().unwrap_or("").contains("12345"),
            "{live:?}"
        );
        assert_eq!(look(p, 4343).state, Liveness::Zombie);
        assert_eq!(look(p, 4444).state, Liveness::Absent);
        let text = describe(&GpuProcess {
            pid: 4242,
            used: Some(2048 << 20),
            graphics: false,
            look: Some(live),
        });
        assert!(text.starts_with("pid 4242 (python3, "), "{text}");
        assert!(text.contains("uid 54321"), "{text}");
        assert!(text.contains("pid 17 in its own pid namespace"), "{text}");
        assert!(text.ends_with("2048 MiB"), "{text}");
    }

    #[test]
    fn an_episode_needs_its_window_to_begin_and_to_end() {
        let s = Duration::from_secs;
        let w = s(10);
        let mut e = Episode::default();
        assert_eq!(e.step(true, s(0), w, w), Step::Nothing);
        assert_eq!(e.step(false, s(5), w, w), Step::Nothing, "a spike");
        assert_eq!(e.step(true, s(6), w, w), Step::Nothing);
        assert_eq!(e.step(true, s(16), w, w), Step::Raise);
        assert_eq!(e.step(true, s(20), w, w), Step::Nothing, "once");
        assert_eq!(e.step(false, s(21), w, w), Step::Nothing);
        assert_eq!(e.step(true, s(22), w, w), Step::Nothing, "back: not again");
        assert_eq!(e.step(false, s(23), w, w), Step::Nothing);
        assert_eq!(e.step(false, s(33), w, w), Step::Ended);
    }
}
