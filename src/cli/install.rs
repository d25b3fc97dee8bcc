//! `xidwatch install` and `xidwatch uninstall`: put the binary, the systemd unit, the sysusers.d
//! and tmpfiles.d entries, the commented default config and the shipped runbooks in place, or take
//! them away again.
//!
//! Every step compares what is on disk with what should be there and prints one line, so a rerun
//! changes nothing and says so, and `--dry-run` prints the same lines and changes nothing. An
//! edited config is never overwritten. Nothing here starts, stops, enables or reloads a service:
//! the systemctl commands are printed for the operator to run. With `--root DIR` (images, tests)
//! only files under DIR are written and no program is run. The binary is copied as it is: the
//! release profile builds it without debug info or symbols.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// The unit, with `ExecStart=/usr/bin/xidwatch ...` (the .deb's path) rewritten on install.
const UNIT: &str = include_str!("../../systemd/xidwatch.service");
const SYSUSERS: &str = include_str!("../../systemd/xidwatch.sysusers");
const TMPFILES: &str = include_str!("../../systemd/xidwatch.tmpfile");
/// The default config: every key commented out.
pub const DEFAULT_CONFIG: &str = include_str!("../../systemd/xidwatch.toml");

/// Every runbooks/*.toml, by file name, as embedded at build time.
pub use crate::runbook::EMBEDDED as RUNBOOKS;

/// Where things go, relative to the root.
const BIN: &str = "usr/local/bin/xidwatch";
const UNIT_FILE: &str = "etc/systemd/system/xidwatch.service";
const WANTS_LINK: &str = "etc/systemd/system/multi-user.target.wants/xidwatch.service";
/// Where a package puts the unit; `install` refuses to shadow it.
const PACKAGED_UNITS: [&str; 2] = [
    "usr/lib/systemd/system/xidwatch.service",
    "lib/systemd/system/xidwatch.service",
];
const SYSUSERS_FILE: &str = "usr/lib/sysusers.d/xidwatch.conf";
const TMPFILES_FILE: &str = "usr/lib/tmpfiles.d/xidwatch.conf";
const CONFIG_DIR: &str = "etc/xidwatch";
const CONFIG_FILE: &str = "etc/xidwatch/xidwatch.toml";
const CONFIG_NEW: &str = "etc/xidwatch/xidwatch.toml.new";
const SHARE_DIR: &str = "usr/share/xidwatch";
const RUNBOOK_DIR: &str = "usr/share/xidwatch/runbooks";
const STATE_DIR: &str = "var/lib/xidwatch";

/// The binary path the unit template names; replaced by the path `install` wrote.
const TEMPLATE_EXEC: &str = "/usr/bin/xidwatch";
const USER: &str = "xidwatch";

#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// Install under this directory instead of / (an image being built, a test). Writes the
    /// sysusers.d entry but creates no user and runs nothing.
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// Print each action; change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, clap::Args)]
pub struct UninstallArgs {
    /// Uninstall from this directory instead of /.
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// Print each action; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Also remove the config (/etc/xidwatch) and the state (/var/lib/xidwatch: checkpoint and
    /// unsent alerts). The user account is never removed.
    #[arg(long)]
    pub purge: bool,
}

pub fn install(args: &InstallArgs) -> anyhow::Result<u8> {
    let mut s = Session::new(&args.root, args.dry_run, true)?;
    let r = s.install();
    s.finish("install", r)
}

pub fn uninstall(args: &UninstallArgs) -> anyhow::Result<u8> {
    let mut s = Session::new(&args.root, args.dry_run, false)?;
    let r = s.uninstall(args.purge);
    s.finish("uninstall", r)
}

/// The unit file with `ExecStart=` pointing at `exec`.
pub fn unit_with_exec(exec: &str) -> String {
    let mut out = String::with_capacity(UNIT.len());
    for line in UNIT.lines() {
        match line
            .strip_prefix("ExecStart=")
            .and_then(|l| l.strip_prefix(TEMPLATE_EXEC))
        {
            Some(rest) => writeln!(out, "ExecStart={exec}{rest}"),
            None => writeln!(out, "{line}"),
        }
        .expect("writing to a String");
    }
    out
}

/// What one step did (or, with `--dry-run`, would do).
#[derive(Clone, Copy, PartialEq)]
enum Outcome {
    Create,
    Update,
    Remove,
    Run,
    Unchanged,
    /// Left as it is on purpose (an edited config, kept data).
    Keep,
    Absent,
}

impl Outcome {
    fn is_change(self) -> bool {
        matches!(self, Self::Create | Self::Update | Self::Remove | Self::Run)
    }
    fn word(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Update => "update",
            Self::Remove => "remove",
            Self::Run => "run",
            Self::Unchanged => "unchanged",
            Self::Keep => "keep",
            Self::Absent => "absent",
        }
    }
}

struct Session {
    root: PathBuf,
    /// Installing onto the running system (root is /): users may be created, hints name sudo.
    on_host: bool,
    dry_run: bool,
    changed: usize,
    unchanged: usize,
    notes: Vec<String>,
    /// Paths removed (or, in a dry run, that would have been).
    gone: HashSet<PathBuf>,
}

impl Session {
    /// `create`: a `--root` that does not exist yet is created (install into an empty image
    /// tree); with `--dry-run` it is only said, since a dry run changes nothing, and the run
    /// goes on as into an empty directory.
    fn new(root: &Path, dry_run: bool, create: bool) -> anyhow::Result<Self> {
        let missing = matches!(
            std::fs::symlink_metadata(root),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound
        );
        let root = match (missing, create, dry_run) {
            (false, _, _) => root
                .canonicalize()
                .with_context(|| format!("--root {}", root.display()))?,
            (true, false, _) => bail!(
                "--root {} does not exist: nothing is installed there",
                root.display()
            ),
            (true, true, true) => {
                let root = std::path::absolute(root)
                    .with_context(|| format!("--root {}", root.display()))?;
                println!(
                    "would create {}  (--root does not exist yet)",
                    root.display()
                );
                root
            }
            (true, true, false) => {
                std::fs::create_dir_all(root)
                    .with_context(|| format!("--root {}: cannot create it", root.display()))?;
                println!("created   {}  (--root did not exist)", root.display());
                root.canonicalize()
                    .with_context(|| format!("--root {}", root.display()))?
            }
        };
        if !missing && !root.is_dir() {
            bail!("--root {} is not a directory", root.display());
        }
        Ok(Self {
            on_host: root == Path::new("/"),
            root,
            dry_run,
            changed: 0,
            unchanged: 0,
            notes: Vec::new(),
            gone: HashSet::new(),
        })
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// The path as the running system will see it (for ExecStart=, messages).
    fn target_path(rel: &str) -> String {
        format!("/{rel}")
    }

    fn report(&mut self, outcome: Outcome, what: &dyn std::fmt::Display, detail: &str) {
        if outcome.is_change() {
            self.changed += 1;
        } else {
            self.unchanged += 1;
        }
        let word = match (self.dry_run && outcome.is_change(), outcome.word()) {
            (true, w) => format!("would {w}"),
            (false, w) => w.to_string(),
        };
        let detail = if detail.is_empty() {
            String::new()
        } else {
            format!("  ({detail})")
        };
        println!("{word:<9} {what}{detail}");
    }

    fn finish(self, verb: &str, result: anyhow::Result<()>) -> anyhow::Result<u8> {
        if let Err(e) = result {
            let denied = e.chain().any(|c| {
                c.downcast_ref::<io::Error>()
                    .is_some_and(|e| e.kind() == io::ErrorKind::PermissionDenied)
            });
            return Err(if denied && self.on_host {
                e.context(format!(
                    "permission denied: run it as root (sudo xidwatch {verb})"
                ))
            } else {
                e
            });
        }
        for note in &self.notes {
            println!("{note}");
        }
        if self.dry_run {
            println!(
                "dry run: {} would change, {} unchanged; nothing was changed",
                self.changed, self.unchanged
            );
        } else {
            println!(
                "{verb}: {} changed, {} unchanged",
                self.changed, self.unchanged
            );
        }
        io::stdout().flush().context("writing to standard output")?;
        Ok(0)
    }

    fn install(&mut self) -> anyhow::Result<()> {
        for packaged in PACKAGED_UNITS {
            if self.path(packaged).exists() {
                bail!(
                    "{} exists: xidwatch is installed from a package here; upgrade or remove it \
                     with the package manager instead",
                    self.path(packaged).display()
                );
            }
        }
        let exe = std::env::current_exe().context("finding the running binary")?;
        let binary = fs::read(&exe).with_context(|| format!("reading {}", exe.display()))?;
        self.put_file(BIN, &binary, 0o755)?;
        self.put_file(
            UNIT_FILE,
            unit_with_exec(&Self::target_path(BIN)).as_bytes(),
            0o644,
        )?;
        self.put_file(SYSUSERS_FILE, SYSUSERS.as_bytes(), 0o644)?;
        self.put_file(TMPFILES_FILE, TMPFILES.as_bytes(), 0o644)?;
        self.install_runbooks()?;
        if self.on_host {
            self.create_user()?;
        }
        self.install_config()?;
        self.next_steps();
        Ok(())
    }

    fn install_runbooks(&mut self) -> anyhow::Result<()> {
        self.ensure_dir(SHARE_DIR)?;
        self.ensure_dir(RUNBOOK_DIR)?;
        for (name, text) in RUNBOOKS {
            self.put_file(&format!("{RUNBOOK_DIR}/{name}"), text.as_bytes(), 0o644)?;
        }
        // /usr/share is ours, not the operator's: a runbook an older version shipped goes.
        for name in self.toml_files(RUNBOOK_DIR)? {
            if !RUNBOOKS.iter().any(|(n, _)| *n == name) {
                self.remove_file(&format!("{RUNBOOK_DIR}/{name}"), "no longer shipped")?;
            }
        }
        Ok(())
    }

    fn install_config(&mut self) -> anyhow::Result<()> {
        self.ensure_dir(CONFIG_DIR)?;
        let path = self.path(CONFIG_FILE);
        match fs::read(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.put_file(CONFIG_FILE, DEFAULT_CONFIG.as_bytes(), 0o640)?;
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
            Ok(current) if current == DEFAULT_CONFIG.as_bytes() => {
                self.put_file(CONFIG_FILE, DEFAULT_CONFIG.as_bytes(), 0o640)?;
            }
            Ok(_) => {
                self.report(Outcome::Keep, &path.display(), "edited; left as it is");
                self.fix_mode(CONFIG_FILE, 0o640)?;
                self.put_file(CONFIG_NEW, DEFAULT_CONFIG.as_bytes(), 0o640)?;
                self.notes.push(format!(
                    "note: your edited {} was kept; the shipped default is in {} for comparison",
                    Self::target_path(CONFIG_FILE),
                    Self::target_path(CONFIG_NEW)
                ));
            }
        }
        self.config_group()
    }

    /// The daemon reads the config as group xidwatch: chgrp it when the group is known in the
    /// root's /etc/group. Otherwise the tmpfiles.d entry fixes it at boot.
    fn config_group(&mut self) -> anyhow::Result<()> {
        let path = self.path(CONFIG_FILE);
        let Some(gid) = self.group_id(USER)? else {
            if self.dry_run && self.on_host {
                self.report(
                    Outcome::Update,
                    &path.display(),
                    "group xidwatch, once the user exists",
                );
            } else {
                self.notes.push(format!(
                    "note: no group {USER} in {} yet: {} keeps its group until systemd-tmpfiles \
                     sets root:{USER} at boot",
                    self.path("etc/group").display(),
                    Self::target_path(CONFIG_FILE),
                ));
            }
            return Ok(());
        };
        let current = match fs::metadata(&path) {
            Ok(m) => Some(m.gid()),
            Err(e) if e.kind() == io::ErrorKind::NotFound && self.dry_run => None,
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        if current == Some(gid) {
            return Ok(());
        }
        self.report(
            Outcome::Update,
            &path.display(),
            &format!("group {USER} ({gid})"),
        );
        if !self.dry_run {
            std::os::unix::fs::chown(&path, None, Some(gid))
                .with_context(|| format!("setting the group of {} to {USER}", path.display()))?;
        }
        Ok(())
    }

    /// Creates the system user on the running system: systemd-sysusers with our sysusers.d
    /// entry where systemd is, useradd elsewhere.
    fn create_user(&mut self) -> anyhow::Result<()> {
        if self.user_exists(USER)? {
            self.report(Outcome::Unchanged, &format!("user {USER}"), "exists");
            return Ok(());
        }
        let mut cmd = match find_program("systemd-sysusers") {
            Some(p) => {
                let mut c = Command::new(p);
                c.arg(Self::target_path(SYSUSERS_FILE));
                c
            }
            None => {
                let p = find_program("useradd").context("neither systemd-sysusers nor useradd found: create the system user xidwatch by hand")?;
                let mut c = Command::new(p);
                c.args([
                    "--system",
                    "--user-group",
                    "--no-create-home",
                    "--home-dir",
                    "/",
                ])
                .args([
                    "--shell",
                    "/usr/sbin/nologin",
                    "--comment",
                    "xidwatch GPU fault watcher",
                    USER,
                ]);
                c
            }
        };
        let shown = std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        self.report(Outcome::Run, &shown, &format!("create user {USER}"));
        if self.dry_run {
            return Ok(());
        }
        let status = cmd.status().with_context(|| format!("running {shown}"))?;
        if !status.success() {
            bail!("{shown} failed ({status})");
        }
        if !self.user_exists(USER)? {
            bail!("{shown} succeeded but there is still no user {USER} in /etc/passwd");
        }
        Ok(())
    }

    fn next_steps(&mut self) {
        let enabled = self.path(WANTS_LINK).symlink_metadata().is_ok();
        if !self.on_host {
            self.notes.push(format!(
                "next: the user is created at first boot (systemd-sysusers); to start xidwatch at \
                 boot run: systemctl --root={} enable xidwatch.service",
                self.root.display()
            ));
        } else if enabled {
            if self.changed > 0 {
                self.notes.push(
                    "next: sudo systemctl daemon-reload && sudo systemctl restart xidwatch".into(),
                );
            }
        } else {
            self.notes.push(
                "next:\n  \
                 sudoedit /etc/xidwatch/xidwatch.toml   # add an alert channel (docs/install.md)\n  \
                 sudo xidwatch check                    # read it as the service will\n  \
                 sudo xidwatch test-alert               # a test message to every channel\n  \
                 sudo systemctl daemon-reload\n  \
                 sudo systemctl enable --now xidwatch\n  \
                 journalctl -u xidwatch -f"
                    .into(),
            );
        }
    }

    fn uninstall(&mut self, purge: bool) -> anyhow::Result<()> {
        // What `systemctl disable` would remove; left behind it would dangle.
        self.remove_file(WANTS_LINK, "enable link")?;
        self.remove_file(UNIT_FILE, "")?;
        self.remove_file(BIN, "")?;
        self.remove_file(SYSUSERS_FILE, "the user itself stays")?;
        self.remove_file(TMPFILES_FILE, "")?;
        for name in self.toml_files(RUNBOOK_DIR)? {
            self.remove_file(&format!("{RUNBOOK_DIR}/{name}"), "")?;
        }
        self.remove_empty_dir(RUNBOOK_DIR)?;
        self.remove_empty_dir(SHARE_DIR)?;
        for (dir, what) in [
            (CONFIG_DIR, "config"),
            (STATE_DIR, "state: checkpoint and unsent alerts"),
        ] {
            let path = self.path(dir);
            if path.symlink_metadata().is_err() {
                self.report(Outcome::Absent, &path.display(), "");
            } else if purge {
                self.report(Outcome::Remove, &path.display(), what);
                if !self.dry_run {
                    fs::remove_dir_all(&path)
                        .with_context(|| format!("removing {}", path.display()))?;
                }
            } else {
                self.report(
                    Outcome::Keep,
                    &path.display(),
                    &format!("{what}; --purge removes it"),
                );
            }
        }
        if self.on_host && self.changed > 0 {
            self.notes.push(format!(
                "next: sudo systemctl stop xidwatch (if it is still running) && sudo systemctl daemon-reload\n\
                 the user {USER} was left in place (`sudo userdel {USER}` removes it)"
            ));
        }
        Ok(())
    }

    /// Writes `content` to `rel` unless it is already there; fixes the mode either way.
    fn put_file(&mut self, rel: &str, content: &[u8], mode: u32) -> anyhow::Result<()> {
        let path = self.path(rel);
        let existing = match fs::read(&path) {
            Ok(c) => Some(c),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        match existing {
            Some(c) if c == content => {
                if !self.fix_mode(rel, mode)? {
                    self.report(Outcome::Unchanged, &path.display(), "");
                }
                Ok(())
            }
            other => {
                let outcome = if other.is_some() {
                    Outcome::Update
                } else {
                    Outcome::Create
                };
                self.report(outcome, &path.display(), &format!("mode {mode:04o}"));
                if self.dry_run {
                    return Ok(());
                }
                self.create_parents(&path)?;
                write_atomically(&path, content, mode)
                    .with_context(|| format!("writing {}", path.display()))
            }
        }
    }

    /// Sets the mode of an existing file if it differs; returns whether it did (would).
    fn fix_mode(&mut self, rel: &str, mode: u32) -> anyhow::Result<bool> {
        let path = self.path(rel);
        let meta = fs::metadata(&path).with_context(|| format!("reading {}", path.display()))?;
        if meta.permissions().mode() & 0o7777 == mode {
            return Ok(false);
        }
        self.report(
            Outcome::Update,
            &path.display(),
            &format!(
                "mode {:04o} -> {mode:04o}",
                meta.permissions().mode() & 0o7777
            ),
        );
        if !self.dry_run {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                .with_context(|| format!("setting the mode of {}", path.display()))?;
        }
        Ok(true)
    }

    /// A directory of ours, mode 0755 (readable by the daemon whatever the umask).
    fn ensure_dir(&mut self, rel: &str) -> anyhow::Result<()> {
        let path = self.path(rel);
        match fs::metadata(&path) {
            Ok(m) if m.is_dir() => {
                self.fix_mode(rel, 0o755)?;
                Ok(())
            }
            Ok(_) => bail!("{} exists and is not a directory", path.display()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.report(Outcome::Create, &format_args!("{}/", path.display()), "");
                if !self.dry_run {
                    self.create_parents(&path.join("x"))?;
                }
                Ok(())
            }
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Creates the missing parents of `path`, each 0755: a system directory such as
    /// /usr/local/bin, which may be missing in a fresh image root.
    fn create_parents(&self, path: &Path) -> anyhow::Result<()> {
        let parent = path.parent().expect("a path under the root has a parent");
        let missing: Vec<&Path> = parent
            .ancestors()
            .take_while(|p| p.symlink_metadata().is_err())
            .collect();
        for dir in missing.into_iter().rev() {
            fs::create_dir(dir).with_context(|| format!("creating {}", dir.display()))?;
            fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
                .with_context(|| format!("setting the mode of {}", dir.display()))?;
        }
        Ok(())
    }

    fn remove_file(&mut self, rel: &str, detail: &str) -> anyhow::Result<()> {
        let path = self.path(rel);
        if path.symlink_metadata().is_err() {
            // Absent enable link and the like: nothing to say.
            if rel != WANTS_LINK {
                self.report(Outcome::Absent, &path.display(), "");
            }
            return Ok(());
        }
        self.report(Outcome::Remove, &path.display(), detail);
        if !self.dry_run {
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
        self.gone.insert(path);
        Ok(())
    }

    fn remove_empty_dir(&mut self, rel: &str) -> anyhow::Result<()> {
        let path = self.path(rel);
        let Ok(entries) = fs::read_dir(&path) else {
            return Ok(());
        };
        // In a dry run, what was reported as removed is still there: count it as gone.
        let left = entries
            .filter_map(|e| e.ok())
            .filter(|e| !self.gone.contains(&e.path()))
            .count();
        if left == 0 {
            self.report(Outcome::Remove, &format_args!("{}/", path.display()), "");
            if !self.dry_run {
                fs::remove_dir(&path).with_context(|| format!("removing {}", path.display()))?;
            }
            self.gone.insert(path);
        } else {
            self.report(
                Outcome::Keep,
                &format_args!("{}/", path.display()),
                "holds files not installed by xidwatch",
            );
        }
        Ok(())
    }

    /// The names of the `*.toml` files in a directory, sorted; none when it does not exist.
    fn toml_files(&self, rel: &str) -> anyhow::Result<Vec<String>> {
        let path = self.path(rel);
        let entries = match fs::read_dir(&path) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.with_context(|| format!("reading {}", path.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".toml") && entry.file_type().is_ok_and(|t| t.is_file()) {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    fn user_exists(&self, name: &str) -> anyhow::Result<bool> {
        Ok(self.db_field(&self.path("etc/passwd"), name, 0)?.is_some())
    }

    fn group_id(&self, name: &str) -> anyhow::Result<Option<u32>> {
        Ok(self
            .db_field(&self.path("etc/group"), name, 2)?
            .and_then(|f| f.parse().ok()))
    }

    /// Field `index` of the `name:` line of a passwd/group style file (a missing file has none).
    fn db_field(&self, file: &Path, name: &str, index: usize) -> anyhow::Result<Option<String>> {
        let text = match fs::read_to_string(file) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
        };
        Ok(text
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f.first() == Some(&name))
            .and_then(|f| f.get(index).map(|s| s.to_string())))
    }
}

/// Writes a sibling temporary file and renames it over `path`: a reader (or a running binary,
/// which cannot be written to in place) sees the old file or the new one, never half of one.
fn write_atomically(path: &Path, content: &[u8], mode: u32) -> io::Result<()> {
    crate::state::write_atomic(path, content, mode)
}

/// Looks a program up in $PATH and the system directories (sudo may have trimmed $PATH).
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_has_exactly_one_execstart_naming_the_packaged_binary() {
        let execs: Vec<_> = UNIT
            .lines()
            .filter(|l| l.starts_with("ExecStart="))
            .collect();
        assert_eq!(
            execs,
            ["ExecStart=/usr/bin/xidwatch run --config /etc/xidwatch/xidwatch.toml"]
        );
    }

    #[test]
    fn execstart_is_rewritten_and_nothing_else_changes() {
        let unit = unit_with_exec("/usr/local/bin/xidwatch");
        assert!(unit
            .lines()
            .any(|l| l
                == "ExecStart=/usr/local/bin/xidwatch run --config /etc/xidwatch/xidwatch.toml"));
        assert_eq!(unit.lines().count(), UNIT.lines().count());
        let differing = unit
            .lines()
            .zip(UNIT.lines())
            .filter(|(a, b)| a != b)
            .count();
        assert_eq!(differing, 1);
        assert_eq!(unit_with_exec(TEMPLATE_EXEC), UNIT);
    }
}
