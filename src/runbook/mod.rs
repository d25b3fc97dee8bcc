//! Runbooks: TOML-defined, read-only checks that gather the evidence an on-call needs when a GPU
//! faults, run the moment an incident opens.
//!
//! - `format`: the file format as serde reads it (unknown keys rejected).
//! - `load`: files to checked [`Runbook`]s; every step passes `safety` or the runbook is refused.
//! - `safety`: the catalog of allowed commands and readable paths (pure); a step that is not
//!   exactly one of them is refused. Nothing there reboots, resets, unloads or reconfigures.
//! - `matcher`: which runbook serves which incident (pure).
//! - `template`: placeholders, filled only from checked values (pure).
//! - `exec`: running steps: argv only, matched again as filled in, cleared environment, own
//!   process group killed whole on timeout, bounded output, secrets cut out (`redact`).
//! - `sandbox`: the checked file is what runs (from a directory only root can change), as an
//!   unprivileged user, with no new privileges, no capabilities and resource limits.
//! - `confine`: the kernel's confinement around every step (Landlock and seccomp): whatever the
//!   step is, it cannot write, connect, signal outside itself or read secrets.
//! - `excerpt`, `sysfs`, `interpret`: the kernel log excerpt and notes on what output means.
//! - `render`: text for `runbook list`, `runbook show`, `runbook run` and `check`.

mod config;
pub mod confine;
mod excerpt;
mod exec;
mod format;
mod interpret;
mod load;
mod matcher;
mod nvml;
pub mod process;
pub mod redact;
mod render;
pub mod safety;
pub mod sandbox;
mod subject;
pub mod sysfs;
mod template;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::model::Evidence;

pub use config::RunbooksConfig;
pub use excerpt::{KmsgSpec, Window};
pub use exec::{RunLimits, RunbookEnv, CHILD_PATH};
pub use matcher::{MatchRule, NumberSpec, Specificity};
pub use nvml::{NvmlError, NvmlProbe, NvmlQuery};
pub use redact::Redactor;
pub use render::{render_evidence, render_list, render_load_errors, render_show};
pub use safety::{Catalog, Pattern, Refusal, Rule};
pub use subject::{GpuUuid, LogLine, LogRing, Subject};
pub use template::{Placeholder, Template, Values};

/// Where an installed xidwatch keeps its shipped runbooks.
pub const INSTALLED_DIR: &str = "/usr/share/xidwatch/runbooks";
/// The shipped runbooks in the source tree (for development and tests; never a default: a
/// binary copied to a fleet has no source tree, and must not depend on the build machine's).
pub const SOURCE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/runbooks");
/// Stands for the runbooks embedded in the binary wherever a runbook directory may be named; it
/// is not a path, and `check`, `runbook list` and the load errors print it as it is.
pub const EMBEDDED_DIR: &str = "(built into the binary)";

mod embedded {
    // `RUNBOOKS: &[(file name, contents)]`, every runbooks/*.toml, written by build.rs.
    include!(concat!(env!("OUT_DIR"), "/runbooks.rs"));
}
/// The shipped runbooks as embedded at build time, by file name: what `install` writes, and what
/// runs when neither a config nor an installed copy names a directory.
pub use embedded::RUNBOOKS as EMBEDDED;

/// The shipped runbooks: the installed copy when there is one, else the copies embedded in the
/// binary, so that a binary alone runs with the runbooks it was built with.
pub fn shipped_dir() -> PathBuf {
    if Path::new(INSTALLED_DIR).is_dir() {
        PathBuf::from(INSTALLED_DIR)
    } else {
        PathBuf::from(EMBEDDED_DIR)
    }
}

/// The runbook directories when the configuration names none.
pub fn default_dirs() -> Vec<PathBuf> {
    vec![shipped_dir()]
}

/// Budget and bounds of one runbook, after defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock budget for the whole runbook; steps not started by then are skipped.
    pub budget: Duration,
    /// Timeout of a step that sets none.
    pub step_timeout: Duration,
    /// Output kept per step, when the step sets none.
    pub max_output_bytes: usize,
    /// Steps run at the same time.
    pub concurrency: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            budget: Duration::from_secs(60),
            step_timeout: Duration::from_secs(10),
            max_output_bytes: 16 * 1024,
            concurrency: 4,
        }
    }
}

/// What a step does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Run a program: argv, never a shell string.
    Run(Vec<Template>),
    /// Read files (or list directories) under /sys or /proc.
    Read(Vec<Template>),
    /// Excerpt the kernel log around the incident.
    Kmsg(KmsgSpec),
    /// Ask NVML, when it is available.
    Nvml(NvmlQuery),
}

impl Action {
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Run(_) => "run",
            Action::Read(_) => "read",
            Action::Kmsg(_) => "kmsg",
            Action::Nvml(_) => "nvml",
        }
    }

    /// The placeholders the step needs, in order of first use.
    pub fn placeholders(&self) -> Vec<Placeholder> {
        let mut out = Vec::new();
        let mut add = |p| {
            if !out.contains(&p) {
                out.push(p)
            }
        };
        match self {
            Action::Run(ts) | Action::Read(ts) => {
                ts.iter().flat_map(|t| t.placeholders()).for_each(&mut add)
            }
            Action::Nvml(_) => add(Placeholder::Pci),
            Action::Kmsg(_) => {}
        }
        out
    }

    /// The step as written, for people: the argv, the paths, the window.
    pub fn describe(&self) -> Vec<String> {
        match self {
            Action::Run(ts) | Action::Read(ts) => ts.iter().map(|t| t.to_string()).collect(),
            Action::Kmsg(spec) => vec![spec.describe()],
            Action::Nvml(q) => vec![q.to_string(), Placeholder::Pci.to_string()],
        }
    }
}

/// One checked step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub name: String,
    pub action: Action,
    /// This step's timeout, when it sets one.
    pub timeout: Option<Duration>,
    /// This step's output cap, when it sets one.
    pub max_output_bytes: Option<usize>,
    /// The catalog pattern a `run` step matched at load; its argv must match it again, as
    /// filled in, before it runs.
    pub pattern: Option<std::sync::Arc<Pattern>>,
}

/// A loaded runbook. Only the loader builds one, so every step has passed the safety rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runbook {
    name: String,
    path: PathBuf,
    title: String,
    fallback: bool,
    priority: i32,
    rules: Vec<MatchRule>,
    meaning: String,
    next_steps: String,
    limits: Limits,
    steps: Vec<Step>,
    overrides: Vec<PathBuf>,
}

impl Runbook {
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn title(&self) -> &str {
        &self.title
    }
    pub fn is_fallback(&self) -> bool {
        self.fallback
    }
    pub fn priority(&self) -> i32 {
        self.priority
    }
    pub fn rules(&self) -> &[MatchRule] {
        &self.rules
    }
    pub fn meaning(&self) -> &str {
        &self.meaning
    }
    pub fn next_steps(&self) -> &str {
        &self.next_steps
    }
    pub fn limits(&self) -> Limits {
        self.limits
    }
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }
    /// Files of the same name in earlier directories that this one replaced.
    pub fn overrides(&self) -> &[PathBuf] {
        &self.overrides
    }

    /// Parses and checks one runbook from text; `path` names it in errors and its stem is the
    /// runbook's name.
    pub fn from_toml(
        path: &Path,
        text: &str,
        catalog: &Catalog,
    ) -> Result<Runbook, Vec<LoadError>> {
        load::parse_runbook(path, text, catalog)
    }

    /// Whether (and how specifically) this runbook's `[[match]]` tables hold for the subject.
    pub fn matches(&self, subject: &Subject) -> Option<Specificity> {
        matcher::best_match(&self.rules, subject)
    }

    /// Runs every step for the subject and returns what they found. Never fails: a step that
    /// cannot run is recorded as missing, skipped, failed or timed out. Needs a Tokio runtime
    /// with I/O and time enabled (`enable_all`), as child processes are awaited through it.
    pub async fn run(&self, subject: &Subject, env: &RunbookEnv, limits: &RunLimits) -> Evidence {
        exec::run_runbook(self, subject, env, limits).await
    }
}

/// Why one runbook was chosen.
#[derive(Debug, Clone)]
pub struct Selection<'a> {
    pub runbook: &'a Runbook,
    pub reason: String,
}

/// All runbooks from the configured directories, by name.
#[derive(Debug, Clone, Default)]
pub struct RunbookSet {
    runbooks: BTreeMap<String, Runbook>,
}

impl RunbookSet {
    /// Loads every `*.toml` in `dirs`, in order; a later directory's runbook replaces an earlier
    /// one of the same name. All problems are reported, each naming its file (and step).
    pub fn load(dirs: &[PathBuf], catalog: &Catalog) -> Result<RunbookSet, Vec<LoadError>> {
        match load::load_dirs(dirs, catalog) {
            (set, errors) if errors.is_empty() => Ok(set),
            (_, errors) => Err(errors),
        }
    }

    /// Like [`load`](Self::load), but keeps what loaded: for a daemon that must go on watching
    /// (and report the problems) when one file is bad. A file with any problem, refused steps
    /// included, contributes nothing; it does not hide a runbook of the same name in an earlier
    /// directory either, since it never loaded.
    pub fn load_partial(dirs: &[PathBuf], catalog: &Catalog) -> (RunbookSet, Vec<LoadError>) {
        load::load_dirs(dirs, catalog)
    }

    /// The shipped runbooks with the shipped catalog.
    pub fn shipped() -> Result<RunbookSet, Vec<LoadError>> {
        RunbookSet::load(&default_dirs(), &Catalog::default())
    }

    /// A set from runbooks built elsewhere (e.g. [`Runbook::from_toml`]); later ones replace
    /// earlier ones of the same name. Fails when two are fallbacks.
    pub fn from_runbooks(runbooks: Vec<Runbook>) -> Result<RunbookSet, Vec<LoadError>> {
        match load::assemble(runbooks, Vec::new()) {
            (set, errors) if errors.is_empty() => Ok(set),
            (_, errors) => Err(errors),
        }
    }

    pub fn get(&self, name: &str) -> Option<&Runbook> {
        self.runbooks.get(name)
    }

    /// By name.
    pub fn iter(&self) -> impl Iterator<Item = &Runbook> {
        self.runbooks.values()
    }

    pub fn len(&self) -> usize {
        self.runbooks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.runbooks.is_empty()
    }

    pub fn fallback(&self) -> Option<&Runbook> {
        self.iter().find(|r| r.fallback)
    }

    /// The runbook for this subject: the one the configuration names for it if it exists, else
    /// the most specific match (Xid by number, by range, kind, category or severity), then the
    /// higher `priority`, then the first name; else the fallback.
    pub fn select(&self, subject: &Subject) -> Option<&Runbook> {
        self.select_explained(subject).map(|s| s.runbook)
    }

    /// The runbook for this subject and why it won.
    pub fn select_explained(&self, subject: &Subject) -> Option<Selection<'_>> {
        let mut missing_override = String::new();
        if let Some(name) = &subject.runbook_override {
            match self.get(name) {
                Some(rb) => {
                    return Some(Selection {
                        runbook: rb,
                        reason: "named for this incident by the configuration".into(),
                    })
                }
                None => {
                    missing_override = format!(" (the configured runbook {name:?} does not exist)")
                }
            }
        }
        let best = self
            .iter()
            .filter_map(|r| r.matches(subject).map(|sp| (r, sp)))
            .max_by(|(a, sa), (b, sb)| {
                matcher::compare((*sa, a.priority, &a.name), (*sb, b.priority, &b.name))
            });
        match best {
            Some((rb, sp)) => Some(Selection {
                runbook: rb,
                reason: format!("matched: {}{missing_override}", sp.describe()),
            }),
            None => self.fallback().map(|rb| Selection {
                runbook: rb,
                reason: format!("fallback: no other runbook matched{missing_override}"),
            }),
        }
    }

    /// Selects and runs the runbook for this subject; `None` when no runbook serves it.
    pub async fn run_for(
        &self,
        subject: &Subject,
        env: &RunbookEnv,
        limits: &RunLimits,
    ) -> Option<Evidence> {
        let rb = self.select(subject)?;
        Some(rb.run(subject, env, limits).await)
    }

    /// Runs every subject's runbook at once, each under one of `permits` (so the bound on
    /// runbooks running holds), and gives their evidence in the subjects' order. With several
    /// subjects (the GPUs of one host page), each evidence says whose GPU it is. `done` sees
    /// each run as it ends, under its runbook's own name (for the runbook counters).
    pub async fn run_each(
        &self,
        subjects: &[Subject],
        env: &RunbookEnv,
        limits: &RunLimits,
        permits: &std::sync::Arc<tokio::sync::Semaphore>,
        done: impl Fn(&Evidence),
    ) -> Vec<Evidence> {
        let grouped = subjects.len() > 1;
        let done = &done;
        let runs = futures_util::future::join_all(subjects.iter().map(|subject| async move {
            let _permit = permits.clone().acquire_owned().await.ok()?;
            let mut ev = self.run_for(subject, env, limits).await?;
            done(&ev);
            if let (true, Some(pci)) = (grouped, subject.pci) {
                ev.runbook = format!("{} ({pci})", ev.runbook);
            }
            Some(ev)
        }));
        runs.await.into_iter().flatten().collect()
    }
}

/// Which step of a runbook a load error is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRef {
    /// 1-based position in the file.
    pub index: usize,
    pub name: Option<String>,
}

/// What kind of load problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadErrorKind {
    /// The file or directory could not be read.
    Io,
    /// Not valid TOML, or keys the format does not know.
    Syntax,
    /// Valid TOML with a value that makes no sense.
    Invalid,
    /// A step is not a command of the catalog, or reads outside the read roots.
    Refused(Rule),
    /// Two runbooks disagree (two fallbacks).
    Conflict,
}

/// A problem loading one runbook file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    pub path: PathBuf,
    pub step: Option<StepRef>,
    /// 1-based line in the file, when known.
    pub line: Option<usize>,
    pub kind: LoadErrorKind,
    pub message: String,
}

impl LoadError {
    pub fn is_refusal(&self) -> bool {
        matches!(self.kind, LoadErrorKind::Refused(_))
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(s) = &self.step {
            write!(f, ": step {}", s.index)?;
            if let Some(n) = &s.name {
                write!(f, " {n:?}")?;
            }
        }
        if let Some(l) = self.line {
            write!(f, " (line {l})")?;
        }
        match &self.kind {
            LoadErrorKind::Refused(rule) => write!(f, ": refused [{rule}]: {}", self.message),
            _ => write!(f, ": {}", self.message),
        }
    }
}

impl std::error::Error for LoadError {}
