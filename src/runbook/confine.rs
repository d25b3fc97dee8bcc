//! The kernel's confinement of every runbook step: the guarantee behind the catalog.
//!
//! The catalog (`safety`) is the first line: it refuses any argv that is not exactly a known
//! read-only command. This module is the second, and the one that holds whatever the step turns
//! out to be (an operator's `allow` entry, a script, a shell, an interpreter): under the shipped
//! unit a step has the daemon's own uid, so the uid is no boundary and the kernel must be.
//!
//! - **Landlock**: read access to the program and library directories, `/proc`, `/sys`, the
//!   journal and a short list of files under `/etc` (never `/etc/xidwatch`); nothing may be
//!   written, truncated, created, removed or renamed anywhere. TCP bind and connect are denied;
//!   signals and abstract UNIX sockets are scoped to the step (ABI 6), and Landlock always keeps a
//!   step from tracing or reading the memory or environment of any process outside it. Only the
//!   shipped `nvidia-smi` patterns may also open the NVIDIA device files (NVML's ioctls), and only
//!   kernel-log patterns may read `/dev/kmsg`.
//! - **seccomp**: sockets other than UNIX ones (and those only for the patterns that talk to the
//!   system bus; netlink only for `ip`), ptrace and cross-process memory, the module, mount,
//!   reboot, kexec, swap, clock, keyring, BPF and io_uring calls fail with `EPERM`; `syslog(2)` may
//!   only read; where Landlock cannot scope signals, the signal calls are denied too.
//! - An empty working directory that no longer exists, so a relative path names nothing and
//!   nothing can be created in it; resource limits on processes, memory, file size, CPU time.
//!
//! Everything is prepared in the parent (the ruleset is a descriptor, the filter a vector); the
//! forked child only makes async-signal-safe system calls on it ([`Confinement::apply`]).

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

// Landlock's ABI (include/uapi/linux/landlock.h).
const CREATE_RULESET_VERSION: u32 = 1;
const RULE_PATH_BENEATH: libc::c_int = 1;
const FS_EXECUTE: u64 = 1 << 0;
const FS_WRITE_FILE: u64 = 1 << 1;
const FS_READ_FILE: u64 = 1 << 2;
const FS_READ_DIR: u64 = 1 << 3;
const FS_TRUNCATE: u64 = 1 << 14;
const FS_IOCTL_DEV: u64 = 1 << 15;
const NET_BIND_TCP: u64 = 1 << 0;
const NET_CONNECT_TCP: u64 = 1 << 1;
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
const SCOPE_SIGNAL: u64 = 1 << 1;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// Every filesystem access right the kernel's Landlock ABI knows: all of them are handled, so
/// whatever a rule does not grant is denied.
fn handled_fs(abi: u32) -> u64 {
    let mut all = (1u64 << 13) - 1; // ABI 1: execute .. make_sym
    if abi >= 2 {
        all |= 1 << 13; // refer
    }
    if abi >= 3 {
        all |= FS_TRUNCATE;
    }
    if abi >= 5 {
        all |= FS_IOCTL_DEV;
    }
    all
}

/// What the kernel offers, probed once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Support {
    /// Landlock's ABI version, `None` when the kernel (or a system call filter around this
    /// process) refuses it.
    pub landlock_abi: Option<u32>,
    /// Whether a seccomp filter can be installed.
    pub seccomp: bool,
}

impl Support {
    /// The kernel this process runs on.
    pub fn probe() -> Support {
        static PROBED: OnceLock<Support> = OnceLock::new();
        *PROBED.get_or_init(|| {
            // SAFETY: the documented probe: no attribute, size 0, the version flag.
            let abi = unsafe {
                libc::syscall(
                    libc::SYS_landlock_create_ruleset,
                    std::ptr::null::<RulesetAttr>(),
                    0usize,
                    CREATE_RULESET_VERSION,
                )
            };
            // SAFETY: plain prctl; it fails with EINVAL on a kernel without seccomp.
            let seccomp = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) } >= 0
                && filter_arch().is_some();
            Support {
                landlock_abi: u32::try_from(abi).ok().filter(|a| *a >= 1),
                seccomp,
            }
        })
    }

    /// Whether an operator's `[runbooks] allow` entry may run: only inside Landlock, which is
    /// what makes an unknown program harmless.
    pub fn allows_operator_programs(&self) -> bool {
        self.landlock_abi.is_some()
    }
}

impl fmt::Display for Support {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.landlock_abi {
            Some(abi) => {
                write!(f, "Landlock ABI {abi} (read-only files")?;
                if abi >= 4 {
                    f.write_str(", no TCP")?;
                }
                if abi >= 6 {
                    f.write_str(", signals and abstract sockets scoped")?;
                }
                f.write_str(")")?;
            }
            None => f.write_str(
                "no Landlock (the kernel or a system call filter refuses it): shipped patterns run under the uid drop and seccomp only, and [runbooks] allow entries are refused",
            )?,
        }
        if self.seccomp {
            f.write_str(", seccomp filter")
        } else {
            f.write_str(", no seccomp filter")
        }
    }
}

/// What a pattern needs beyond reading files: decided by the shipped catalog, never by an
/// operator's entry, which gets none of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    /// Open the NVIDIA device files and issue ioctls on them (NVML inside `nvidia-smi`).
    pub gpu_devices: bool,
    /// Read `/dev/kmsg` and `syslog(2)`'s read actions (dmesg).
    pub kernel_log: bool,
    /// A UNIX socket to the system bus (systemctl).
    pub system_bus: bool,
    /// A netlink socket to read the link table (ip).
    pub netlink: bool,
}

/// Directories whose programs and libraries a step may read and execute.
const EXEC_ROOTS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32",
];
/// Trees a step may read: what the read-only checks look at.
const READ_TREES: &[&str] = &[
    "/proc",
    "/sys",
    "/var/log/journal",
    "/run/log/journal",
    "/run/systemd",
    "/etc/modprobe.d",
    "/etc/depmod.d",
    "/etc/iproute2",
    "/etc/terminal-colors.d",
    "/etc/ld.so.conf.d",
];
/// Single files under `/etc` a program may need (the loader, user and group names, time zone,
/// the journal's machine id); `/etc` as a whole is not readable, so neither is the
/// configuration with its secrets.
const READ_FILES: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/localtime",
    "/etc/machine-id",
    "/etc/os-release",
    "/etc/hostname",
    "/dev/urandom",
    "/dev/random",
    "/dev/zero",
];

/// The confinement of one step, prepared in the parent.
pub struct Confinement {
    ruleset: Option<OwnedFd>,
    filter: Vec<libc::sock_filter>,
    workdir: Option<RawFd>,
}

impl fmt::Debug for Confinement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Confinement")
            .field("landlock", &self.ruleset.is_some())
            .field("seccomp_instructions", &self.filter.len())
            .finish()
    }
}

impl Confinement {
    /// Builds the ruleset and the filter for a step with `needs`, whose program lies in one of
    /// `program_dirs`. An error means the kernel refused a ruleset it said it supports: the step
    /// does not run.
    pub fn prepare(
        needs: Needs,
        program_dirs: &[PathBuf],
        support: Support,
    ) -> Result<Confinement, String> {
        let ruleset = match support.landlock_abi {
            Some(abi) => Some(ruleset(abi, needs, program_dirs)?),
            None => None,
        };
        let signals_scoped = support.landlock_abi.is_some_and(|a| a >= 6);
        let truncate_handled = support.landlock_abi.is_some_and(|a| a >= 3);
        let filter = if support.seccomp {
            filter(needs, signals_scoped, truncate_handled)
        } else {
            Vec::new()
        };
        let workdir = empty_workdir();
        if let (Some(rs), Some(dir)) = (&ruleset, workdir) {
            add_rule(
                rs,
                dir,
                FS_READ_FILE | FS_READ_DIR,
                Path::new("the working directory"),
            )?;
        }
        Ok(Confinement {
            ruleset,
            filter,
            workdir,
        })
    }

    /// Runs in the forked child, after no_new_privs: async-signal-safe calls only, no
    /// allocation. Any failure stops the program from running.
    pub fn apply(&self) -> io::Result<()> {
        let check = |rc: libc::c_long| {
            if rc < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        // SAFETY (this block): plain system calls on descriptors and memory owned by `self`.
        unsafe {
            match self.workdir {
                Some(fd) => check(libc::fchdir(fd).into())?,
                None => check(libc::chdir(c"/".as_ptr()).into())?,
            }
            if let Some(rs) = &self.ruleset {
                check(libc::syscall(
                    libc::SYS_landlock_restrict_self,
                    rs.as_raw_fd(),
                    0u32,
                ))?;
            }
            if !self.filter.is_empty() {
                let prog = libc::sock_fprog {
                    len: self.filter.len() as u16,
                    filter: self.filter.as_ptr() as *mut libc::sock_filter,
                };
                check(
                    libc::prctl(
                        libc::PR_SET_SECCOMP,
                        libc::SECCOMP_MODE_FILTER,
                        &prog as *const libc::sock_fprog,
                        0,
                        0,
                    )
                    .into(),
                )?;
            }
        }
        Ok(())
    }
}

fn ruleset(abi: u32, needs: Needs, program_dirs: &[PathBuf]) -> Result<OwnedFd, String> {
    let attr = RulesetAttr {
        handled_access_fs: handled_fs(abi),
        handled_access_net: if abi >= 4 {
            NET_BIND_TCP | NET_CONNECT_TCP
        } else {
            0
        },
        scoped: if abi >= 6 {
            SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
        } else {
            0
        },
    };
    // SAFETY: a valid attribute of the size given; the descriptor is owned below.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        )
    };
    if fd < 0 {
        return Err(format!(
            "the kernel refused a Landlock ruleset: {}",
            io::Error::last_os_error()
        ));
    }
    // SAFETY: a descriptor just returned to this process and owned by nobody else.
    let rs = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let dir_read = FS_READ_FILE | FS_READ_DIR;
    let exec = dir_read | FS_EXECUTE;
    for root in EXEC_ROOTS {
        allow(&rs, Path::new(root), exec)?;
    }
    for dir in program_dirs {
        allow(&rs, dir, exec)?;
    }
    for tree in READ_TREES {
        allow(&rs, Path::new(tree), dir_read)?;
    }
    for file in READ_FILES {
        allow(&rs, Path::new(file), FS_READ_FILE)?;
    }
    // Programs open /dev/null for writing as a matter of course; it holds nothing.
    allow(&rs, Path::new("/dev/null"), FS_READ_FILE | FS_WRITE_FILE)?;
    if needs.kernel_log {
        allow(&rs, Path::new("/dev/kmsg"), FS_READ_FILE)?;
    }
    if needs.gpu_devices {
        let dev = FS_READ_FILE | FS_WRITE_FILE | (if abi >= 5 { FS_IOCTL_DEV } else { 0 });
        for path in nvidia_device_files() {
            allow(&rs, &path, dev)?;
        }
    }
    Ok(rs)
}

/// `/dev/nvidia*` and `/dev/nvidia-caps/*` as they exist now.
fn nvidia_device_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let list = |dir: &Path, prefix: &str, out: &mut Vec<PathBuf>| {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                let name = e.file_name();
                let is_char = e
                    .file_type()
                    .is_ok_and(|t| std::os::unix::fs::FileTypeExt::is_char_device(&t));
                if is_char && name.to_string_lossy().starts_with(prefix) {
                    out.push(e.path());
                }
            }
        }
    };
    list(Path::new("/dev"), "nvidia", &mut out);
    list(Path::new("/dev/nvidia-caps"), "nvidia", &mut out);
    out
}

/// Adds a rule for `path` (absent paths are skipped: not every machine has every tree). Rights
/// that only make sense on directories are dropped for a file.
fn allow(rs: &OwnedFd, path: &Path, access: u64) -> Result<(), String> {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return Ok(());
    };
    // SAFETY: a valid C string; the descriptor is closed below.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Ok(());
    }
    // SAFETY: just opened, owned here.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    add_rule(rs, fd.as_raw_fd(), access, path)
}

/// Grants `access` beneath the file or directory open at `fd`.
fn add_rule(rs: &OwnedFd, fd: RawFd, access: u64, path: &Path) -> Result<(), String> {
    let is_dir = std::fs::metadata(format!("/proc/self/fd/{fd}"))
        .map(|m| m.is_dir())
        .unwrap_or(false);
    let file_rights = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV;
    let attr = PathBeneathAttr {
        allowed_access: if is_dir { access } else { access & file_rights },
        parent_fd: fd,
    };
    // SAFETY: a valid attribute for RULE_PATH_BENEATH on a ruleset this process owns.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            rs.as_raw_fd(),
            RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0u32,
        )
    };
    if rc < 0 {
        return Err(format!(
            "the kernel refused a Landlock rule for {}: {}",
            path.display(),
            io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// An empty directory only root (or this user) could change, readable by the step's user and
/// writable by nobody: a step's working directory, so a relative path names nothing. Made once
/// per process in the temporary directory and removed when the process exits (a SIGKILL leaves
/// it behind; the unit's private /tmp goes with the service).
fn empty_workdir() -> Option<RawFd> {
    static DIR: OnceLock<Option<(OwnedFd, CString)>> = OnceLock::new();
    extern "C" fn remove_at_exit() {
        if let Some(Some((_, path))) = DIR.get() {
            // SAFETY: a valid C string; removing an empty directory this process made.
            unsafe { libc::rmdir(path.as_ptr()) };
        }
    }
    DIR.get_or_init(|| {
        let mut template = std::env::temp_dir()
            .join("xidwatch-step-XXXXXX")
            .into_os_string()
            .into_encoded_bytes();
        template.push(0);
        // SAFETY: a writable NUL-terminated template, as mkdtemp wants.
        let made = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
        if made.is_null() {
            return None;
        }
        let path = CString::from_vec_with_nul(template).ok()?;
        // SAFETY: a valid C string naming the directory just made.
        let fd = unsafe {
            libc::chmod(path.as_ptr(), 0o555);
            libc::open(
                path.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            // SAFETY: as above.
            unsafe { libc::rmdir(path.as_ptr()) };
            return None;
        }
        // SAFETY: registering a plain function.
        unsafe { libc::atexit(remove_at_exit) };
        // SAFETY: just opened, owned here for the life of the process.
        Some((unsafe { OwnedFd::from_raw_fd(fd) }, path))
    })
    .as_ref()
    .map(|(fd, _)| fd.as_raw_fd())
}

// ---------------------------------------------------------------------------------------------
// seccomp

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;
const RET_K: u16 = 0x06;
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const OFF_ARG0: u32 = 16;

#[cfg(target_arch = "x86_64")]
fn filter_arch() -> Option<u32> {
    Some(0xC000_003E)
}
#[cfg(target_arch = "aarch64")]
fn filter_arch() -> Option<u32> {
    Some(0xC000_00B7)
}
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn filter_arch() -> Option<u32> {
    None
}

/// System calls no read-only check needs: tracing and other processes' memory, modules, mounts
/// and namespaces, power, kexec, swap, clocks, keyrings, BPF, io_uring (whose operations no
/// filter sees), and raw I/O.
fn denied_calls() -> Vec<libc::c_long> {
    let mut v = vec![
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_pidfd_getfd,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_chroot,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_open_tree,
        libc::SYS_move_mount,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        libc::SYS_reboot,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_clock_settime,
        libc::SYS_clock_adjtime,
        libc::SYS_settimeofday,
        libc::SYS_adjtimex,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_keyctl,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_sethostname,
        libc::SYS_setdomainname,
        libc::SYS_acct,
        libc::SYS_quotactl,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_fanotify_init,
        libc::SYS_vhangup,
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        libc::SYS_iopl,
        libc::SYS_ioperm,
        libc::SYS_uselib,
        libc::SYS__sysctl,
    ]);
    v
}

/// Signal calls, denied where Landlock cannot scope them to the step.
fn signal_calls() -> Vec<libc::c_long> {
    vec![
        libc::SYS_kill,
        libc::SYS_tkill,
        libc::SYS_tgkill,
        libc::SYS_rt_sigqueueinfo,
        libc::SYS_rt_tgsigqueueinfo,
        libc::SYS_pidfd_send_signal,
    ]
}

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

fn errno(e: i32) -> u32 {
    RET_ERRNO | (e as u32 & 0xffff)
}

/// The filter: the architecture checked first (another ABI's numbers would mean other calls),
/// then each denied call, then `socket` by family and `syslog` by action, else allow. Each test
/// jumps at most a few instructions, so no offset can overflow.
fn filter(needs: Needs, signals_scoped: bool, truncate_handled: bool) -> Vec<libc::sock_filter> {
    let Some(arch) = filter_arch() else {
        return Vec::new();
    };
    let deny = errno(libc::EPERM);
    let mut f = vec![
        stmt(LD_W_ABS, OFF_ARCH),
        jump(JEQ_K, arch, 1, 0),
        stmt(RET_K, RET_KILL_PROCESS),
        stmt(LD_W_ABS, OFF_NR),
    ];
    #[cfg(target_arch = "x86_64")]
    {
        // x32 calls share the architecture value and set this bit.
        f.push(jump(JGE_K, 0x4000_0000, 0, 1));
        f.push(stmt(RET_K, deny));
    }
    let mut denied = denied_calls();
    if !signals_scoped {
        denied.extend(signal_calls());
    }
    if !truncate_handled {
        denied.extend([libc::SYS_truncate, libc::SYS_ftruncate]);
    }
    for nr in denied {
        f.push(jump(JEQ_K, nr as u32, 0, 1));
        f.push(stmt(RET_K, deny));
    }
    // socket(family, ...): UNIX for the system bus, netlink for ip, nothing else.
    let mut families = Vec::new();
    if needs.system_bus {
        families.push(libc::AF_UNIX as u32);
    }
    if needs.netlink {
        families.push(libc::AF_NETLINK as u32);
    }
    let block = 2 + 2 * families.len() as u8;
    f.push(jump(JEQ_K, libc::SYS_socket as u32, 0, block));
    f.push(stmt(LD_W_ABS, OFF_ARG0));
    for fam in families {
        f.push(jump(JEQ_K, fam, 0, 1));
        f.push(stmt(RET_K, RET_ALLOW));
    }
    f.push(stmt(RET_K, errno(libc::EAFNOSUPPORT)));
    // syslog(action, ...): read the whole buffer or its sizes (3, 9, 10); never clear, consume or
    // change the console (dmesg -C, -c, -n).
    let reads = [3u32, 9, 10];
    f.push(jump(
        JEQ_K,
        libc::SYS_syslog as u32,
        0,
        2 + 2 * reads.len() as u8,
    ));
    f.push(stmt(LD_W_ABS, OFF_ARG0));
    for a in reads {
        f.push(jump(JEQ_K, a, 0, 1));
        f.push(stmt(RET_K, RET_ALLOW));
    }
    f.push(stmt(RET_K, deny));
    f.push(stmt(RET_K, RET_ALLOW));
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_fits_and_every_jump_lands_inside_it() {
        for needs in [
            Needs::default(),
            Needs {
                gpu_devices: true,
                kernel_log: true,
                system_bus: true,
                netlink: true,
            },
        ] {
            for (scoped, trunc) in [(true, true), (false, false)] {
                let f = filter(needs, scoped, trunc);
                assert!(f.len() < u16::MAX as usize);
                for (i, ins) in f.iter().enumerate() {
                    if ins.code == JEQ_K || ins.code == JGE_K {
                        let far = i + 1 + usize::from(ins.jt.max(ins.jf));
                        assert!(far < f.len(), "instruction {i} jumps out");
                    }
                }
                assert_eq!(f.last().map(|i| (i.code, i.k)), Some((RET_K, RET_ALLOW)));
            }
        }
    }

    /// On a kernel without Landlock the shipped catalog still runs, with what the kernel offers:
    /// the filter, the working directory and the rest of the sandbox.
    #[test]
    fn without_landlock_a_step_still_gets_the_filter() {
        let c = Confinement::prepare(
            Needs::default(),
            &[],
            Support {
                landlock_abi: None,
                seccomp: true,
            },
        )
        .unwrap();
        assert!(c.ruleset.is_none());
        assert!(!c.filter.is_empty());
    }

    #[test]
    fn support_is_described_plainly() {
        let none = Support {
            landlock_abi: None,
            seccomp: false,
        };
        assert!(!none.allows_operator_programs());
        assert!(none.to_string().contains("allow entries are refused"));
        let full = Support {
            landlock_abi: Some(7),
            seccomp: true,
        };
        assert!(full.allows_operator_programs());
        assert_eq!(
            full.to_string(),
            "Landlock ABI 7 (read-only files, no TCP, signals and abstract sockets scoped), seccomp filter"
        );
    }
}
