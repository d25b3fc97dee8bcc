//! `xidwatch install` and `xidwatch uninstall`, run as the built binary against a temporary
//! `--root`, so nothing here touches the machine, needs root or runs a program (with `--root`
//! other than /, no user is created).
//!
//! Not here: starting the installed unit's ExecStart= as systemd would; that needs the daemon.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tempfile::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_xidwatch");

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn shipped(rel: &str) -> String {
    fs::read_to_string(repo(rel)).unwrap()
}

/// The repository's runbooks/*.toml, by file name.
fn shipped_runbooks() -> BTreeMap<String, String> {
    fs::read_dir(repo("runbooks"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// Runs the binary; panics with its output unless it exits 0.
fn run(args: &[&str], root: &Path) -> String {
    let out = run_status(args, root);
    assert!(
        out.status.success(),
        "xidwatch {args:?} failed: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn run_status(args: &[&str], root: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .arg("--root")
        .arg(root)
        .output()
        .unwrap()
}

/// Every entry under `root`: kind, mode, owner, size, mtime and (for small files) the content.
/// Equal snapshots mean nothing was created, removed, rewritten, chmod-ed or chown-ed.
type Snapshot = BTreeMap<PathBuf, (u32, u32, u32, u64, i64, i64, Option<Vec<u8>>)>;

fn snapshot(root: &Path) -> Snapshot {
    let mut out = Snapshot::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let m = path.symlink_metadata().unwrap();
            let content = (m.is_file() && m.len() < 1 << 20).then(|| fs::read(&path).unwrap());
            if m.is_dir() {
                stack.push(path.clone());
            }
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            out.insert(
                rel,
                (
                    m.mode(),
                    m.uid(),
                    m.gid(),
                    m.len(),
                    m.mtime(),
                    m.mtime_nsec(),
                    content,
                ),
            );
        }
    }
    out
}

/// The files and symlinks under `root`, relative.
fn files(root: &Path) -> Vec<String> {
    snapshot(root)
        .into_iter()
        .filter(|(_, v)| v.0 & 0o170000 != 0o040000)
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect()
}

fn mode(path: &Path) -> u32 {
    path.metadata().unwrap().permissions().mode() & 0o7777
}

fn installed(extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "etc/systemd/system/xidwatch.service",
        "etc/xidwatch/xidwatch.toml",
        "usr/lib/sysusers.d/xidwatch.conf",
        "usr/lib/tmpfiles.d/xidwatch.conf",
        "usr/local/bin/xidwatch",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(
        shipped_runbooks()
            .into_keys()
            .map(|n| format!("usr/share/xidwatch/runbooks/{n}")),
    )
    .chain(extra.iter().map(|s| s.to_string()))
    .collect();
    v.sort();
    v
}

fn fresh_install() -> TempDir {
    let root = TempDir::new().unwrap();
    run(&["install"], root.path());
    root
}

#[test]
fn install_puts_every_file_in_place_with_its_mode() {
    let root = TempDir::new().unwrap();
    let r = root.path();
    let out = run(&["install"], r);

    assert_eq!(files(r), installed(&[]), "{out}");

    let bin = r.join("usr/local/bin/xidwatch");
    assert_eq!(mode(&bin), 0o755);
    // The running binary, copied as it is (a release build has no debug info to strip).
    let running = fs::read(BIN).unwrap();
    let copy = fs::read(&bin).unwrap();
    assert!(copy == running, "installed as built:\n{out}");
    let version = Command::new(&bin).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("xidwatch {}", env!("CARGO_PKG_VERSION"))
    );

    let unit = r.join("etc/systemd/system/xidwatch.service");
    assert_eq!(mode(&unit), 0o644);
    let unit_text = fs::read_to_string(&unit).unwrap();
    let execs: Vec<_> = unit_text
        .lines()
        .filter(|l| l.starts_with("ExecStart="))
        .collect();
    assert_eq!(
        execs,
        ["ExecStart=/usr/local/bin/xidwatch run --config /etc/xidwatch/xidwatch.toml"],
        "ExecStart= names where install put the binary, inside the root's view"
    );
    assert_eq!(
        unit_text.replace("/usr/local/bin/xidwatch run", "/usr/bin/xidwatch run"),
        shipped("systemd/xidwatch.service"),
        "only ExecStart= differs from the template"
    );

    for (rel, src) in [
        (
            "usr/lib/sysusers.d/xidwatch.conf",
            "systemd/xidwatch.sysusers",
        ),
        (
            "usr/lib/tmpfiles.d/xidwatch.conf",
            "systemd/xidwatch.tmpfile",
        ),
    ] {
        assert_eq!(mode(&r.join(rel)), 0o644, "{rel}");
        assert_eq!(
            fs::read_to_string(r.join(rel)).unwrap(),
            shipped(src),
            "{rel}"
        );
    }

    let config = r.join("etc/xidwatch/xidwatch.toml");
    assert_eq!(mode(&config), 0o640, "the config may hold secrets");
    assert_eq!(
        fs::read_to_string(&config).unwrap(),
        shipped("systemd/xidwatch.toml")
    );

    for dir in [
        "etc/xidwatch",
        "usr/share/xidwatch",
        "usr/share/xidwatch/runbooks",
        "usr/local/bin",
    ] {
        assert_eq!(mode(&r.join(dir)), 0o755, "{dir}");
    }
    for (name, text) in shipped_runbooks() {
        let path = r.join("usr/share/xidwatch/runbooks").join(&name);
        assert_eq!(mode(&path), 0o644, "{name}");
        assert_eq!(fs::read_to_string(&path).unwrap(), text, "{name}");
    }

    assert!(
        !out.lines().any(|l| l.starts_with("run")),
        "no program runs under --root:\n{out}"
    );
    assert!(out.contains("install: "), "{out}");
    assert!(
        out.contains(&format!(
            "systemctl --root={} enable xidwatch.service",
            r.display()
        )),
        "{out}"
    );
}

#[test]
fn a_second_install_changes_nothing_and_says_so() {
    let root = fresh_install();
    let before = snapshot(root.path());
    let out = run(&["install"], root.path());
    assert_eq!(snapshot(root.path()), before, "{out}");
    assert!(out.contains("install: 0 changed"), "{out}");
    let root_path = root.path().display().to_string();
    for line in out.lines().filter(|l| l.contains(&root_path)) {
        if !(line.starts_with("note:") || line.starts_with("next:")) {
            assert!(line.starts_with("unchanged "), "{line}");
        }
    }
}

#[test]
fn an_edited_config_is_kept_and_the_new_default_goes_beside_it() {
    let root = fresh_install();
    let config = root.path().join("etc/xidwatch/xidwatch.toml");
    let edited = format!(
        "{}\n[[alerts.webhook]]\nname = \"slack\"\n",
        shipped("systemd/xidwatch.toml")
    );
    fs::write(&config, &edited).unwrap();

    let out = run(&["install"], root.path());
    assert_eq!(
        fs::read_to_string(&config).unwrap(),
        edited,
        "never overwritten"
    );
    let new = root.path().join("etc/xidwatch/xidwatch.toml.new");
    assert_eq!(
        fs::read_to_string(&new).unwrap(),
        shipped("systemd/xidwatch.toml")
    );
    assert_eq!(mode(&new), 0o640);
    assert!(
        out.contains("keep ") && out.contains("xidwatch.toml.new"),
        "{out}"
    );

    // And that state is stable too.
    let before = snapshot(root.path());
    let out = run(&["install"], root.path());
    assert_eq!(snapshot(root.path()), before, "{out}");
    assert!(out.contains("install: 0 changed"), "{out}");
}

#[test]
fn a_loosened_config_mode_is_tightened_again() {
    let root = fresh_install();
    let config = root.path().join("etc/xidwatch/xidwatch.toml");
    fs::set_permissions(&config, fs::Permissions::from_mode(0o644)).unwrap();
    let out = run(&["install"], root.path());
    assert_eq!(mode(&config), 0o640, "{out}");
    assert!(out.contains("install: 1 changed"), "{out}");
}

#[test]
fn dry_run_prints_every_action_and_changes_nothing() {
    let root = TempDir::new().unwrap();
    let out = run(&["install", "--dry-run"], root.path());
    assert!(snapshot(root.path()).is_empty(), "{out}");
    for rel in installed(&[]) {
        let line = format!("would create {}", root.path().join(&rel).display());
        assert!(
            out.lines().any(|l| l.starts_with(&line)),
            "missing {line:?} in\n{out}"
        );
    }
    assert!(out.contains("nothing was changed"), "{out}");

    // Against an installed tree with an edited, loosened config and a stale runbook.
    run(&["install"], root.path());
    let config = root.path().join("etc/xidwatch/xidwatch.toml");
    fs::write(&config, "# mine\n").unwrap();
    fs::set_permissions(&config, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(
        root.path().join("usr/share/xidwatch/runbooks/zz-old.toml"),
        "",
    )
    .unwrap();
    let before = snapshot(root.path());
    let out = run(&["install", "--dry-run"], root.path());
    assert_eq!(snapshot(root.path()), before, "{out}");
    assert!(
        out.contains("would update") && out.contains("would remove"),
        "{out}"
    );
}

#[test]
fn the_config_gets_the_xidwatch_group_when_the_root_knows_it() {
    let root = TempDir::new().unwrap();
    // A group this test may chgrp to even without root: the one it creates files with.
    fs::create_dir(root.path().join("etc")).unwrap();
    let probe = root.path().join("etc/probe");
    fs::write(&probe, "").unwrap();
    let gid = probe.metadata().unwrap().gid();
    fs::remove_file(&probe).unwrap();
    fs::write(
        root.path().join("etc/group"),
        format!("root:x:0:\nxidwatch:x:{gid}:\n"),
    )
    .unwrap();

    let out = run(&["install"], root.path());
    let config = root.path().join("etc/xidwatch/xidwatch.toml");
    assert_eq!(config.metadata().unwrap().gid(), gid, "{out}");
    assert!(!out.contains("no group xidwatch"), "{out}");
}

#[test]
fn without_the_group_install_says_tmpfiles_will_set_it() {
    let root = TempDir::new().unwrap();
    let out = run(&["install"], root.path());
    assert!(out.contains("no group xidwatch"), "{out}");
    assert!(out.contains("systemd-tmpfiles"), "{out}");
}

#[test]
fn runbooks_no_longer_shipped_are_removed() {
    let root = fresh_install();
    let stale = root.path().join("usr/share/xidwatch/runbooks/zz-old.toml");
    fs::write(&stale, "").unwrap();
    let out = run(&["install"], root.path());
    assert!(!stale.exists(), "{out}");
    assert!(out.contains("no longer shipped"), "{out}");
}

#[test]
fn a_unit_installed_by_a_package_is_not_shadowed() {
    let root = TempDir::new().unwrap();
    fs::create_dir_all(root.path().join("lib/systemd/system")).unwrap();
    fs::write(root.path().join("lib/systemd/system/xidwatch.service"), "").unwrap();
    let before = snapshot(root.path());
    let out = run_status(&["install"], root.path());
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("package manager"), "{err}");
    assert_eq!(snapshot(root.path()), before);
}

#[test]
fn uninstall_removes_what_install_put_and_keeps_config_and_state() {
    let root = fresh_install();
    let r = root.path();
    fs::create_dir_all(r.join("var/lib/xidwatch")).unwrap();
    fs::write(r.join("var/lib/xidwatch/checkpoint"), "boot 1\n").unwrap();
    // What `systemctl enable` leaves behind.
    fs::create_dir_all(r.join("etc/systemd/system/multi-user.target.wants")).unwrap();
    std::os::unix::fs::symlink(
        "/etc/systemd/system/xidwatch.service",
        r.join("etc/systemd/system/multi-user.target.wants/xidwatch.service"),
    )
    .unwrap();

    let out = run(&["uninstall"], r);
    assert_eq!(
        files(r),
        ["etc/xidwatch/xidwatch.toml", "var/lib/xidwatch/checkpoint"],
        "{out}"
    );
    assert!(!r.join("usr/share/xidwatch").exists(), "{out}");
    assert!(out.contains("--purge removes it"), "{out}");

    let before = snapshot(r);
    let out = run(&["uninstall"], r);
    assert_eq!(snapshot(r), before, "{out}");
    assert!(out.contains("uninstall: 0 changed"), "{out}");
}

#[test]
fn uninstall_keeps_files_it_did_not_ship_in_its_directories() {
    let root = fresh_install();
    let mine = root.path().join("usr/share/xidwatch/notes.txt");
    fs::write(&mine, "").unwrap();
    let out = run(&["uninstall"], root.path());
    assert!(mine.exists(), "{out}");
    assert!(
        out.contains("holds files not installed by xidwatch"),
        "{out}"
    );
}

#[test]
fn uninstall_purge_removes_config_and_state_too() {
    let root = fresh_install();
    let r = root.path();
    fs::create_dir_all(r.join("var/lib/xidwatch/outbox")).unwrap();
    fs::write(r.join("var/lib/xidwatch/outbox/1.json"), "{}").unwrap();
    fs::write(r.join("etc/xidwatch/xidwatch.toml"), "# edited\n").unwrap();
    run(&["install"], r); // leaves xidwatch.toml.new as well
    let out = run(&["uninstall", "--purge"], r);
    assert!(files(r).is_empty(), "{:?}\n{out}", files(r));
    assert!(!r.join("etc/xidwatch").exists() && !r.join("var/lib/xidwatch").exists());
}

#[test]
fn uninstall_dry_run_changes_nothing() {
    let root = fresh_install();
    let before = snapshot(root.path());
    for args in [
        &["uninstall", "--dry-run"][..],
        &["uninstall", "--dry-run", "--purge"],
    ] {
        let out = run(args, root.path());
        assert_eq!(snapshot(root.path()), before, "{out}");
        assert!(out.contains("would remove"), "{out}");
        assert!(out.contains("nothing was changed"), "{out}");
    }
}

#[test]
fn the_default_config_parses_as_shipped_and_with_every_key_uncommented() {
    let text = shipped("systemd/xidwatch.toml");
    let as_shipped: toml::Table = text.parse().unwrap();
    assert!(
        as_shipped
            .values()
            .all(|v| v.as_table().is_some_and(|t| t.is_empty())),
        "as shipped it sets nothing: {as_shipped:?}"
    );
    // "#key = ..." and "#[table]" lines are the examples; "# words" lines are prose.
    let uncommented: String = text
        .lines()
        .map(|l| match l.strip_prefix('#') {
            Some(rest) if rest.starts_with(|c: char| c.is_ascii_lowercase() || c == '[') => rest,
            _ => l,
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let all: toml::Table = uncommented
        .parse()
        .unwrap_or_else(|e| panic!("{e}\n{uncommented}"));
    for key in [
        "kmsg", "nvml", "state", "runbooks", "xid", "alerts", "metrics",
    ] {
        assert!(
            all.contains_key(key),
            "{key} missing from the example config"
        );
    }
    let alerts = all["alerts"].as_table().unwrap();
    for kind in ["webhook", "email", "alertmanager"] {
        assert!(
            alerts[kind].as_array().is_some_and(|a| !a.is_empty()),
            "alerts.{kind}"
        );
    }
    // Every uncommented key is one the daemon accepts with a valid value, alert channels
    // included (their file: secrets pointed at test files; the runbook directories are the
    // repo's).
    let secrets = tempfile::tempdir().unwrap();
    for name in ["slack-url", "smtp-password"] {
        std::fs::write(secrets.path().join(name), "https://hooks.example.com/x\n").unwrap();
    }
    let uncommented = uncommented.replace(
        "file:/etc/xidwatch/",
        &format!("file:{}/", secrets.path().display()),
    );
    let mut daemon_keys: toml::Table = uncommented.parse().unwrap();
    daemon_keys["runbooks"]["dirs"] = toml::Value::Array(vec![toml::Value::String(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("runbooks")
            .display()
            .to_string(),
    )]);
    if let Err(e) = xidwatch::config::Config::from_toml(&daemon_keys.to_string(), None) {
        panic!("the example config does not load: {e}");
    }
}

/// A binary copied alone to a machine (no package, no source tree) runs with the runbooks built
/// into it: `check` and `runbook list` succeed, and nothing they report points at the build
/// machine's source tree, which a fleet node does not have.
#[test]
fn the_binary_alone_runs_with_its_built_in_runbooks() {
    let d = TempDir::new().unwrap();
    let bin = d.path().join("xidwatch");
    fs::copy(BIN, &bin).unwrap();
    let cfg = d.path().join("xidwatch.toml");
    fs::write(
        &cfg,
        format!(
            "[kmsg]\npath = {:?}\n[nvml]\nenabled = false\n[state]\ndir = {:?}\n",
            d.path().join("kmsg"),
            d.path().join("state")
        ),
    )
    .unwrap();
    let source = repo("runbooks");
    for args in [
        &["check", "--config"][..],
        &["runbook", "list", "--config"][..],
    ] {
        let out = Command::new(&bin)
            .args(args)
            .arg(&cfg)
            .current_dir(d.path())
            .env_remove("CARGO_MANIFEST_DIR")
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{args:?}: {all}");
        assert!(
            !all.contains(source.to_str().unwrap()),
            "{args:?} names the build tree: {all}"
        );
        assert!(
            args[0] != "check"
                || all.contains("(built into the binary)")
                || all.contains("/usr/share/xidwatch/runbooks"),
            "{args:?}: {all}"
        );
        for name in shipped_runbooks().keys() {
            let name = name.trim_end_matches(".toml");
            assert!(all.contains(name), "{args:?} lacks {name}: {all}");
        }
    }
}

/// `--root` need not exist: a dry run says it would create it and changes nothing (the directory
/// is still not there), an install creates it, and an uninstall from nowhere says so clearly.
#[test]
fn a_root_that_does_not_exist_yet() {
    let d = TempDir::new().unwrap();
    let root = d.path().join("image/rootfs");
    let out = run(&["install", "--dry-run"], &root);
    assert!(
        out.contains("would create") && out.contains("nothing was changed"),
        "{out}"
    );
    assert!(!d.path().join("image").exists());
    let out = run(&["install"], &root);
    assert!(out.contains("did not exist"), "{out}");
    assert!(root.join("etc/xidwatch/xidwatch.toml").is_file());
    let gone = d.path().join("never");
    let out = run_status(&["uninstall"], &gone);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not exist"), "{err}");
}

/// The same with the build tree really gone: in a mount namespace of its own (the machine's
/// mounts are untouched) an empty tmpfs covers the source tree, and the copied binary still
/// checks its config and lists every shipped runbook.
#[test]
#[ignore = "needs root"]
fn as_root_the_binary_runs_with_the_source_tree_hidden() {
    super::support::require_root("it mounts a tmpfs over the source tree in a private namespace");
    let d = TempDir::new().unwrap();
    let bin = d.path().join("xidwatch");
    fs::copy(BIN, &bin).unwrap();
    let cfg = d.path().join("xidwatch.toml");
    fs::write(
        &cfg,
        format!(
            "[kmsg]\npath = {:?}\n[nvml]\nenabled = false\n[state]\ndir = {:?}\n",
            d.path().join("kmsg"),
            d.path().join("state")
        ),
    )
    .unwrap();
    let source = repo("");
    let script = format!(
        "mount -t tmpfs none {src:?} && test ! -e {src:?}/runbooks && {bin:?} check --config {cfg:?} && {bin:?} runbook list --config {cfg:?}",
        src = source,
        bin = bin,
        cfg = cfg
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .current_dir(d.path())
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{all}");
    for name in shipped_runbooks().keys() {
        let name = name.trim_end_matches(".toml");
        assert!(all.contains(name), "lacks {name}: {all}");
    }
    assert!(
        repo("runbooks").is_dir(),
        "the source tree is still there outside"
    );
}
