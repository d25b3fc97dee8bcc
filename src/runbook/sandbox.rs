//! What the operating system enforces around every runbook program, whatever the catalog says.
//!
//! - The program is resolved once, in absolute directories, to a file that only root (or the user
//!   running xidwatch) can change and whose real name is the program's; it is opened and run
//!   through that descriptor (`/proc/self/fd/N`), so a symlink or a swapped file cannot change
//!   what runs between the check and the exec.
//!   Its directory and every directory above it must be writable only by root (or this user; a
//!   sticky world-writable parent such as `/tmp` protects the entries in it), and a program with
//!   more than one hard link runs only if it is a known multi-call binary, since a hard link
//!   carries another program's identity under a catalog name.
//! - The child runs as an unprivileged user when xidwatch is root (the service user `xidwatch`,
//!   else `nobody`), with `PR_SET_NO_NEW_PRIVS`, no capability except CAP_SYSLOG for patterns
//!   that read the kernel log, and resource limits: no core files, no file of any size written
//!   (`RLIMIT_FSIZE = 0`), bounded CPU time, descriptors, processes and address space. The
//!   limits are set with `prlimit64`, which the shipped unit's system call filter allows.
//! - Then the kernel's confinement ([`super::confine`]) closes around it.
//!
//! The work inside the forked child ([`Sandbox::apply`]) uses only async-signal-safe system calls
//! on values prepared before the fork.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Real names a program may have behind a symlink: kmod answers to `lsmod` and `modinfo`
/// (through argv[0], which is always set to the program's name).
const ALIASES: &[(&str, &str)] = &[("lsmod", "kmod"), ("modinfo", "kmod")];

/// Programs that are one file under many names by design; a hard link to one of them is not a
/// disguise.
const MULTI_CALL: &[&str] = &["kmod", "busybox", "toybox", "coreutils"];

/// Address space a step may map: far more than any read-only check uses.
const MAX_ADDRESS_SPACE: u64 = 4 << 30;
/// Processes a step may start, beyond those its user already has.
const MAX_NEW_PROCESSES: u64 = 64;

const CAP_SYSLOG: u32 = 34;
const CAP_LAST: u32 = 63;

/// A program found and opened; what runs is this descriptor.
#[derive(Debug)]
pub struct Program {
    pub fd: OwnedFd,
    /// Where it was found, for messages.
    pub path: PathBuf,
    /// The directory of the file itself, behind any symlink: the step may execute from there.
    pub real_dir: PathBuf,
}

impl Program {
    /// The path that executes the descriptor itself.
    pub fn exec_path(&self) -> String {
        format!("/proc/self/fd/{}", self.fd.as_raw_fd())
    }
}

/// Why a program cannot run.
#[derive(Debug)]
pub enum NotRun {
    Missing(String),
    Refused(String),
}

/// Finds `program` in `dirs` (absolute directories only) and opens it.
pub fn resolve(program: &str, dirs: &[PathBuf]) -> Result<Program, NotRun> {
    for dir in dirs {
        if !dir.is_absolute() {
            return Err(NotRun::Refused(format!(
                "the search directory {} is relative; only absolute directories are searched",
                dir.display()
            )));
        }
        let path = dir.join(program);
        if std::fs::symlink_metadata(&path).is_err() {
            continue;
        }
        let real_dir = std::fs::canonicalize(dir).map_err(|e| {
            NotRun::Refused(format!("refused: search directory {}: {e}", dir.display()))
        })?;
        check_dir_chain(&real_dir)?;
        let (fd, real_dir) = open_checked(program, &path)?;
        return Ok(Program { fd, path, real_dir });
    }
    let shown: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    Err(NotRun::Missing(format!(
        "{program} is not installed (searched {})",
        shown.join(":")
    )))
}

/// Whether someone other than root or this user could change what `meta` holds: its owner, a
/// group other than root's or ours with write access, or anyone with write access.
fn others_can_write(meta: &std::fs::Metadata) -> bool {
    // SAFETY: plain syscalls.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let group_writable = meta.mode() & 0o020 != 0 && meta.gid() != 0 && meta.gid() != egid;
    meta.mode() & 0o002 != 0 || group_writable || (meta.uid() != 0 && meta.uid() != euid)
}

/// A search directory and every directory above it must be writable only by root or this user:
/// whoever can write to one can rename another program onto a catalog name. A sticky parent
/// (`/tmp`) keeps others from replacing entries they do not own, so it may be world-writable;
/// the search directory itself may not.
fn check_dir_chain(dir: &Path) -> Result<(), NotRun> {
    let mut at = Some(dir);
    let mut own = true;
    while let Some(d) = at {
        let meta = std::fs::metadata(d).map_err(|e| {
            NotRun::Refused(format!("refused: search directory {}: {e}", d.display()))
        })?;
        let sticky = meta.mode() & 0o1000 != 0;
        if others_can_write(&meta) && (own || !sticky) {
            return Err(NotRun::Refused(format!(
                "refused: {} (owner uid {}, mode {:o}) is writable by others, who could put another program under a catalog name{}",
                d.display(),
                meta.uid(),
                meta.mode() & 0o7777,
                if own { "" } else { &", above the search directory" }
            )));
        }
        own = false;
        at = d.parent();
    }
    Ok(())
}

/// Opens the program behind `path` and checks it is what its name says and that only root (or
/// this user) could change it or its directory; returns it with that directory.
fn open_checked(program: &str, path: &Path) -> Result<(OwnedFd, PathBuf), NotRun> {
    let refused = |why: String| NotRun::Refused(format!("refused: {}: {why}", path.display()));
    let real = std::fs::canonicalize(path).map_err(|e| refused(e.to_string()))?;
    let real_dir = real.parent().map(Path::to_path_buf).unwrap_or_default();
    check_dir_chain(&real_dir)?;
    let name = real
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if name != program && !ALIASES.contains(&(program, name)) {
        return Err(refused(format!(
            "resolves to {}, another program",
            real.display()
        )));
    }
    let c = CString::new(real.as_os_str().as_encoded_bytes())
        .map_err(|_| refused("a NUL in the path".into()))?;
    // SAFETY: a valid C string; the returned descriptor is owned below.
    let raw = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if raw < 0 {
        return Err(refused(io::Error::last_os_error().to_string()));
    }
    // SAFETY: `raw` is a descriptor this function just opened and nobody else owns.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    let meta =
        std::fs::metadata(format!("/proc/self/fd/{raw}")).map_err(|e| refused(e.to_string()))?;
    if !meta.is_file() || meta.mode() & 0o111 == 0 {
        return Err(refused("not executable".into()));
    }
    if meta.nlink() > 1 && !MULTI_CALL.contains(&name) {
        return Err(refused(format!(
            "it has {} hard links: a hard link gives another program a catalog name; only multi-call binaries ({}) may have more than one",
            meta.nlink(),
            MULTI_CALL.join(", ")
        )));
    }
    // Writable by others, by a group other than root's or ours, or owned by someone else: that
    // someone could change what runs.
    if others_can_write(&meta) {
        return Err(refused(format!(
            "others could change it (owner uid {}, mode {:o}); only root's (or xidwatch's own) files run",
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    Ok((fd, real_dir))
}

/// The unprivileged user children run as when xidwatch is root.
#[derive(Debug, Clone)]
pub struct RunAs {
    pub name: String,
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    pub groups: Vec<libc::gid_t>,
}

/// `None` when xidwatch is not root (children keep its unprivileged user); the user to switch
/// to when it is; an error when it is root and neither `xidwatch` nor `nobody` exists.
pub fn run_as() -> Result<Option<RunAs>, String> {
    static TARGET: OnceLock<Result<Option<RunAs>, String>> = OnceLock::new();
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    TARGET
        .get_or_init(|| {
            let user = lookup_user("xidwatch")
                .or_else(|| lookup_user("nobody"))
                .ok_or("xidwatch runs as root and neither user xidwatch nor nobody exists: runbook programs are not run as root")?;
            Ok(Some(user))
        })
        .clone()
}

fn lookup_user(name: &str) -> Option<RunAs> {
    let cname = CString::new(name).ok()?;
    // SAFETY: `passwd` is plain data (integers and pointers), for which all zeroes is valid.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; the buffer outlives the use of `pw`.
    let rc = unsafe {
        libc::getpwnam_r(
            cname.as_ptr(),
            &mut pw,
            buf.as_mut_ptr(),
            buf.len(),
            &mut out,
        )
    };
    // A user that is root by uid or group is no drop at all.
    if rc != 0 || out.is_null() || pw.pw_uid == 0 || pw.pw_gid == 0 {
        return None;
    }
    let (uid, gid) = (pw.pw_uid, pw.pw_gid);
    let mut groups = vec![gid];
    if name == "xidwatch" {
        // The groups the service unit gives it: its own, and the journal's.
        let mut list = vec![0 as libc::gid_t; 64];
        let mut n = list.len() as libc::c_int;
        // SAFETY: `list` holds `n` entries.
        if unsafe { libc::getgrouplist(cname.as_ptr(), gid, list.as_mut_ptr(), &mut n) } >= 0 {
            list.truncate(n.max(0) as usize);
            groups = list;
        }
        let journal = CString::new("systemd-journal").ok()?;
        // SAFETY: a valid C string; the result is read at once.
        let gr = unsafe { libc::getgrnam(journal.as_ptr()) };
        if !gr.is_null() {
            // SAFETY: non-null, and read before any other call can reuse the static entry.
            groups.push(unsafe { (*gr).gr_gid });
        }
    }
    groups.retain(|g| *g != 0);
    Some(RunAs {
        name: name.to_string(),
        uid,
        gid,
        groups,
    })
}

/// Everything the child does to itself before exec, prepared before the fork.
#[derive(Debug)]
pub struct Sandbox {
    pub run_as: Option<RunAs>,
    pub kernel_log: bool,
    /// The program's descriptor, kept open across exec so a script's interpreter can read it.
    pub program_fd: i32,
    pub cpu_secs: u64,
    /// Processes the step's user may have in all ([`process_limit`]).
    pub max_processes: u64,
    /// Landlock and seccomp, applied last.
    pub confine: super::confine::Confinement,
}

/// The `RLIMIT_NPROC` for a step running as `uid`: the kernel counts every process and thread
/// of the user, so the limit is what the user has now plus [`MAX_NEW_PROCESSES`].
pub fn process_limit(uid: libc::uid_t) -> u64 {
    let mut have = 0u64;
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let name = e.file_name();
            if !name.as_encoded_bytes().iter().all(u8::is_ascii_digit) {
                continue;
            }
            let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
                continue;
            };
            let field = |key: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(key))
                    .and_then(|v| v.split_whitespace().next())
                    .and_then(|v| v.parse::<u64>().ok())
            };
            if field("Uid:") == Some(u64::from(uid)) {
                have += field("Threads:").unwrap_or(1);
            }
        }
    }
    have + MAX_NEW_PROCESSES
}

impl Sandbox {
    /// Runs in the forked child: async-signal-safe system calls only, no allocation.
    ///
    /// As root, every call must succeed or the program does not run. As another user (the
    /// service, under its unit's system call filter, which refuses `capset` with EPERM; the
    /// limits go through `prlimit64`, which it allows), an EPERM from `capset` or a limit is
    /// tolerated: the ambient set, through which the daemon's CAP_SYSLOG would reach the
    /// program, is then cleared directly, and no_new_privs keeps file capabilities and
    /// set-user-ID bits from granting anything. The confinement ([`super::confine`]) is never
    /// tolerated to fail.
    pub fn apply(&self) -> io::Result<()> {
        let root = self.run_as.is_some();
        let check = |rc: libc::c_long| {
            if rc < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        let filtered = |e: &io::Error| !root && e.raw_os_error() == Some(libc::EPERM);
        let limit = |res: libc::__rlimit_resource_t, n: u64| {
            let l = libc::rlimit64 {
                rlim_cur: n,
                rlim_max: n,
            };
            // SAFETY: plain syscall on a valid struct; prlimit64, not setrlimit, because the
            // unit's filter (~@resources) refuses setrlimit but not prlimit64.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_prlimit64,
                    0,
                    res,
                    &l as *const libc::rlimit64,
                    std::ptr::null_mut::<libc::rlimit64>(),
                )
            };
            match check(rc) {
                Err(e) if !filtered(&e) => Err(e),
                _ => Ok(()),
            }
        };
        limit(libc::RLIMIT_CORE, 0)?;
        limit(libc::RLIMIT_FSIZE, 0)?;
        limit(libc::RLIMIT_NOFILE, 1024)?;
        limit(libc::RLIMIT_CPU, self.cpu_secs)?;
        limit(libc::RLIMIT_AS, MAX_ADDRESS_SPACE)?;
        limit(libc::RLIMIT_NPROC, self.max_processes)?;
        // SAFETY (this block): plain syscalls on values owned by `self`.
        unsafe {
            if root {
                // Keep the permitted set across setuid, to hand CAP_SYSLOG on where needed.
                check(libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0).into())?;
            }
            // Without CAP_SETPCAP (not root) this fails, and the bounding set stays as it is.
            for cap in 0..=CAP_LAST {
                if !(self.kernel_log && cap == CAP_SYSLOG) {
                    libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0);
                }
            }
            if let Some(u) = &self.run_as {
                check(libc::setgroups(u.groups.len(), u.groups.as_ptr()).into())?;
                check(libc::setgid(u.gid).into())?;
                check(libc::setuid(u.uid).into())?;
                if libc::getuid() == 0 || libc::geteuid() == 0 {
                    return Err(io::Error::from_raw_os_error(libc::EPERM));
                }
            }
            match set_caps(self.kernel_log) {
                Err(e) if filtered(&e) => {
                    if !self.kernel_log {
                        check(
                            libc::prctl(
                                libc::PR_CAP_AMBIENT,
                                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                                0,
                                0,
                                0,
                            )
                            .into(),
                        )?;
                    }
                }
                r => r?,
            }
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0).into())?;
            check(libc::fcntl(self.program_fd, libc::F_SETFD, 0).into())?;
        }
        self.confine.apply()
    }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Leaves no capability, or only CAP_SYSLOG (also ambient, so it survives exec) when the step
/// reads the kernel log and this process has it.
unsafe fn set_caps(keep_syslog: bool) -> io::Result<()> {
    let hdr = CapHeader {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    if libc::syscall(libc::SYS_capget, &hdr, data.as_mut_ptr()) < 0 {
        return Err(io::Error::last_os_error());
    }
    let bit = 1u32 << (CAP_SYSLOG - 32);
    let keep = keep_syslog && data[1].permitted & bit != 0;
    let v = if keep { bit } else { 0 };
    let new = [
        CapData::default(),
        CapData {
            effective: v,
            permitted: v,
            inheritable: v,
        },
    ];
    if libc::syscall(libc::SYS_capset, &hdr, new.as_ptr()) < 0 {
        return Err(io::Error::last_os_error());
    }
    libc::prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL,
        0,
        0,
        0,
    );
    if keep {
        let raise = libc::PR_CAP_AMBIENT_RAISE;
        if libc::prctl(
            libc::PR_CAP_AMBIENT,
            raise,
            CAP_SYSLOG as libc::c_ulong,
            0,
            0,
        ) < 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Makes this process non-dumpable, so that programs running as the same user (the service
/// user, under systemd) cannot read its memory or `/proc/<pid>/environ`.
pub fn protect_self() {
    // SAFETY: plain syscall.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
}
