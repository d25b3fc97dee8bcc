//! The refusal rules: why a runbook step could change the machine, decided before it ever runs
//! (pure).
//!
//! xidwatch promises never to reboot, reset, unload or reconfigure anything. The loader checks
//! every step against these rules and refuses the whole runbook when one step breaks one. The
//! rules hold whatever the configured allowlist says: adding `reboot` to the allowlist does not
//! make `reboot` runnable. Where a program has read-only and writing forms (nvidia-smi, systemctl,
//! dmesg, ip, ...), the read-only forms are listed and everything else is refused, so an option
//! this code has never heard of is refused rather than trusted.
//!
//! Placeholder values cannot defeat these checks: they never start with `-` and never contain `/`,
//! `=` or spaces (see `template.rs`), and a placeholder may not appear in an option's name.

use std::collections::BTreeSet;
use std::fmt;

use super::template::Template;

/// One refusal rule. Each has at least one test showing it refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// The program must be a plain, literal name, looked up in the search path.
    ProgramName,
    /// A placeholder may fill an option's value, never its name.
    OptionPlaceholder,
    /// reboot, shutdown, poweroff, halt, kexec, suspend, `systemctl reboot`, IPMI power control.
    PowerState,
    /// systemctl (and `service`) other than read-only verbs.
    ServiceControl,
    /// rmmod, modprobe, insmod, depmod, DKMS other than `status`.
    KernelModules,
    /// nvidia-smi options and subcommands that write (reset, persistence, power limit, ECC mode,
    /// compute mode, MIG, clocks, ...), and other NVIDIA tools that change GPU state.
    GpuControl,
    /// Direct hardware access: setpci, lspci's whole-config-space dumps and direct access modes.
    HardwareAccess,
    /// Programs that write files (tee, dd, cp, rm, ...) and shell redirections.
    WritesFiles,
    /// Clearing the kernel log, changing the console level, vacuuming or rotating the journal.
    LogControl,
    /// Changing network, sysctl, host name, clock or other system settings.
    SystemSettings,
    /// Sending signals to processes.
    Kill,
    /// Shells, interpreters and programs that launch other programs.
    Shell,
    /// Reading outside /sys and /proc, or through `..`.
    ReadPath,
    /// Files whose reading has side effects or exposes secrets (/proc/kmsg, environ, kcore, ...).
    SensitivePath,
    /// The program is not on the configured allowlist.
    NotAllowlisted,
}

impl Rule {
    pub const ALL: [Rule; 15] = [
        Rule::ProgramName,
        Rule::OptionPlaceholder,
        Rule::PowerState,
        Rule::ServiceControl,
        Rule::KernelModules,
        Rule::GpuControl,
        Rule::HardwareAccess,
        Rule::WritesFiles,
        Rule::LogControl,
        Rule::SystemSettings,
        Rule::Kill,
        Rule::Shell,
        Rule::ReadPath,
        Rule::SensitivePath,
        Rule::NotAllowlisted,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Rule::ProgramName => "program-name",
            Rule::OptionPlaceholder => "option-placeholder",
            Rule::PowerState => "power-state",
            Rule::ServiceControl => "service-control",
            Rule::KernelModules => "kernel-modules",
            Rule::GpuControl => "gpu-control",
            Rule::HardwareAccess => "hardware-access",
            Rule::WritesFiles => "writes-files",
            Rule::LogControl => "log-control",
            Rule::SystemSettings => "system-settings",
            Rule::Kill => "kill",
            Rule::Shell => "shell",
            Rule::ReadPath => "read-path",
            Rule::SensitivePath => "sensitive-path",
            Rule::NotAllowlisted => "not-allowlisted",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a step was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub rule: Rule,
    pub reason: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}]", self.reason, self.rule)
    }
}

fn refuse<T>(rule: Rule, reason: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal {
        rule,
        reason: reason.into(),
    })
}

/// Programs a runbook may run unless the configuration says otherwise.
pub const DEFAULT_ALLOWED: &[&str] = &[
    "cat",
    "date",
    "dkms",
    "dmesg",
    "free",
    "hostname",
    "ip",
    "journalctl",
    "ls",
    "lscpu",
    "lsmod",
    "lspci",
    "modinfo",
    "nvidia-smi",
    "ps",
    "readlink",
    "stat",
    "systemctl",
    "uname",
    "uptime",
];

/// Which programs runbooks may run. The refusal rules apply on top, whatever this allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafetyPolicy {
    allowed: BTreeSet<String>,
}

impl Default for SafetyPolicy {
    fn default() -> Self {
        SafetyPolicy::new(DEFAULT_ALLOWED.iter().copied())
    }
}

impl SafetyPolicy {
    /// A policy allowing exactly these program names.
    pub fn new<I, S>(allowed: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        SafetyPolicy {
            allowed: allowed.into_iter().map(Into::into).collect(),
        }
    }

    pub fn allows(&self, program: &str) -> bool {
        self.allowed.contains(program)
    }

    pub fn allowed(&self) -> impl Iterator<Item = &str> {
        self.allowed.iter().map(String::as_str)
    }
}

/// Checks a `run` step's argv.
pub fn check_run(argv: &[Template], policy: &SafetyPolicy) -> Result<(), Refusal> {
    let Some(first) = argv.first() else {
        return refuse(Rule::ProgramName, "run = [] names no program");
    };
    let Some(program) = first.as_literal() else {
        return refuse(
            Rule::ProgramName,
            format!("the program name {first} may not contain a placeholder"),
        );
    };
    check_program_name(program)?;
    for t in &argv[1..] {
        let prefix = t.literal_prefix();
        if t.placeholders().next().is_some() && prefix.starts_with('-') && !prefix.contains('=') {
            return refuse(
                Rule::OptionPlaceholder,
                format!(
                    "{t}: a placeholder may fill an option's value (--opt={{pci}}), not its name"
                ),
            );
        }
    }
    let args: Vec<String> = argv[1..].iter().map(|t| t.to_string()).collect();
    for a in &args {
        if let Some(redirect) = shell_syntax(a) {
            return refuse(
                Rule::WritesFiles,
                format!(
                    "{a:?} is shell {redirect}; xidwatch runs no shell, and writes are refused"
                ),
            );
        }
        let path = a.split_once('=').map_or(a.as_str(), |(_, v)| v);
        if path.starts_with('/') {
            check_sensitive(path)?;
        }
    }
    program_rules(program, &args)?;
    if !policy.allows(program) {
        return refuse(
            Rule::NotAllowlisted,
            format!("{program} is not on the allowlist ([runbooks] allowed_programs)"),
        );
    }
    Ok(())
}

/// Checks a `read` step's path: absolute, under /sys or /proc, no `..`, nothing sensitive.
pub fn check_read(path: &Template) -> Result<(), Refusal> {
    check_sys_proc_path(&path.to_string())
}

/// A program name must be a plain word: the search path decides where it comes from.
pub fn check_program_name(program: &str) -> Result<(), Refusal> {
    if program.is_empty() {
        return refuse(Rule::ProgramName, "the program name is empty");
    }
    if program.contains('/') {
        return refuse(
            Rule::ProgramName,
            format!("{program}: name a program, not a path; it is looked up in the search path"),
        );
    }
    if program.starts_with(['-', '.'])
        || !program
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+'))
    {
        return refuse(
            Rule::ProgramName,
            format!("{program:?} is not a plain program name"),
        );
    }
    if is_shell_like(program) {
        return refuse(
            Rule::Shell,
            format!("{program} is a shell, interpreter or launcher: it can run anything"),
        );
    }
    Ok(())
}

/// Whether a program (by name, or by the name a symlink resolves to) is a shell, an interpreter
/// or a launcher. Used at load time and again at run time on the resolved file.
pub fn is_shell_like(program: &str) -> bool {
    const SHELLS: &[&str] = &[
        "sh",
        "bash",
        "dash",
        "zsh",
        "ksh",
        "mksh",
        "pdksh",
        "oksh",
        "csh",
        "tcsh",
        "fish",
        "ash",
        "yash",
        "rbash",
        "busybox",
        "toybox",
        "env",
        "sudo",
        "su",
        "doas",
        "pkexec",
        "runuser",
        "nohup",
        "timeout",
        "xargs",
        "nice",
        "ionice",
        "chroot",
        "nsenter",
        "unshare",
        "setsid",
        "setpriv",
        "capsh",
        "stdbuf",
        "taskset",
        "chrt",
        "flock",
        "watch",
        "strace",
        "ltrace",
        "gdb",
        "script",
        "expect",
        "awk",
        "gawk",
        "mawk",
        "nawk",
        "sed",
        "tclsh",
        "wish",
        "systemd-run",
        "parallel",
        "ssh",
        "rsh",
        "socat",
        "nc",
        "ncat",
        "eval",
        "exec",
        "vim",
        "vi",
        "emacs",
        "less",
        "more",
        "man",
    ];
    const INTERPRETERS: &[&str] = &[
        "python", "perl", "ruby", "lua", "php", "node", "pwsh", "java",
    ];
    SHELLS.contains(&program) || INTERPRETERS.iter().any(|i| program.starts_with(i))
}

fn shell_syntax(arg: &str) -> Option<&'static str> {
    match arg {
        "|" | "||" | "&&" | ";" | "&" => Some("control syntax"),
        "<" | "<<" => Some("an input redirection"),
        _ if arg.starts_with('>') || arg.starts_with("1>") || arg.starts_with("2>") => {
            Some("an output redirection")
        }
        _ if arg.contains("$(") || arg.contains('`') => Some("command substitution"),
        _ => None,
    }
}

fn check_sys_proc_path(path: &str) -> Result<(), Refusal> {
    if !(path.starts_with("/sys/") || path.starts_with("/proc/")) {
        return refuse(
            Rule::ReadPath,
            format!("{path}: only files under /sys and /proc may be read"),
        );
    }
    let body = path.trim_end_matches('/');
    if body
        .split('/')
        .skip(1)
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return refuse(
            Rule::ReadPath,
            format!("{path}: write the path without '.', '..' or '//'"),
        );
    }
    check_sensitive(path)
}

/// Files whose reading changes something or leaks what must not reach an alert.
fn check_sensitive(path: &str) -> Result<(), Refusal> {
    const PROC_NAMES: &[(&str, &str)] = &[
        ("kmsg", "reading /proc/kmsg consumes kernel log records"),
        ("environ", "process environments hold secrets"),
        ("mem", "process memory"),
        ("kcore", "kernel memory"),
        ("pagemap", "page tables"),
        ("kpageflags", "page tables"),
        ("kpagecount", "page tables"),
        ("kpagecgroup", "page tables"),
        ("sysrq-trigger", "it is write-only and triggers actions"),
        ("root", "it leads into another process's filesystem"),
        ("cwd", "it leads into another process's filesystem"),
        (
            "fd",
            "reading another process's open files can consume its pipes and sockets",
        ),
        ("map_files", "another process's mapped files"),
    ];
    // PCI device files in sysfs whose reading touches the hardware itself.
    const SYS_NAMES: &[(&str, &str)] = &[
        (
            "config",
            "dumping all of PCI configuration space crashes some devices",
        ),
        (
            "rom",
            "reading the option ROM maps it into the device's address space",
        ),
    ];
    const PREFIXES: &[(&str, &str)] = &[
        ("/sys/kernel/debug", "debugfs files may act when read"),
        (
            "/sys/kernel/tracing",
            "tracing pipes are consumed when read",
        ),
        ("/sys/kernel/security", "security settings"),
        ("/dev/mem", "physical memory"),
        ("/dev/kmem", "kernel memory"),
        ("/dev/port", "I/O ports"),
    ];
    if path.starts_with("/proc/") {
        if let Some((_, why)) = path
            .split('/')
            .find_map(|c| PROC_NAMES.iter().find(|(n, _)| *n == c))
        {
            return refuse(Rule::SensitivePath, format!("{path}: {why}"));
        }
    }
    if path.starts_with("/sys/") {
        for c in path.split('/') {
            if let Some((_, why)) = SYS_NAMES.iter().find(|(n, _)| *n == c) {
                return refuse(Rule::SensitivePath, format!("{path}: {why}"));
            }
            // resource0, resource2_wc, ...: the device's memory, where a read can act.
            if c.strip_prefix("resource")
                .is_some_and(|r| r.starts_with(|ch: char| ch.is_ascii_digit()))
            {
                return refuse(
                    Rule::SensitivePath,
                    format!("{path}: reading device memory (BARs) can change device state"),
                );
            }
        }
    }
    if let Some((_, why)) = PREFIXES
        .iter()
        .find(|(p, _)| path == *p || path.strip_prefix(p).is_some_and(|r| r.starts_with('/')))
    {
        return refuse(Rule::SensitivePath, format!("{path}: {why}"));
    }
    Ok(())
}

/// The arguments after the program, seen as options and positionals.
struct Args<'a> {
    args: &'a [String],
}

impl<'a> Args<'a> {
    /// Positional arguments, skipping the value that follows an option listed in
    /// `value_opts` (given without `=`). A mistaken skip can only make a check stricter.
    fn positionals(&self, value_opts: &[&str]) -> Vec<&'a str> {
        let mut out = Vec::new();
        let mut skip = false;
        for a in self.args {
            if skip {
                skip = false;
                continue;
            }
            if a.starts_with('-') && a.len() > 1 {
                skip = !a.contains('=') && value_opts.contains(&a.as_str());
            } else {
                out.push(a.as_str());
            }
        }
        out
    }

    /// Option names as written (`--name` without `=value`, or `-x`).
    fn options(&self) -> impl Iterator<Item = &'a str> {
        self.args
            .iter()
            .filter(|a| a.starts_with('-') && a.len() > 1)
            .map(|a| a.split_once('=').map_or(a.as_str(), |(n, _)| n))
    }

    fn has_long(&self, names: &[&str]) -> Option<&'a str> {
        self.options()
            .find(|o| o.starts_with("--") && names.contains(o))
    }

    /// Short option letters in getopt bundles (`-Tc` is `-T -c`); letters after one that takes
    /// a value are that value and are not returned.
    fn short_letters(&self, value_letters: &str) -> Vec<char> {
        let mut out = Vec::new();
        let mut skip = false;
        for a in self.args {
            if skip {
                skip = false;
                continue;
            }
            let Some(bundle) = a.strip_prefix('-') else {
                continue;
            };
            if bundle.starts_with('-') || bundle.is_empty() {
                continue;
            }
            for (i, c) in bundle.char_indices() {
                out.push(c);
                if value_letters.contains(c) {
                    skip = i + c.len_utf8() == bundle.len();
                    break;
                }
            }
        }
        out
    }
}

fn program_rules(program: &str, args: &[String]) -> Result<(), Refusal> {
    let a = Args { args };
    match program {
        "reboot" | "shutdown" | "poweroff" | "halt" | "kexec" | "telinit" | "init" | "rtcwake"
        | "pm-suspend" | "pm-hibernate" | "pm-suspend-hybrid" | "systemd-sleep" => refuse(
            Rule::PowerState,
            format!("{program} changes the machine's power state"),
        ),
        "systemctl" => systemctl(&a),
        "service" => {
            let p = a.positionals(&[]);
            if a.args == ["--status-all"] || (p.len() == 2 && p[1] == "status") {
                Ok(())
            } else {
                refuse(
                    Rule::ServiceControl,
                    "service may only be used as `service NAME status` or `service --status-all`",
                )
            }
        }
        "hostnamectl" | "timedatectl" | "loginctl" | "networkctl" | "resolvectl" | "busctl"
        | "machinectl" | "udevadm" | "bootctl" | "localectl" => ctl(program, &a),
        "rmmod" | "modprobe" | "insmod" | "depmod" | "nvidia-modprobe" | "modunload" => refuse(
            Rule::KernelModules,
            format!("{program} loads or unloads kernel modules"),
        ),
        "kmod" => match a.positionals(&[]).first() {
            Some(&"list") => Ok(()),
            _ => refuse(Rule::KernelModules, "kmod may only be used as `kmod list`"),
        },
        "dkms" => match a.positionals(&["-m", "-v", "-k", "--kernelsourcedir"]).first() {
            Some(&"status") => Ok(()),
            _ => refuse(
                Rule::KernelModules,
                "dkms may only be used as `dkms status`: other commands build, install or remove modules",
            ),
        },
        "nvidia-smi" => nvidia_smi(args),
        "nvidia-persistenced" | "nvidia-settings" | "nvidia-xconfig" | "nvidia-installer"
        | "nvidia-uninstall" | "nvidia-debugdump" | "nv-fabricmanager" | "nvidia-fabricmanager"
        | "nvidia-powerd" | "nvflash" | "nvidia-fwupd" | "nvidia-imex" => refuse(
            Rule::GpuControl,
            format!("{program} changes GPU or driver state"),
        ),
        "dcgmi" => {
            let p = a.positionals(&["--host", "-g", "--group", "-f", "-e"]);
            let health_check = p.first() == Some(&"health")
                && a.options().all(|o| matches!(o, "-c" | "--check" | "-g" | "--group" | "-j" | "--json"));
            if p.first() == Some(&"discovery") || health_check {
                Ok(())
            } else {
                refuse(
                    Rule::GpuControl,
                    "dcgmi may only be used for `discovery` and `health -c`: diagnostics stress the GPU, other commands change settings",
                )
            }
        }
        "setpci" | "i2cset" | "wrmsr" | "devmem" | "devmem2" | "busybox-devmem" | "flashrom"
        | "mlxconfig" | "mstconfig" | "mst" | "spi" => refuse(
            Rule::HardwareAccess,
            format!("{program} writes hardware registers"),
        ),
        "lspci" => lspci(&a),
        "ipmitool" => ipmitool(&a),
        "tee" | "dd" | "cp" | "mv" | "rm" | "ln" | "install" | "truncate" | "touch" | "chmod"
        | "chown" | "chgrp" | "chattr" | "setfacl" | "mkdir" | "rmdir" | "mknod" | "mkfifo"
        | "shred" | "unlink" | "mount" | "umount" | "swapon" | "swapoff" | "rsync" | "scp"
        | "patch" | "wipefs" | "fdisk" | "sfdisk" | "parted" | "blkdiscard" | "fstrim"
        | "hdparm" | "nvme" | "logrotate" | "cpio" | "tar" | "gzip" | "gunzip" | "zip"
        | "unzip" | "split" | "csplit" | "wall" | "write" | "nvidia-bug-report.sh" => refuse(
            Rule::WritesFiles,
            format!("{program} writes files or devices"),
        ),
        _ if program.starts_with("mkfs") || program.starts_with("mkswap") => refuse(
            Rule::WritesFiles,
            format!("{program} writes filesystems"),
        ),
        "sort" => match a
            .has_long(&["--output"])
            .or_else(|| a.short_letters("kotST").contains(&'o').then_some("-o"))
        {
            Some(o) => refuse(Rule::WritesFiles, format!("sort {o} writes a file")),
            None => Ok(()),
        },
        "find" => {
            const WRITES: &[&str] = &[
                "-delete", "-exec", "-execdir", "-ok", "-okdir", "-fprint", "-fprint0",
                "-fprintf", "-fls",
            ];
            match args.iter().find(|x| WRITES.contains(&x.as_str())) {
                Some(x) => refuse(
                    Rule::WritesFiles,
                    format!("find {x} deletes, writes or runs programs"),
                ),
                None => Ok(()),
            }
        }
        "ldconfig" => {
            let print = a.args.iter().any(|x| x == "-p" || x == "--print-cache");
            if print && a.args.iter().all(|x| x == "-p" || x == "--print-cache" || x == "-v") {
                Ok(())
            } else {
                refuse(
                    Rule::WritesFiles,
                    "ldconfig may only be used as `ldconfig -p`: otherwise it rewrites the linker cache",
                )
            }
        }
        "cat" => {
            for p in a.positionals(&[]) {
                check_sys_proc_path(p)?;
            }
            Ok(())
        }
        "dmesg" => dmesg(&a),
        "journalctl" => {
            const WRITES: &[&str] = &[
                "--vacuum-size",
                "--vacuum-time",
                "--vacuum-files",
                "--rotate",
                "--flush",
                "--sync",
                "--relinquish-var",
                "--smart-relinquish-var",
                "--setup-keys",
                "--update-catalog",
                // Writes the cursor to a file of the caller's choosing.
                "--cursor-file",
            ];
            match a.has_long(WRITES) {
                Some(o) => refuse(
                    Rule::LogControl,
                    format!("journalctl {o} changes the journal"),
                ),
                None => Ok(()),
            }
        }
        "logger" | "systemd-cat" => refuse(
            Rule::LogControl,
            format!("{program} writes to the system log"),
        ),
        "sysctl" => {
            let letters = a.short_letters("f");
            if a.args.iter().any(|x| x.contains('='))
                || letters.iter().any(|c| matches!(c, 'w' | 'p' | 'f'))
                || a.has_long(&["--write", "--load", "--system"]).is_some()
            {
                refuse(Rule::SystemSettings, "sysctl may only read kernel settings")
            } else {
                Ok(())
            }
        }
        "ip" => ip(&a),
        "ethtool" => {
            const READ: &[&str] = &[
                "-i", "--driver", "-S", "--statistics", "-k", "--show-features", "--show-offload",
                "-g", "--show-ring", "-l", "--show-channels", "-a", "--show-pause", "-c",
                "--show-coalesce", "-P", "--show-permaddr", "-T", "--show-time-stamping", "-m",
                "--module-info", "--show-priv-flags", "--show-eee", "--show-fec", "-h", "--help",
                "--version",
            ];
            let ok = match args {
                [iface] => !iface.starts_with('-'),
                [opt, ..] => READ.contains(&opt.as_str()),
                [] => true,
            } && a.options().skip(1).count() == 0;
            if ok {
                Ok(())
            } else {
                refuse(
                    Rule::SystemSettings,
                    "ethtool may only show (-i, -S, -k, -g, -l, -a, -c, -m, ...): other options change the interface",
                )
            }
        }
        "ifconfig" => {
            if a.positionals(&[]).len() <= 1 && a.options().all(|o| matches!(o, "-a" | "-s" | "-v")) {
                Ok(())
            } else {
                refuse(Rule::SystemSettings, "ifconfig may only show interfaces")
            }
        }
        "hostname" => {
            if !a.positionals(&[]).is_empty()
                || a.options().any(|o| matches!(o, "-F" | "--file" | "-b" | "--boot"))
            {
                refuse(Rule::SystemSettings, "hostname with a name or -F sets the host name")
            } else {
                Ok(())
            }
        }
        "date" => {
            let letters = a.short_letters("dfr");
            let sets = letters.contains(&'s')
                || a.has_long(&["--set"]).is_some()
                || a
                    .positionals(&["-d", "--date", "-f", "--file", "-r", "--reference"])
                    .iter()
                    .any(|p| !p.starts_with('+'));
            if sets {
                refuse(Rule::SystemSettings, "date -s (or a bare date argument) sets the clock")
            } else {
                Ok(())
            }
        }
        "hwclock" => {
            const READ: &[&str] = &[
                "-r", "--show", "--get", "-h", "--help", "--verbose", "-u", "--utc", "-l",
                "--localtime", "-V", "--version",
            ];
            match a.options().find(|o| !READ.contains(o)) {
                Some(o) => refuse(Rule::SystemSettings, format!("hwclock {o} may set the clock")),
                None if !a.positionals(&[]).is_empty() => {
                    refuse(Rule::SystemSettings, "hwclock may only show the clock")
                }
                None => Ok(()),
            }
        }
        "renice" | "tc" | "iptables" | "ip6tables" | "nft" | "route" | "iw" | "nmcli"
        | "ibportstate" | "cpupower" | "tuned-adm" | "modeset" | "sysctl-write" => refuse(
            Rule::SystemSettings,
            format!("{program} changes system or network settings"),
        ),
        "kill" | "pkill" | "killall" | "killall5" | "skill" | "snice" | "xkill" => refuse(
            Rule::Kill,
            format!("{program} sends signals to processes"),
        ),
        "fuser" => {
            if a.short_letters("mn").contains(&'k') || a.has_long(&["--kill"]).is_some() {
                refuse(Rule::Kill, "fuser -k kills processes")
            } else {
                Ok(())
            }
        }
        "numactl" => {
            if !a.args.is_empty()
                && a.args
                    .iter()
                    .all(|x| matches!(x.as_str(), "-H" | "--hardware" | "-s" | "--show"))
            {
                Ok(())
            } else {
                refuse(Rule::Shell, "numactl runs a program; only -H and -s are allowed")
            }
        }
        _ => Ok(()),
    }
}

fn systemctl(a: &Args) -> Result<(), Refusal> {
    const VALUE_OPTS: &[&str] = &[
        "-t",
        "--type",
        "-p",
        "--property",
        "--state",
        "-n",
        "--lines",
        "-o",
        "--output",
        "-H",
        "--host",
        "-M",
        "--machine",
        "--root",
        "-s",
        "--signal",
        "--kill-whom",
        "--job-mode",
        "--what",
        "--timestamp",
        "--image",
        "--when",
        "--message",
    ];
    const READ: &[&str] = &[
        "status",
        "show",
        "cat",
        "help",
        "is-active",
        "is-enabled",
        "is-failed",
        "is-system-running",
        "list-units",
        "list-unit-files",
        "list-sockets",
        "list-timers",
        "list-jobs",
        "list-dependencies",
        "list-machines",
        "list-automounts",
        "list-paths",
        "get-default",
        "show-environment",
    ];
    const POWER: &[&str] = &[
        "reboot",
        "poweroff",
        "halt",
        "kexec",
        "suspend",
        "hibernate",
        "hybrid-sleep",
        "suspend-then-hibernate",
        "soft-reboot",
        "sleep",
        "emergency",
        "rescue",
        "default",
        "isolate",
    ];
    match a.positionals(VALUE_OPTS).first() {
        None => Ok(()),
        Some(v) if READ.contains(v) => Ok(()),
        Some(v) if POWER.contains(v) => refuse(
            Rule::PowerState,
            format!("systemctl {v} changes the machine's power state or target"),
        ),
        Some(v) => refuse(
            Rule::ServiceControl,
            format!(
                "systemctl {v} is not a read-only verb (allowed: {})",
                READ.join(", ")
            ),
        ),
    }
}

fn ctl(program: &str, a: &Args) -> Result<(), Refusal> {
    let verb = a
        .positionals(&[
            "-H",
            "--host",
            "-M",
            "--machine",
            "-p",
            "--property",
            "-n",
            "--lines",
            "-o",
            "--output",
        ])
        .first()
        .copied();
    let ok = match (program, verb) {
        ("udevadm", Some("info")) => true,
        ("udevadm", _) => false,
        (_, None) => true,
        (_, Some(v)) => {
            matches!(
                v,
                "status" | "show" | "cat" | "help" | "introspect" | "tree" | "monitor"
            ) || ["list", "show-", "get-", "is-"]
                .iter()
                .any(|p| v.starts_with(p))
        }
    };
    if ok {
        Ok(())
    } else {
        refuse(
            Rule::SystemSettings,
            format!(
                "{program} {} is not a read-only verb (status, show, list-*, get-*)",
                verb.unwrap_or("")
            ),
        )
    }
}

/// Options known to be read-only: (name, takes a value).
type ReadOptions = &'static [(&'static str, bool)];
/// Options known to write: (short name, long name, what it does).
type WriteOptions = &'static [(&'static str, &'static str, &'static str)];

/// nvidia-smi: read-only options per subcommand; everything else refused, known writers by name.
fn nvidia_smi(args: &[String]) -> Result<(), Refusal> {
    // (option, takes a value)
    const TOP_READ: &[(&str, bool)] = &[
        ("-h", false),
        ("--help", false),
        ("--version", false),
        ("-L", false),
        ("--list-gpus", false),
        ("-B", false),
        ("--list-excluded-gpus", false),
        ("-q", false),
        ("--query", false),
        ("-u", false),
        ("--unit", false),
        ("-x", false),
        ("--xml-format", false),
        ("--dtd", false),
        ("-i", true),
        ("--id", true),
        ("-d", true),
        ("--display", true),
        ("--query-gpu", true),
        ("--query-supported-clocks", true),
        ("--query-compute-apps", true),
        ("--query-accounted-apps", true),
        ("--query-retired-pages", true),
        ("--query-remapped-rows", true),
        ("--format", true),
    ];
    // (short, long, what it does)
    const TOP_WRITE: &[(&str, &str, &str)] = &[
        ("-r", "--gpu-reset", "resets the GPU"),
        ("-pm", "--persistence-mode", "sets persistence mode"),
        ("-pl", "--power-limit", "sets the power limit"),
        ("-e", "--ecc-config", "changes the ECC mode"),
        ("-p", "--reset-ecc-errors", "resets the ECC error counts"),
        ("-c", "--compute-mode", "sets the compute mode"),
        ("-mig", "--multi-instance-gpu", "changes MIG mode"),
        ("-ac", "--applications-clocks", "sets application clocks"),
        (
            "-rac",
            "--reset-applications-clocks",
            "resets application clocks",
        ),
        (
            "-acp",
            "--applications-clocks-permission",
            "changes clock permissions",
        ),
        ("-lgc", "--lock-gpu-clocks", "locks GPU clocks"),
        ("-rgc", "--reset-gpu-clocks", "resets GPU clocks"),
        ("-lmc", "--lock-memory-clocks", "locks memory clocks"),
        ("-rmc", "--reset-memory-clocks", "resets memory clocks"),
        ("-am", "--accounting-mode", "sets accounting mode"),
        ("-caa", "--clear-accounted-apps", "clears accounting data"),
        ("-dm", "--driver-model", "changes the driver model"),
        ("-fdm", "--force-driver-model", "changes the driver model"),
        ("-cc", "--cuda-clocks", "changes CUDA clock behaviour"),
        ("", "--auto-boost-default", "changes boost behaviour"),
        ("", "--auto-boost-permission", "changes boost permissions"),
        ("-t", "--toggle-led", "toggles the unit LED"),
        ("-f", "--filename", "writes its output to a file"),
        ("", "--gom", "changes the GPU operation mode"),
        ("-vm", "--virt-mode", "changes the virtualization mode"),
        ("-l", "--loop", "loops until killed"),
        ("-lms", "--loop-ms", "loops until killed"),
    ];
    const TOPO_READ: &[(&str, bool)] = &[
        ("-h", false),
        ("--help", false),
        ("-m", false),
        ("--matrix", false),
        ("-mp", false),
        ("--matrix_pci", false),
        ("-p", false),
        ("--gpu_path", false),
        ("-i", true),
        ("--id", true),
        ("-c", true),
        ("--cpu", true),
        ("-n", true),
        ("--nearest_gpus", true),
        ("-p2p", true),
        ("--p2pstatus", true),
    ];
    const NVLINK_READ: &[(&str, bool)] = &[
        ("-h", false),
        ("--help", false),
        ("-s", false),
        ("--status", false),
        ("-c", false),
        ("--capabilities", false),
        ("-p", false),
        ("--pcibusid", false),
        ("-R", false),
        ("--remotelinkinfo", false),
        ("-e", false),
        ("--errorcounters", false),
        ("-ec", false),
        ("--crcerrorcounters", false),
        ("-i", true),
        ("--id", true),
        ("-l", true),
        ("--link", true),
        ("-gt", true),
        ("--getthroughput", true),
    ];
    const NVLINK_WRITE: &[(&str, &str, &str)] = &[
        ("-r", "--resetcounters", "resets NVLink counters"),
        (
            "-re",
            "--reseterrorcounters",
            "resets NVLink error counters",
        ),
        ("-sc", "--setcontrol", "changes NVLink counter control"),
        (
            "-sLowPwrThres",
            "--setLowPowerThreshold",
            "changes NVLink power settings",
        ),
    ];
    const WRITE_SUBCOMMANDS: &[(&str, &str)] = &[
        ("mig", "creates and destroys MIG instances"),
        ("drain", "drains GPUs"),
        ("clocks", "sets clocks"),
        ("vgpu", "manages vGPUs"),
        ("conf-compute", "changes confidential-computing settings"),
        ("compute-policy", "changes compute policy"),
        ("boost-slider", "changes boost settings"),
        ("power-hint", "runs a power workload"),
        ("power-smoothing", "changes power smoothing"),
        ("dmon", "loops until killed"),
        ("pmon", "loops until killed"),
    ];

    let sub = args
        .first()
        .filter(|a| !a.starts_with('-'))
        .map(String::as_str);
    let (rest, read, write): (&[String], ReadOptions, WriteOptions) = match sub {
        None => (args, TOP_READ, TOP_WRITE),
        Some("topo") => (&args[1..], TOPO_READ, &[]),
        Some("nvlink") => (&args[1..], NVLINK_READ, NVLINK_WRITE),
        Some(s) => {
            return match WRITE_SUBCOMMANDS.iter().find(|(n, _)| *n == s) {
                Some((_, what)) => refuse(Rule::GpuControl, format!("nvidia-smi {s} {what}")),
                None => refuse(
                    Rule::GpuControl,
                    format!(
                        "nvidia-smi {s} is not a subcommand known to be read-only (topo, nvlink)"
                    ),
                ),
            };
        }
    };
    let context = sub.map_or(String::from("nvidia-smi"), |s| format!("nvidia-smi {s}"));
    let mut i = 0;
    while i < rest.len() {
        let arg = &rest[i];
        i += 1;
        if !arg.starts_with('-') {
            return refuse(
                Rule::GpuControl,
                format!("{context}: unexpected argument {arg:?}"),
            );
        }
        let (name, inline_value) = match arg.split_once('=') {
            Some((n, _)) => (n, true),
            None => (arg.as_str(), false),
        };
        if let Some((_, takes_value)) = read.iter().find(|(o, _)| *o == name) {
            if *takes_value && !inline_value {
                match rest.get(i) {
                    Some(v) if !v.starts_with('-') => i += 1,
                    _ => {
                        return refuse(Rule::GpuControl, format!("{context} {name} needs a value"))
                    }
                }
            }
            continue;
        }
        if let Some((s, l, what)) = write.iter().find(|(s, l, _)| *s == name || *l == name) {
            let both = if s.is_empty() {
                l.to_string()
            } else {
                format!("{s}/{l}")
            };
            return refuse(Rule::GpuControl, format!("{context} {both} {what}"));
        }
        return refuse(
            Rule::GpuControl,
            format!("{context} {name} is not an option known to be read-only"),
        );
    }
    Ok(())
}

fn lspci(a: &Args) -> Result<(), Refusal> {
    let letters = a.short_letters("sdipFOAH");
    if letters.contains(&'H') || letters.contains(&'A') {
        return refuse(
            Rule::HardwareAccess,
            "lspci -H/-A accesses configuration space directly, bypassing the kernel",
        );
    }
    if letters.iter().filter(|c| **c == 'x').count() >= 3 {
        return refuse(
            Rule::HardwareAccess,
            "lspci -xxx reads all of configuration space, which crashes some devices",
        );
    }
    Ok(())
}

fn ipmitool(a: &Args) -> Result<(), Refusal> {
    let p = a.positionals(&[
        "-I", "-H", "-U", "-P", "-f", "-L", "-p", "-C", "-y", "-k", "-K", "-o", "-O", "-t", "-T",
        "-m", "-b", "-B", "-l", "-N", "-R", "-c", "-e",
    ]);
    let ok = matches!(
        p.as_slice(),
        ["sensor", ..]
            | ["sdr", ..]
            | ["fru", ..]
            | ["sel", "list" | "elist" | "info", ..]
            | ["mc", "info"]
            | ["chassis", "status"]
            | ["lan", "print", ..]
    );
    match p.as_slice() {
        _ if ok => Ok(()),
        ["chassis", "power", ..] | ["power", ..] => refuse(
            Rule::PowerState,
            "ipmitool power control changes the power state",
        ),
        _ => refuse(
            Rule::HardwareAccess,
            "ipmitool may only read (sensor, sdr, fru, sel list, mc info, chassis status)",
        ),
    }
}

fn dmesg(a: &Args) -> Result<(), Refusal> {
    let letters = a.short_letters("fFlns");
    if let Some(c) = letters
        .iter()
        .find(|c| matches!(c, 'c' | 'C' | 'n' | 'D' | 'E'))
    {
        return refuse(
            Rule::LogControl,
            format!("dmesg -{c} clears the kernel log or changes console logging"),
        );
    }
    if let Some(o) = a.has_long(&[
        "--clear",
        "--read-clear",
        "--console-level",
        "--console-off",
        "--console-on",
    ]) {
        return refuse(
            Rule::LogControl,
            format!("dmesg {o} clears the kernel log or changes console logging"),
        );
    }
    if letters.contains(&'F') || a.has_long(&["--file"]).is_some() {
        return refuse(Rule::ReadPath, "dmesg -F/--file reads an arbitrary file");
    }
    Ok(())
}

fn ip(a: &Args) -> Result<(), Refusal> {
    if a.options()
        .any(|o| matches!(o, "-b" | "-batch" | "--batch" | "-force" | "--force"))
    {
        return refuse(Rule::SystemSettings, "ip -batch runs commands from a file");
    }
    let p = a.positionals(&[
        "-n", "-netns", "-f", "-family", "-l", "-loops", "-rc", "-rcvbuf",
    ]);
    match p.get(1) {
        None => Ok(()),
        Some(v) if matches!(*v, "show" | "list" | "ls" | "lst" | "get" | "help") => Ok(()),
        Some(v) => refuse(
            Rule::SystemSettings,
            format!("ip {} {v} is not read-only (show, list, get)", p[0]),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<Template> {
        words.iter().map(|w| Template::parse(w).unwrap()).collect()
    }

    fn everything_allowed() -> SafetyPolicy {
        // Proves the rules do not depend on the allowlist.
        SafetyPolicy::new(["a"; 0]).with_everything()
    }

    impl SafetyPolicy {
        fn with_everything(mut self) -> Self {
            for p in [
                "reboot",
                "shutdown",
                "systemctl",
                "rmmod",
                "modprobe",
                "nvidia-smi",
                "tee",
                "dd",
                "kill",
                "sh",
                "bash",
                "cat",
                "dmesg",
                "journalctl",
                "ip",
                "lspci",
                "setpci",
                "sysctl",
                "hostname",
                "date",
                "find",
                "dkms",
                "ipmitool",
                "ethtool",
                "sed",
            ] {
                self.allowed.insert(p.into());
            }
            self
        }
    }

    #[track_caller]
    fn refused(words: &[&str], rule: Rule, needle: &str) {
        let r = check_run(&argv(words), &everything_allowed())
            .expect_err(&format!("{words:?} should be refused"));
        assert_eq!(r.rule, rule, "{words:?}: {r}");
        assert!(r.reason.contains(needle), "{words:?}: {r}");
    }

    #[track_caller]
    fn allowed(words: &[&str]) {
        if let Err(r) = check_run(&argv(words), &everything_allowed()) {
            panic!("{words:?} refused: {r}");
        }
    }

    #[test]
    fn nvidia_smi_read_forms_pass_and_writers_are_named() {
        allowed(&["nvidia-smi", "-q", "-d", "ECC,ROW_REMAPPER", "-i", "{pci}"]);
        allowed(&[
            "nvidia-smi",
            "--query-gpu=index,pci.bus_id,temperature.gpu",
            "--format=csv",
        ]);
        allowed(&["nvidia-smi", "-L"]);
        allowed(&["nvidia-smi", "nvlink", "-s", "-i", "{pci}"]);
        allowed(&["nvidia-smi", "nvlink", "-e"]);
        allowed(&["nvidia-smi", "topo", "-m"]);
        refused(
            &["nvidia-smi", "-r", "-i", "0"],
            Rule::GpuControl,
            "-r/--gpu-reset resets",
        );
        refused(
            &["nvidia-smi", "--gpu-reset"],
            Rule::GpuControl,
            "resets the GPU",
        );
        refused(&["nvidia-smi", "-pm", "1"], Rule::GpuControl, "persistence");
        refused(
            &["nvidia-smi", "-pl", "300"],
            Rule::GpuControl,
            "power limit",
        );
        refused(&["nvidia-smi", "-e", "0"], Rule::GpuControl, "ECC mode");
        refused(&["nvidia-smi", "-c", "3"], Rule::GpuControl, "compute mode");
        refused(&["nvidia-smi", "-mig", "1"], Rule::GpuControl, "MIG");
        refused(
            &["nvidia-smi", "-ac", "1215,1410"],
            Rule::GpuControl,
            "application clocks",
        );
        refused(
            &["nvidia-smi", "--applications-clocks=1,2"],
            Rule::GpuControl,
            "application clocks",
        );
        refused(
            &["nvidia-smi", "-lgc", "1000"],
            Rule::GpuControl,
            "locks GPU clocks",
        );
        refused(
            &["nvidia-smi", "-q", "-f", "/tmp/x"],
            Rule::GpuControl,
            "file",
        );
        refused(
            &["nvidia-smi", "--some-new-flag"],
            Rule::GpuControl,
            "not an option known",
        );
        refused(
            &["nvidia-smi", "mig", "-dci"],
            Rule::GpuControl,
            "MIG instances",
        );
        refused(
            &["nvidia-smi", "drain", "-p", "0", "-m", "1"],
            Rule::GpuControl,
            "drains",
        );
        refused(
            &["nvidia-smi", "nvlink", "-r", "0"],
            Rule::GpuControl,
            "resets NVLink",
        );
        refused(
            &["nvidia-smi", "nvlink", "--reseterrorcounters"],
            Rule::GpuControl,
            "resets",
        );
        refused(
            &["nvidia-smi", "-i", "-r"],
            Rule::GpuControl,
            "needs a value",
        );
        refused(
            &["nvidia-smi", "-q", "extra"],
            Rule::GpuControl,
            "unexpected argument",
        );
        refused(
            &["nvidia-persistenced"],
            Rule::GpuControl,
            "GPU or driver state",
        );
    }

    #[test]
    fn power_service_modules() {
        for p in ["reboot", "shutdown", "poweroff", "halt", "kexec"] {
            refused(&[p], Rule::PowerState, "power state");
        }
        refused(&["systemctl", "reboot"], Rule::PowerState, "power state");
        refused(
            &["systemctl", "--no-pager", "kexec"],
            Rule::PowerState,
            "power state",
        );
        refused(
            &["systemctl", "restart", "nvidia-persistenced"],
            Rule::ServiceControl,
            "read-only",
        );
        refused(
            &["systemctl", "stop", "x"],
            Rule::ServiceControl,
            "read-only",
        );
        refused(
            &["systemctl", "-p", "ActiveState", "start", "x"],
            Rule::ServiceControl,
            "",
        );
        allowed(&["systemctl", "status", "nvidia-persistenced", "--no-pager"]);
        allowed(&[
            "systemctl",
            "show",
            "-p",
            "ActiveState",
            "nvidia-fabricmanager",
        ]);
        allowed(&["systemctl"]);
        for p in ["rmmod", "modprobe", "insmod"] {
            refused(&[p, "nvidia"], Rule::KernelModules, "modules");
        }
        refused(
            &["dkms", "remove", "nvidia/550"],
            Rule::KernelModules,
            "dkms status",
        );
        allowed(&["dkms", "status"]);
        refused(
            &["ipmitool", "chassis", "power", "cycle"],
            Rule::PowerState,
            "power",
        );
    }

    #[test]
    fn writes_logs_settings_kill_shells() {
        refused(
            &["tee", "/sys/bus/pci/devices/{pci}/reset"],
            Rule::WritesFiles,
            "writes",
        );
        refused(
            &["dd", "of=/sys/bus/pci/rescan"],
            Rule::WritesFiles,
            "writes",
        );
        refused(
            &["cat", "1", ">", "/sys/bus/pci/rescan"],
            Rule::WritesFiles,
            "redirection",
        );
        refused(&["find", "/sys", "-delete"], Rule::WritesFiles, "-delete");
        refused(
            &["setpci", "-s", "{pci}", "COMMAND=0"],
            Rule::HardwareAccess,
            "registers",
        );
        refused(&["lspci", "-xxxs", "{pci}"], Rule::HardwareAccess, "-xxx");
        refused(
            &["lspci", "-x", "-xx", "-s", "{pci}"],
            Rule::HardwareAccess,
            "-xxx",
        );
        refused(&["lspci", "-H1"], Rule::HardwareAccess, "directly");
        allowed(&["lspci", "-vvv", "-s", "{pci}"]);
        allowed(&["lspci", "-x", "-s", "{pci}"]);
        refused(&["dmesg", "-c"], Rule::LogControl, "clears");
        refused(&["dmesg", "-Tc"], Rule::LogControl, "clears");
        refused(&["dmesg", "--clear"], Rule::LogControl, "clears");
        refused(&["dmesg", "-n", "1"], Rule::LogControl, "console");
        allowed(&["dmesg", "-T", "--level=err,warn"]);
        allowed(&["dmesg", "-l", "err"]);
        refused(
            &["journalctl", "--vacuum-time=1s"],
            Rule::LogControl,
            "journal",
        );
        refused(&["journalctl", "--rotate"], Rule::LogControl, "journal");
        refused(
            &["journalctl", "-k", "--cursor-file=/etc/x"],
            Rule::LogControl,
            "journal",
        );
        allowed(&["journalctl", "-k", "-b", "-n", "200", "--no-pager"]);
        refused(
            &["sysctl", "-w", "kernel.panic=1"],
            Rule::SystemSettings,
            "read",
        );
        refused(
            &["sysctl", "vm.drop_caches=3"],
            Rule::SystemSettings,
            "read",
        );
        refused(
            &["ip", "link", "set", "ib0", "down"],
            Rule::SystemSettings,
            "not read-only",
        );
        refused(
            &["ip", "-batch", "/tmp/cmds"],
            Rule::SystemSettings,
            "batch",
        );
        allowed(&["ip", "-s", "link", "show"]);
        allowed(&["ip", "addr"]);
        refused(&["hostname", "evil"], Rule::SystemSettings, "host name");
        refused(&["date", "-s", "2020-01-01"], Rule::SystemSettings, "clock");
        refused(
            &["ethtool", "-s", "eth0", "speed", "10"],
            Rule::SystemSettings,
            "ethtool",
        );
        allowed(&["ethtool", "-S", "eth0"]);
        allowed(&["date", "+%s"]);
        allowed(&["hostname"]);
        for p in ["kill", "pkill", "killall"] {
            refused(&[p, "-9", "{pid}"], Rule::Kill, "signals");
        }
        refused(&["sh", "-c", "nvidia-smi -r"], Rule::Shell, "shell");
        refused(&["bash", "-c", "true"], Rule::Shell, "shell");
        refused(&["python3", "-c", "1"], Rule::Shell, "interpreter");
        refused(&["env", "reboot"], Rule::Shell, "launcher");
        refused(&["sed", "-n", "w /sys/x"], Rule::Shell, "shell");
    }

    #[test]
    fn program_names_options_and_paths() {
        refused(&["/sbin/reboot"], Rule::ProgramName, "not a path");
        refused(&["./lsmod"], Rule::ProgramName, "not a path");
        refused(&["{pci}"], Rule::ProgramName, "placeholder");
        refused(&["ls -l"], Rule::ProgramName, "plain");
        assert_eq!(
            check_run(&[], &everything_allowed()).unwrap_err().rule,
            Rule::ProgramName
        );
        refused(&["nvidia-smi", "-{xid}"], Rule::OptionPlaceholder, "value");
        allowed(&["nvidia-smi", "--id={pci}"]);
        refused(
            &["cat", "/etc/shadow"],
            Rule::ReadPath,
            "only files under /sys and /proc",
        );
        refused(&["cat", "/sys/../etc/shadow"], Rule::ReadPath, "'..'");
        refused(
            &["cat", "/proc/{pid}/environ"],
            Rule::SensitivePath,
            "secrets",
        );
        refused(&["cat", "/proc/kmsg"], Rule::SensitivePath, "consumes");
        refused(
            &["ls", "/sys/kernel/debug/dri"],
            Rule::SensitivePath,
            "debugfs",
        );
        allowed(&["cat", "/proc/driver/nvidia/version"]);
        for p in [
            "/sys/bus/pci/devices/{pci}/config",
            "/sys/bus/pci/devices/{pci}/resource0",
            "/sys/bus/pci/devices/{pci}/rom",
            "/proc/1/root/etc/shadow",
            "/proc/{pid}/cwd/secrets",
            "/proc/{pid}/fd/0",
            "/etc/passwd",
            "sys/x",
            "/proc/x/../../etc",
            "/sys//x",
            "/proc/1/environ",
        ] {
            assert!(check_read(&Template::parse(p).unwrap()).is_err(), "{p}");
        }
        assert!(check_read(&Template::parse("/proc/driver/nvidia/gpus/").unwrap()).is_ok());
        assert!(
            check_read(&Template::parse("/sys/bus/pci/devices/{pci}/aer_dev_fatal").unwrap())
                .is_ok()
        );
    }

    #[test]
    fn allowlist_applies_after_the_rules() {
        let policy = SafetyPolicy::default();
        assert!(check_run(&argv(&["lsmod"]), &policy).is_ok());
        let r = check_run(&argv(&["nvme", "list"]), &SafetyPolicy::new(["lsmod"])).unwrap_err();
        assert_eq!(r.rule, Rule::WritesFiles);
        let r = check_run(&argv(&["lsblk"]), &policy).unwrap_err();
        assert_eq!(r.rule, Rule::NotAllowlisted);
        assert!(r.reason.contains("allowlist"));
        // Allowlisting a dangerous program changes nothing.
        let r = check_run(&argv(&["reboot"]), &SafetyPolicy::new(["reboot"])).unwrap_err();
        assert_eq!(r.rule, Rule::PowerState);
    }

    #[test]
    fn default_allowlist_holds_no_refused_program() {
        for p in DEFAULT_ALLOWED {
            check_program_name(p).unwrap();
            assert!(!is_shell_like(p), "{p}");
        }
    }
}
