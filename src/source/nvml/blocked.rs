//! Tasks in uninterruptible sleep (D state), read from procfs: the evidence of a wedged driver.
//!
//! When an NVML call hangs, the driver holds a lock or waits on the GPU, and every task that calls
//! into it stops in D state: xidwatch's own NVML worker, `nvidia-smi`, the jobs. Their `wchan`
//! (the kernel function they sleep in) and kernel stacks say where, which is what the on-call (and
//! NVIDIA support) asks for first. `stack` is readable by root only; without it `wchan` still
//! names the spot.
//!
//! Reads from a configurable root (`/proc` in production) so tests use a fake tree. Bounded: at
//! most [`MAX_TASKS`] tasks of [`MAX_FRAMES`] frames are kept, the rest are counted.

use std::path::Path;

use crate::model::BlockedTask;

/// Tasks listed in full; beyond that they are counted.
pub const MAX_TASKS: usize = 32;
/// Kernel stack frames kept per task, innermost first.
pub const MAX_FRAMES: usize = 24;
/// What is read of one procfs file: `stat`, `wchan` and `stack` are all far smaller.
const MAX_FILE_BYTES: u64 = 16 * 1024;

/// What a scan found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Scan {
    pub tasks: Vec<BlockedTask>,
    /// D-state tasks beyond [`MAX_TASKS`].
    pub omitted: usize,
    /// Why the scan could not be done, when it could not (procfs unreadable).
    pub note: Option<String>,
}

/// Every task (thread) in D state under `procfs`, in pid then tid order.
pub fn scan(procfs: &Path) -> Scan {
    let mut out = Scan::default();
    let entries = match std::fs::read_dir(procfs) {
        Ok(e) => e,
        Err(e) => {
            out.note = Some(format!(
                "cannot list {} for tasks in D state: {e}",
                procfs.display()
            ));
            return out;
        }
    };
    let mut pids: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    for pid in pids {
        let dir = procfs.join(pid.to_string());
        // A D-state thread of a multi-threaded job hides behind a sleeping main thread in
        // /proc/PID/stat, so every thread is looked at; a tree without `task` has the process only.
        let mut tids: Vec<u32> = match std::fs::read_dir(dir.join("task")) {
            Ok(e) => e
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect(),
            Err(_) => vec![pid],
        };
        tids.sort_unstable();
        for tid in tids {
            let tdir = if dir.join("task").is_dir() {
                dir.join("task").join(tid.to_string())
            } else {
                dir.clone()
            };
            // A task that exits meanwhile is simply not there any more.
            let Some(stat) = read_small(&tdir.join("stat")) else {
                continue;
            };
            let Some((comm, state)) = parse_stat(&stat) else {
                continue;
            };
            if state != 'D' {
                continue;
            }
            if out.tasks.len() == MAX_TASKS {
                out.omitted += 1;
                continue;
            }
            let wchan = read_small(&tdir.join("wchan"))
                .map(|w| w.trim().to_string())
                .filter(|w| !w.is_empty() && w != "0");
            let stack = read_small(&tdir.join("stack"))
                .map(|s| parse_stack(&s))
                .unwrap_or_default();
            out.tasks.push(BlockedTask {
                pid,
                tid,
                comm,
                wchan,
                stack,
            });
        }
    }
    out
}

/// One line for people: `D-state task: pid 4242 tid 4250 (python3) in os_acquire_mutex; stack:
/// a <- b <- c`.
pub fn describe(t: &BlockedTask) -> String {
    let mut s = format!("D-state task: pid {}", t.pid);
    if t.tid != t.pid {
        s.push_str(&format!(" tid {}", t.tid));
    }
    s.push_str(&format!(" ({})", t.comm));
    if let Some(w) = &t.wchan {
        s.push_str(&format!(" in {w}"));
    }
    if !t.stack.is_empty() {
        s.push_str(&format!("; stack: {}", t.stack.join(" <- ")));
    }
    s
}

fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    let f = std::fs::File::open(path).ok()?;
    let mut buf = Vec::new();
    f.take(MAX_FILE_BYTES).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// `1234 (some (odd) name) D 1 ...`: the name may hold spaces and parentheses, so the state is
/// the first field after the last `)`.
fn parse_stat(stat: &str) -> Option<(String, char)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    let state = stat.get(close + 1..)?.trim_start().chars().next()?;
    Some((comm, state))
}

/// `[<0>] os_acquire_mutex+0x2b/0x40 [nvidia]` -> `os_acquire_mutex+0x2b/0x40 [nvidia]`.
fn parse_stack(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| {
            let l = l.trim();
            match l.strip_prefix("[<").and_then(|r| r.split_once(">]")) {
                Some((_, frame)) => frame.trim(),
                None => l,
            }
        })
        .filter(|l| !l.is_empty())
        .take(MAX_FRAMES)
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(root: &Path, pid: u32, tid: Option<u32>, stat: &str, extra: &[(&str, &str)]) {
        let mut d = root.join(pid.to_string());
        if let Some(t) = tid {
            d = d.join("task").join(t.to_string());
        }
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("stat"), stat).unwrap();
        for (name, text) in extra {
            std::fs::write(d.join(name), text).unwrap();
        }
    }

    #[test]
    fn lists_d_state_threads_with_wchan_and_stack() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        task(root, 1, None, "1 (systemd) S 0 1 1", &[]);
        // A job whose main thread sleeps while one of its threads is stuck in the driver.
        task(root, 4242, Some(4242), "4242 (python3) S 1", &[]);
        task(
            root,
            4242,
            Some(4250),
            "4250 (pt (main) x) D 1 4242",
            &[
                ("wchan", "os_acquire_mutex"),
                (
                    "stack",
                    "[<0>] os_acquire_mutex+0x2b/0x40 [nvidia]\n[<0>] rm_ioctl+0x5e/0xa0 [nvidia]\n",
                ),
            ],
        );
        task(root, 77, None, "77 (nvidia-smi) D 1", &[("wchan", "0")]);
        std::fs::create_dir_all(root.join("self")).unwrap();
        let s = scan(root);
        assert_eq!(s.omitted, 0);
        assert_eq!(s.note, None);
        assert_eq!(
            s.tasks,
            vec![
                BlockedTask {
                    pid: 77,
                    tid: 77,
                    comm: "nvidia-smi".into(),
                    wchan: None,
                    stack: vec![],
                },
                BlockedTask {
                    pid: 4242,
                    tid: 4250,
                    comm: "pt (main) x".into(),
                    wchan: Some("os_acquire_mutex".into()),
                    stack: vec![
                        "os_acquire_mutex+0x2b/0x40 [nvidia]".into(),
                        "rm_ioctl+0x5e/0xa0 [nvidia]".into()
                    ],
                },
            ]
        );
        assert_eq!(
            describe(&s.tasks[1]),
            "D-state task: pid 4242 tid 4250 (pt (main) x) in os_acquire_mutex; stack: os_acquire_mutex+0x2b/0x40 [nvidia] <- rm_ioctl+0x5e/0xa0 [nvidia]"
        );
    }

    #[test]
    fn bounded_and_says_why_when_unreadable() {
        let t = tempfile::tempdir().unwrap();
        for pid in 100..(100 + MAX_TASKS as u32 + 5) {
            task(t.path(), pid, None, &format!("{pid} (w) D 1"), &[]);
        }
        let s = scan(t.path());
        assert_eq!((s.tasks.len(), s.omitted), (MAX_TASKS, 5));
        let none = scan(&t.path().join("absent"));
        assert!(none.tasks.is_empty());
        assert!(none.note.unwrap().contains("cannot list"));
    }
}
