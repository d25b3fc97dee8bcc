//! The no-harm promise attacked from inside a step: an operator's `allow` entry that is really a
//! script (shell, python3, perl) tries every kind of harm the read-only promise rules out, on
//! targets this test owns and that the step's user could harm if nothing but permissions stood
//! in the way: a state file and a directory anyone may write, a config anyone may read, a process
//! of the step's own user, a TCP listener and an abstract UNIX socket on this machine.
//!
//! Each attack must be denied, and the evidence says so. The targets are the test's own, so a
//! broken confinement harms nothing but them. As root (CI), the step runs as the unprivileged
//! runbook user and the targets belong to that user: the shipped unit's case, where the step has
//! the daemon's uid and only the kernel's confinement stands between it and the daemon.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use xidwatch::model::StepStatus;
use xidwatch::runbook::confine::Support;
use xidwatch::runbook::{Catalog, Redactor, RunLimits, Runbook, RunbookEnv, Subject};

/// The uid a step runs as when this test is root, else our own.
fn step_uid() -> u32 {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        // SAFETY: plain syscall.
        return unsafe { libc::getuid() };
    }
    xidwatch::runbook::sandbox::run_as()
        .expect("a runbook user")
        .map(|u| u.uid)
        .expect("root drops to a user")
}

struct Targets {
    dir: tempfile::TempDir,
    victim: Child,
    tcp: std::net::TcpListener,
    abstract_name: String,
    _abstract: std::os::unix::net::UnixListener,
}

impl Targets {
    fn new() -> Targets {
        let dir = tempfile::Builder::new()
            .prefix("xw-confine-")
            .tempdir_in("/tmp")
            .unwrap();
        let uid = step_uid();
        let own = |p: &Path, mode: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
            std::os::unix::fs::chown(p, Some(uid), None).unwrap();
        };
        own(dir.path(), 0o777);
        let state = dir.path().join("state.json");
        std::fs::write(&state, "intact\n").unwrap();
        own(&state, 0o666);
        let config = dir.path().join("xidwatch.toml");
        std::fs::write(
            &config,
            "url = \"https://hooks.example/T0/SECRET-TOKEN-4711\"\n",
        )
        .unwrap();
        own(&config, 0o644);
        let mut cmd = Command::new("sleep");
        cmd.arg("120");
        std::os::unix::process::CommandExt::uid(&mut cmd, uid);
        let victim = cmd.spawn().unwrap();
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        tcp.set_nonblocking(true).unwrap();
        let abstract_name = format!(
            "xw-confine-{}-{}",
            std::process::id(),
            dir.path().file_name().unwrap().to_string_lossy()
        );
        let addr = <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(abstract_name.as_bytes())
            .unwrap();
        let ab = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
        ab.set_nonblocking(true).unwrap();
        Targets {
            dir,
            victim,
            tcp,
            abstract_name,
            _abstract: ab,
        }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state.json")
    }

    /// Nothing reached the targets.
    fn assert_unharmed(&mut self, who: &str) {
        assert_eq!(
            std::fs::read_to_string(self.state()).unwrap(),
            "intact\n",
            "{who}: the state file was changed"
        );
        let mut names: Vec<String> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["state.json", "xidwatch.toml"],
            "{who}: files appeared"
        );
        assert!(
            self.victim.try_wait().unwrap().is_none(),
            "{who}: the victim process was killed"
        );
        assert!(
            self.tcp.accept().is_err(),
            "{who}: a TCP connection came in"
        );
    }
}

impl Drop for Targets {
    fn drop(&mut self) {
        let _ = self.victim.kill();
        let _ = self.victim.wait();
    }
}

/// The attacks, as shell commands: (name, command). `$D` is the targets' directory, `$P` the
/// victim's pid, `$T` the TCP port, `$A` the abstract socket's name.
const SHELL_ATTACKS: &[(&str, &str)] = &[
    ("create-file", ": > \"$D/planted\""),
    ("truncate-state", ": > \"$D/state.json\""),
    ("append-state", "echo x >> \"$D/state.json\""),
    ("rename-state", "mv \"$D/state.json\" \"$D/moved\""),
    ("remove-state", "rm -f \"$D/state.json\""),
    ("symlink", "ln -s /etc/passwd \"$D/link\""),
    ("fifo", "mkfifo \"$D/fifo\""),
    ("mkdir", "mkdir \"$D/sub\""),
    ("read-config", "grep -q SECRET \"$D/xidwatch.toml\""),
    ("relative-read", "cd / && grep -rq SECRET tmp"),
    ("list-etc", "ls /etc"),
    ("signal", "kill -TERM \"$P\""),
    ("signal-0", "kill -0 \"$P\""),
    ("tcp-connect", "exec 3<>/dev/tcp/127.0.0.1/$T"),
    ("tmp-write", ": > /tmp/xw-confine-planted-$$"),
    ("devshm-write", ": > /dev/shm/xw-confine-planted-$$"),
];

fn script_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("xw-confine-bin-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn write_tool(dir: &Path, name: &str, text: &str) {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn env_for(bin: &Path) -> RunbookEnv {
    RunbookEnv {
        search_path: vec![bin.to_path_buf()],
        sysfs_root: PathBuf::from("/sys"),
        procfs_root: PathBuf::from("/proc"),
        nvml: None,
        host: "test-host".into(),
        secrets: Redactor::default(),
        show_arguments: false,
    }
}

/// Runs `program` as an operator's `allow` entry and returns its output.
async fn run_allowed(bin: &Path, program: &str) -> String {
    let catalog = Catalog::with_additions(&[vec![program.to_string()]]).unwrap();
    let text = format!(
        "title = \"t\"\nfallback = true\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n[limits]\nstep_timeout_secs = 20\n[[step]]\nname = \"attack\"\nrun = [\"{program}\"]\n"
    );
    let rb = Runbook::from_toml(Path::new("attack.toml"), &text, &catalog).unwrap();
    let ev = rb
        .run(
            &Subject::manual(None, None, None),
            &env_for(bin),
            &RunLimits::default(),
        )
        .await;
    let s = &ev.steps[0];
    assert!(
        matches!(s.status, StepStatus::Done { .. }),
        "{program} did not run: {s:?}"
    );
    s.output.clone()
}

/// Every line `NAME: DONE` or `NAME: denied`; returns the names that got through.
fn got_through(output: &str, expected: usize) -> Vec<String> {
    let lines: Vec<&str> = output.lines().filter(|l| l.contains(": ")).collect();
    let verdicts: Vec<(&str, &str)> = lines
        .iter()
        .filter_map(|l| l.rsplit_once(": "))
        .filter(|(_, v)| *v == "DONE" || *v == "denied")
        .collect();
    assert_eq!(
        verdicts.len(),
        expected,
        "not every attack reported:\n{output}"
    );
    verdicts
        .iter()
        .filter(|(_, v)| *v == "DONE")
        .map(|(n, _)| n.to_string())
        .collect()
}

fn require_landlock() {
    let s = Support::probe();
    assert!(
        s.landlock_abi.is_some_and(|a| a >= 6) && s.seccomp,
        "this test needs Landlock ABI 6 or later and seccomp; the kernel offers {s}"
    );
}

#[tokio::test]
async fn a_shell_script_allowed_by_the_operator_harms_nothing() {
    require_landlock();
    let mut t = Targets::new();
    let bin = script_dir();
    let mut body = format!(
        "#!/bin/bash\nD={}\nP={}\nT={}\nA={}\n",
        t.dir.path().display(),
        t.victim.id(),
        t.tcp.local_addr().unwrap().port(),
        t.abstract_name
    );
    for (name, cmd) in SHELL_ATTACKS {
        body.push_str(&format!(
            "if ( {cmd} ) >/dev/null 2>&1; then echo '{name}: DONE'; else echo '{name}: denied'; fi\n"
        ));
    }
    write_tool(bin.path(), "probe-shell", &body);
    let out = run_allowed(bin.path(), "probe-shell").await;
    let through = got_through(&out, SHELL_ATTACKS.len());
    assert!(through.is_empty(), "got through: {through:?}\n{out}");
    t.assert_unharmed("shell");
}

const PYTHON: &str = r#"#!/usr/bin/python3
import ctypes, os, signal, socket, sys
D, P, T, A = sys.argv[1:5] if len(sys.argv) > 4 else (None,) * 4
def attack(name, fn):
    try:
        fn()
        print(name + ": DONE")
    except Exception:
        print(name + ": denied")
def write(): open(D + "/planted", "w").write("x")
def truncate(): os.truncate(D + "/state.json", 0)
def read(): open(D + "/xidwatch.toml").read()
def kill(): os.kill(int(P), signal.SIGTERM)
def tcp(): socket.create_connection(("127.0.0.1", int(T)), timeout=2)
def udp(): socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", 623))
def bind(): socket.socket(socket.AF_INET, socket.SOCK_STREAM).bind(("127.0.0.1", 0))
def unix_abstract():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0" + A)
def ptrace():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(16, int(P), 0, 0) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), "ptrace")
def keyring():
    libc = ctypes.CDLL(None, use_errno=True)
    # add_key("user", "xw", "x", 1, KEY_SPEC_PROCESS_KEYRING): harmless, and allowed to anyone.
    if libc.syscall(248, b"user", b"xw", b"x", 1, -2) < 0:
        raise OSError(ctypes.get_errno(), "add_key")
attack("py-write", write)
attack("py-truncate", truncate)
attack("py-read-config", read)
attack("py-signal", kill)
attack("py-tcp", tcp)
attack("py-udp", udp)
attack("py-bind", bind)
attack("py-abstract-unix", unix_abstract)
attack("py-ptrace", ptrace)
attack("py-keyring", keyring)
"#;

#[cfg(target_arch = "x86_64")] // the system call numbers in the python script
#[tokio::test]
async fn python_and_perl_allowed_by_the_operator_harm_nothing() {
    require_landlock();
    let mut t = Targets::new();
    let bin = script_dir();
    let args = format!(
        "{} {} {} {}",
        t.dir.path().display(),
        t.victim.id(),
        t.tcp.local_addr().unwrap().port(),
        t.abstract_name
    );
    // The step's argv is fixed by the catalog, so a wrapper passes the targets.
    write_tool(bin.path(), "attack.py", PYTHON);
    write_tool(
        bin.path(),
        "probe-python",
        &format!(
            "#!/bin/sh\nexec /usr/bin/python3 {}/attack.py {args}\n",
            bin.path().display()
        ),
    );
    let out = run_allowed(bin.path(), "probe-python").await;
    let through = got_through(&out, 10);
    assert!(through.is_empty(), "got through: {through:?}\n{out}");
    t.assert_unharmed("python3");

    let perl = format!(
        r#"#!/usr/bin/perl
use Socket;
my ($D, $P, $T) = qw({args});
sub attack {{ my ($n, $ok) = @_; print "$n: ", ($ok ? "DONE" : "denied"), "\n"; }}
attack("pl-write", open(my $f, '>', "$D/planted"));
attack("pl-truncate", truncate("$D/state.json", 0));
attack("pl-read-config", open(my $c, '<', "$D/xidwatch.toml"));
attack("pl-signal", kill('TERM', $P));
my $s; socket($s, PF_INET, SOCK_STREAM, 0);
attack("pl-tcp", $s && connect($s, sockaddr_in($T, inet_aton("127.0.0.1"))));
attack("pl-exec-shell", system("/bin/sh", "-c", ": > $D/planted2") == 0);
"#
    );
    write_tool(bin.path(), "probe-perl", &perl);
    let out = run_allowed(bin.path(), "probe-perl").await;
    let through = got_through(&out, 6);
    assert!(through.is_empty(), "got through: {through:?}\n{out}");
    t.assert_unharmed("perl");
}

/// The same attacks get through when nothing confines them: the targets are really within the
/// step user's reach, so the tests above prove the confinement and not a permission.
#[test]
fn the_targets_are_reachable_without_the_confinement() {
    let mut t = Targets::new();
    let uid = step_uid();
    let mut body = format!(
        "D={}\nP={}\nT={}\n",
        t.dir.path().display(),
        t.victim.id(),
        t.tcp.local_addr().unwrap().port()
    );
    for name in ["append-state", "read-config", "signal-0", "tcp-connect"] {
        let (_, cmd) = SHELL_ATTACKS.iter().find(|(n, _)| *n == name).unwrap();
        body.push_str(&format!(
            "if ( {cmd} ) >/dev/null 2>&1; then echo '{name}: DONE'; else echo '{name}: denied'; fi\n"
        ));
    }
    let mut cmd = Command::new("/bin/bash");
    cmd.arg("-c").arg(body);
    std::os::unix::process::CommandExt::uid(&mut cmd, uid);
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let through = got_through(&text, 4);
    assert_eq!(
        through,
        ["append-state", "read-config", "signal-0", "tcp-connect"],
        "{text}"
    );
    std::fs::write(t.state(), "intact\n").unwrap();
    t.assert_unharmed_but_for_the_connection();
}

impl Targets {
    fn assert_unharmed_but_for_the_connection(&mut self) {
        let _ = self.tcp.accept();
        self.assert_unharmed("unconfined");
    }
}

/// `check` says which confinement this kernel gives, and the operator's entries are checked
/// under it.
#[test]
fn check_names_the_confinement() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("xidwatch.toml");
    std::fs::write(
        &cfg,
        "[nvml]\nenabled = false\n[runbooks]\nallow = [[\"ibstat\"]]\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
        .args(["check", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let s = Support::probe();
    assert!(
        text.contains(&format!("runbook steps confined by: {s}")),
        "{text}"
    );
    assert!(text.contains("Landlock ABI"), "{text}");
}

/// The state-changing commands operators were able to allow before: the catalog now takes them
/// as any entry (no list of bad programs), and they get none of the shipped patterns' access: no
/// capability, no NVIDIA device files, no socket, no kernel log. Inside the confinement shown
/// above they fail closed; none is run here, as nothing in this project runs a destructive command.
#[test]
fn state_changing_entries_get_no_access_beyond_reading() {
    let entries: &[&[&str]] = &[
        &["nvidia-smi", "-r"],
        &["nvidia-smi", "--gpu-reset"],
        &["nvidia-smi", "-pm", "1"],
        &["nvidia-smi", "-e", "0"],
        &["nvidia-smi", "-pl", "100"],
        &["nvidia-smi", "-mig", "1"],
        &["dmesg", "-C"],
        &["journalctl", "--vacuum-time=1s"],
        &["systemctl", "reboot"],
        &["ip", "link", "set", "eth0", "down"],
        &["kmod", "remove", "nvidia"],
        &["udevadm", "trigger", "--action=remove"],
        &["dcgmi", "diag", "-r", "1"],
        &["dcgmi", "config", "--set", "-P", "1"],
        &["ipmipower", "-h", "bmc", "--reset"],
        &["python3.11"],
        &["perl5.36.0"],
        &["nodejs"],
        &["rbash"],
        &["mksh"],
        &["setarch", "x86_64"],
        &["systemd-cat"],
        &["prlimit"],
        &["git", "-c", "alias.x=!reboot", "x"],
        &["dc", "-e", "!reboot"],
        &["skill", "-KILL", "xidwatch"],
    ];
    let extra: Vec<Vec<String>> = entries
        .iter()
        .map(|e| e.iter().map(|w| w.to_string()).collect())
        .collect();
    let catalog = Catalog::with_additions(&extra).unwrap();
    let added: Vec<_> = catalog.patterns().filter(|p| !p.shipped()).collect();
    assert_eq!(added.len(), entries.len());
    for p in added {
        assert_eq!(
            p.needs(),
            xidwatch::runbook::confine::Needs::default(),
            "{p}"
        );
        assert!(!p.kernel_log(), "{p}");
    }
}

/// Who could put another program under a catalog name is refused: a search directory others can
/// write (here world-writable, without the sticky bit), and a program with a second hard link.
#[tokio::test]
async fn search_directories_others_can_write_and_hard_links_are_refused() {
    let real = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake-tools/echo-argv");
    let refused = |out: &xidwatch::model::StepResult, needle: &str| matches!(&out.status, StepStatus::Failed { error } if error.contains(needle));
    let step = |bin: PathBuf| async move {
        let catalog = Catalog::with_additions(&[vec!["echo-argv".to_string()]]).unwrap();
        let text = "title = \"t\"\nfallback = true\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n[[step]]\nrun = [\"echo-argv\"]\n";
        let rb = Runbook::from_toml(Path::new("t.toml"), text, &catalog).unwrap();
        let ev = rb
            .run(
                &Subject::manual(None, None, None),
                &env_for(&bin),
                &RunLimits::default(),
            )
            .await;
        ev.steps[0].clone()
    };

    let open = script_dir();
    std::fs::copy(&real, open.path().join("echo-argv")).unwrap();
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let s = step(open.path().to_path_buf()).await;
    assert!(refused(&s, "is writable by others"), "{s:?}");
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let s = step(open.path().to_path_buf()).await;
    assert!(
        matches!(s.status, StepStatus::Done { .. }),
        "the same directory, closed again: {s:?}"
    );

    std::fs::hard_link(open.path().join("echo-argv"), open.path().join("lsmod")).unwrap();
    let s = step(open.path().to_path_buf()).await;
    assert!(refused(&s, "hard links"), "{s:?}");
}
