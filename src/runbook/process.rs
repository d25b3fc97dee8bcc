//! What the evidence says about the process a log line named: which program and which job, never
//! the values of its arguments, and nothing at all of a process that only has the same pid.
//!
//! A job's command line carries its secrets (`--api-key=...`, `--db-password ...`, a token as a
//! positional argument), and the evidence goes to chat channels, mail and report files. An on-call
//! needs the program and the job (Slurm job id, Kubernetes pod and container, systemd unit, from
//! /proc/PID/cgroup), not the values: [`render_cmdline`] shows the program, an interpreter's
//! script, and option names only, unless the operator opts in (`[runbooks] show_arguments`).
//!
//! A pid in a log line may since have been reused: [`Claim::check`] compares the process's
//! `comm` with the name the line carried, and its start time with the fault's kernel timestamp,
//! before anything of the process is quoted.

use std::path::Path;

use super::subject::Subject;

/// The kernel's `comm` holds at most 15 bytes (TASK_COMM_LEN 16, with its NUL); the Xid line's
/// `name=` is the same field, so both are compared on at most this many bytes.
const COMM_LEN: usize = 15;

/// Interpreters whose first script argument is shown: without it the page says only "python3".
const INTERPRETERS: &[&str] = &[
    "python", "python2", "python3", "perl", "ruby", "node", "bash", "sh", "lua", "php", "Rscript",
    "julia",
];

/// Endings that make an interpreter's argument its script (shown), not data (hidden).
const SCRIPT_ENDINGS: &[&str] = &[
    ".py", ".pl", ".rb", ".js", ".mjs", ".sh", ".lua", ".php", ".R", ".r", ".jl",
];

/// What the log line said about the process, to check a live process against before quoting it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub pid: u32,
    /// The `name=` of the Xid line, when it had one.
    pub name: Option<String>,
    /// The fault's kernel timestamp, microseconds since boot, when the line carried one.
    pub ts_usec: Option<u64>,
}

impl Claim {
    /// The subject's pid with its name and timestamp; `None` without a pid.
    pub fn of(subject: &Subject) -> Option<Claim> {
        Some(Claim {
            pid: subject.pid?,
            name: subject.process.clone(),
            ts_usec: subject.fault_ts_usec,
        })
    }

    /// `Err(note)` when the process now at this pid is not the one the line named: another
    /// `comm`, or started after the fault. `Ok` when it matches, or when there is nothing to
    /// compare (no process, or the line carried neither name nor timestamp).
    ///
    /// The start time (boot time, which counts suspend) is compared with the kernel log's clock
    /// (which does not), so across a suspend a process may look younger than it is and be
    /// withheld: the conservative side.
    pub fn check(&self, procfs_root: &Path) -> Result<(), String> {
        let dir = procfs_root.join(self.pid.to_string());
        let comm = read_comm(&dir);
        if let (Some(named), Some(now)) = (&self.name, &comm) {
            if !same_comm(named, now) {
                return Err(self.reused(now));
            }
        }
        if let Some(ts) = self.ts_usec {
            if let Some(start) = std::fs::read_to_string(dir.join("stat"))
                .ok()
                .and_then(|s| start_ticks(&s))
            {
                let hz = clock_ticks_per_sec();
                // Whole ticks since boot against the fault's time in ticks, rounded down: a
                // process started in the same tick as the fault is not called another.
                if start > ts / 1_000_000 * hz + (ts % 1_000_000) * hz / 1_000_000 {
                    return Err(self.reused(comm.as_deref().unwrap_or("started after the fault")));
                }
            }
        }
        Ok(())
    }

    fn reused(&self, now: &str) -> String {
        format!(
            "pid {} now belongs to another process ({}): nothing of it is shown",
            self.pid,
            safe_text(now, 64)
        )
    }
}

/// The process's `comm`, or the `Name:` of its status (a fixture tree may lack `comm`).
fn read_comm(dir: &Path) -> Option<String> {
    if let Ok(c) = std::fs::read(dir.join("comm")) {
        return Some(
            String::from_utf8_lossy(&c)
                .trim_end_matches('\n')
                .to_string(),
        );
    }
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Name:"))
        .map(|n| n.trim().to_string())
}

/// Equal on the first 15 bytes: the kernel cuts `comm`, and the Xid line prints that cut name.
pub fn same_comm(named: &str, comm: &str) -> bool {
    let cut = |s: &str| s.as_bytes()[..s.len().min(COMM_LEN)].to_vec();
    cut(named.trim()) == cut(comm.trim())
}

/// Field 22 of /proc/PID/stat, the start time in clock ticks since boot. The name (field 2) is in
/// parentheses and may hold spaces and `)`, so fields are counted after its last `)`.
pub fn start_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // After the name come field 3 (state) onwards: field 22 is the 20th.
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn clock_ticks_per_sec() -> u64 {
    // SAFETY: plain libc call without arguments.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&h| h > 0).unwrap_or(100)
}

/// At most `max` characters, anything but printable ASCII and common punctuation as `?`: names
/// from /proc are the process's own choice.
fn safe_text(s: &str, max: usize) -> String {
    s.chars()
        .take(max)
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect()
}

/// A command line (the NUL-separated /proc/PID/cmdline) for the page.
///
/// With `show_arguments`, every argument, space-separated. Otherwise:
/// - the program (argv\[0\]; of a rewritten argv\[0\] with spaces, its first word);
/// - for an interpreter (`python3`, `perl`, ...), its script: the first argument ending in a
///   script extension (`train.py`);
/// - an option's name: `--api-key=<value>` for `--k=v`, `-D<value>` for a short option with text
///   attached; an option name with characters other than letters, digits, `-`, `_`, `.` is
///   `<option>`;
/// - the first plain argument after an option, which may be its value, as `<value>`;
/// - other plain arguments counted: `<2 arguments>`; after `--` everything counts as plain.
pub fn render_cmdline(raw: &[u8], show_arguments: bool) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut args: Vec<&str> = text.trim_end_matches('\0').split('\0').collect();
    if show_arguments {
        return super::exec::text::sanitize(&args.join(" "));
    }
    if args.first().is_none_or(|a| a.is_empty()) {
        return "(no command line: a kernel thread or a process that is exiting)".into();
    }
    let first = args.remove(0);
    let mut words = first.split_whitespace();
    let program = words.next().unwrap_or_default().to_string();
    let rewritten: Vec<&str> = words.collect();
    // Words of a rewritten argv[0] come first, as plain arguments.
    let mut rest: Vec<&str> = rewritten;
    rest.extend(args);

    let base = program.rsplit('/').next().unwrap_or(&program);
    let interpreter = INTERPRETERS.iter().any(|i| {
        base == *i
            || base
                .strip_prefix(i)
                .is_some_and(|v| v.bytes().all(|b| b.is_ascii_digit() || b == b'.'))
    });

    let mut out = vec![safe_text(&program, 256)];
    let mut plain = 0usize;
    let mut after_option = false;
    let mut options_done = false;
    let mut script_shown = !interpreter;
    let flush = |out: &mut Vec<String>, plain: &mut usize| {
        match *plain {
            0 => {}
            1 => out.push("<1 argument>".into()),
            n => out.push(format!("<{n} arguments>")),
        }
        *plain = 0;
    };
    for a in rest {
        if !script_shown && !a.starts_with('-') && SCRIPT_ENDINGS.iter().any(|e| a.ends_with(e)) {
            flush(&mut out, &mut plain);
            out.push(safe_text(a, 256));
            script_shown = true;
            after_option = false;
            continue;
        }
        if !options_done && a == "--" {
            flush(&mut out, &mut plain);
            out.push("--".into());
            options_done = true;
            after_option = false;
            continue;
        }
        if !options_done && a.starts_with('-') && a.len() > 1 {
            flush(&mut out, &mut plain);
            out.push(option_name(a));
            // `--k=v` and `-xVALUE` carry their value; `--k` and `-x` may take the next one.
            let attached = a.contains('=') || (a.len() > 2 && !a.starts_with("--"));
            after_option = !attached;
            continue;
        }
        if after_option {
            out.push("<value>".into());
            after_option = false;
            continue;
        }
        plain += 1;
    }
    flush(&mut out, &mut plain);
    out.join(" ")
}

/// `--name`, `--name=<value>`, `-x`, `-x<value>`; a name with odd characters is `<option>`.
fn option_name(a: &str) -> String {
    let ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    };
    if let Some(long) = a.strip_prefix("--") {
        let (name, value) = match long.split_once('=') {
            Some((n, _)) => (n, true),
            None => (long, false),
        };
        return match (ok(name), value) {
            (true, true) => format!("--{name}=<value>"),
            (true, false) => format!("--{name}"),
            (false, true) => "--<option>=<value>".into(),
            (false, false) => "--<option>".into(),
        };
    }
    let mut chars = a[1..].chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphanumeric() => {
            if chars.as_str().is_empty() {
                format!("-{c}")
            } else {
                format!("-{c}<value>")
            }
        }
        _ => "-<option>".into(),
    }
}

/// The job a process belongs to, from its /proc/PID/cgroup: a Slurm job (and step), a Kubernetes
/// pod and container, or else a systemd unit. `None` when the cgroup names none of these.
pub fn job_identity(cgroup: &str) -> Option<String> {
    // Prefer the unified (v2) line `0::/path`; on v1 take the first path that says something.
    let mut paths: Vec<&str> = Vec::new();
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(_), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" {
            paths.insert(0, path);
        } else {
            paths.push(path);
        }
    }
    paths
        .iter()
        .find_map(|p| slurm(p).or_else(|| kubernetes(p)))
        .or_else(|| paths.iter().find_map(|p| systemd_unit(p)))
}

fn digits(s: &str) -> Option<&str> {
    (!s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit())).then_some(s)
}

/// `/slurm/uid_1000/job_12345/step_0/task_0` (v1) or `/system.slice/slurmstepd.scope/job_12345/
/// step_batch/user/task_0` (v2).
fn slurm(path: &str) -> Option<String> {
    let parts: Vec<&str> = path.split('/').collect();
    let i = parts
        .iter()
        .position(|p| p.strip_prefix("job_").and_then(digits).is_some())?;
    let job = parts[i].strip_prefix("job_")?;
    let step = parts
        .get(i + 1)
        .and_then(|s| s.strip_prefix("step_"))
        .filter(|s| {
            !s.is_empty()
                && s.len() <= 32
                && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        });
    Some(match step {
        Some(s) => format!("Slurm job {job}, step {s}"),
        None => format!("Slurm job {job}"),
    })
}

/// `/kubepods/burstable/pod<uid>/<container>` (cgroupfs) or `/kubepods.slice/kubepods-burstable.
/// slice/kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope` (systemd).
fn kubernetes(path: &str) -> Option<String> {
    if !path.contains("kubepods") {
        return None;
    }
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let uid_ok = |u: &str| {
        u.len() >= 8 && u.len() <= 64 && u.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
    };
    let (i, pod) = parts.iter().enumerate().find_map(|(i, p)| {
        let p = p.strip_suffix(".slice").unwrap_or(p);
        let uid = p.rsplit_once("pod").map(|(_, u)| u.replace('_', "-"))?;
        uid_ok(&uid).then_some((i, uid))
    })?;
    let container = parts.get(i + 1).and_then(|c| {
        let c = c.strip_suffix(".scope").unwrap_or(c);
        let id = ["cri-containerd-", "docker-", "crio-", "containerd-"]
            .iter()
            .find_map(|pre| c.strip_prefix(pre))
            .unwrap_or(c);
        (id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id[..12].to_string())
    });
    Some(match container {
        Some(c) => format!("Kubernetes pod {pod}, container {c}"),
        None => format!("Kubernetes pod {pod}"),
    })
}

/// The innermost `.service` or `.scope` component: `systemd unit train.service`.
fn systemd_unit(path: &str) -> Option<String> {
    let unit = path
        .split('/')
        .rev()
        .find(|p| p.ends_with(".service") || p.ends_with(".scope"))?;
    let ok = unit.len() <= 128
        && unit
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@:\\".contains(&b));
    ok.then(|| format!("systemd unit {unit}"))
}

/// The job line for a process, from `<procfs_root>/<pid>/cgroup`.
pub fn job_line(procfs_root: &Path, pid: &str) -> String {
    match std::fs::read_to_string(procfs_root.join(pid).join("cgroup")) {
        Ok(c) => match job_identity(&c) {
            Some(j) => j,
            None => "no Slurm job, Kubernetes pod or systemd unit in its cgroup".into(),
        },
        Err(_) => "(its cgroup cannot be read)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<u8> {
        let mut v = args.join("\0").into_bytes();
        v.push(0);
        v
    }

    #[test]
    fn option_values_and_arguments_are_never_shown() {
        let raw = argv(&[
            "/usr/bin/python3",
            "train.py",
            "--api-key=SECRET1",
            "--db-password",
            "SECRET2",
            "positional-secret",
        ]);
        assert_eq!(
            render_cmdline(&raw, false),
            "/usr/bin/python3 train.py --api-key=<value> --db-password <value> <1 argument>"
        );
        assert_eq!(
            render_cmdline(&raw, true),
            "/usr/bin/python3 train.py --api-key=SECRET1 --db-password SECRET2 positional-secret"
        );
        assert_eq!(
            render_cmdline(&argv(&["python3", "-u", "train.py", "--lr", "0.1"]), false),
            "python3 -u train.py --lr <value>"
        );
        // Not an interpreter: its first argument is not a script.
        assert_eq!(
            render_cmdline(
                &argv(&["./sim", "run.py", "tok", "-psecret", "--", "-x"]),
                false
            ),
            "./sim <2 arguments> -p<value> -- <1 argument>"
        );
        assert_eq!(
            render_cmdline(&argv(&["java", "-Dpass=x", "--$(x)=y", "--a b=c"]), false),
            "java -D<value> --<option>=<value> --<option>=<value>"
        );
        // A rewritten argv[0]: only its first word.
        assert_eq!(
            render_cmdline(b"worker: token=abc user", false),
            "worker: <2 arguments>"
        );
        assert!(render_cmdline(b"", false).starts_with("(no command line"));
    }

    #[test]
    fn the_job_comes_from_the_cgroup() {
        assert_eq!(
            job_identity("12:memory:/slurm/uid_1000/job_12345/step_0/task_0\n0::/\n").as_deref(),
            Some("Slurm job 12345, step 0")
        );
        assert_eq!(
            job_identity("0::/system.slice/slurmstepd.scope/job_777/step_batch/user/task_0\n")
                .as_deref(),
            Some("Slurm job 777, step batch")
        );
        assert_eq!(
            job_identity(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_aaaa_bbbb_cccc_0123456789ab.slice/cri-containerd-0123456789abcdef0123456789abcdef.scope\n"
            )
            .as_deref(),
            Some("Kubernetes pod 1b2c3d4e-aaaa-bbbb-cccc-0123456789ab, container 0123456789ab")
        );
        assert_eq!(
            job_identity("11:cpu:/kubepods/besteffort/pod1b2c3d4e-aaaa-bbbb-cccc-0123456789ab/docker-fedcba9876543210fedcba.scope\n")
                .as_deref(),
            Some("Kubernetes pod 1b2c3d4e-aaaa-bbbb-cccc-0123456789ab, container fedcba987654")
        );
        assert_eq!(
            job_identity("0::/system.slice/train.service\n").as_deref(),
            Some("systemd unit train.service")
        );
        assert_eq!(
            job_identity("0::/user.slice/user-1000.slice/session-3.scope\n").as_deref(),
            Some("systemd unit session-3.scope")
        );
        assert_eq!(job_identity("0::/\n"), None);
        assert_eq!(job_identity("garbage"), None);
        assert_eq!(job_identity("0::/system.slice/$(x).service"), None);
    }

    #[test]
    fn comm_and_start_time() {
        assert!(same_comm("python3", "python3"));
        assert!(same_comm("gpu-feature-discovery", "gpu-feature-dis"));
        assert!(!same_comm("python3", "systemd"));
        let stat =
            "4242 (py thon) 3) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10";
        assert_eq!(start_ticks(stat), Some(98765));
        assert_eq!(start_ticks("garbage"), None);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("7");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("comm"), "python3\n").unwrap();
        let hz = clock_ticks_per_sec();
        std::fs::write(
            p.join("stat"),
            format!(
                "7 (python3) S 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {} 1 1",
                50 * hz
            ),
        )
        .unwrap();
        let claim = |name: &str, secs: u64| Claim {
            pid: 7,
            name: Some(name.into()),
            ts_usec: Some(secs * 1_000_000),
        };
        assert_eq!(claim("python3", 60).check(dir.path()), Ok(()));
        let e = claim("python3", 40).check(dir.path()).unwrap_err();
        assert!(
            e.starts_with("pid 7 now belongs to another process (python3)"),
            "{e}"
        );
        let e = claim("trainer", 60).check(dir.path()).unwrap_err();
        assert!(e.contains("(python3)"), "{e}");
        assert_eq!(claim("python3", 60).check(&dir.path().join("none")), Ok(()));
    }
}
