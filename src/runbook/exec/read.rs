//! `read` steps: files and directories under /sys and /proc (as the environment roots them),
//! each checked against the safety rules, kept up to a cap; a process's command line as program
//! and option names; notes on what a missing file means.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::model::StepStatus;
use crate::runbook::process::{self, Claim};
use crate::runbook::safety;
use crate::runbook::sysfs;

use super::env::RunbookEnv;
use super::outcome::{ms, Outcome};
use super::text::{decode, sanitize};

/// How far a file is read to count what was dropped past the cap.
const MAX_COUNT_BYTES: u64 = 64 * 1024 * 1024;

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

pub(super) async fn read_paths(
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
