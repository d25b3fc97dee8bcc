//! The `[runbooks]` section of the configuration file, for whoever builds the daemon's settings.

use crate::model::ConfigIssue;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::exec::{RunLimits, RunbookEnv};
use super::safety::Catalog;

/// `[runbooks]`: every key optional.
///
/// ```toml
/// [runbooks]
/// dirs = ["/usr/share/xidwatch/runbooks", "/etc/xidwatch/runbooks"]  # later ones override by name
/// allow = [["ibstat"], ["ibstatus", "{int:1-64}"]]  # whole commands added to the catalog
/// max_parallel_runbooks = 2
/// ```
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunbooksConfig {
    /// Runbook directories in order; a later directory's runbook replaces an earlier one of the
    /// same name. Default: the shipped runbooks only.
    pub dirs: Option<Vec<PathBuf>>,
    /// Commands added to the shipped catalog: each a whole argv pattern in the catalog's syntax
    /// (literal tokens and slots), under the same argument rules and the same confinement as
    /// every step. Never a bare program name.
    pub allow: Option<Vec<toml::Value>>,
    /// Gone: a program name allowed any arguments. Kept only to say what replaced it.
    pub allowed_programs: Option<toml::Value>,
    /// Absolute directories searched for programs (for drills and tests). Default:
    /// /usr/local/sbin, /usr/local/bin, /usr/sbin, /usr/bin, /sbin, /bin.
    pub search_path: Option<Vec<PathBuf>>,
    /// Ceiling on any runbook's `budget_secs`. Default 120.
    pub max_budget_secs: Option<f64>,
    /// Ceiling on any step's timeout. Default 60.
    pub max_step_timeout_secs: Option<f64>,
    /// Ceiling on any step's kept output. Default 262144.
    pub max_output_bytes: Option<u64>,
    /// Ceiling on any runbook's `concurrency`. Default 8.
    pub max_parallel_steps: Option<u64>,
    /// How many runbooks the daemon runs at the same time. Default 2.
    pub max_parallel_runbooks: Option<u64>,
    /// Root of sysfs for `read` steps. Default `/sys` (tests and drills use a fixture tree).
    pub sysfs_root: Option<PathBuf>,
    /// Root of procfs for `read` steps. Default `/proc`.
    pub procfs_root: Option<PathBuf>,
    /// Show a faulting process's whole command line (still through the secrets redactor).
    /// Default false: the program, an interpreter's script and option names only, because
    /// arguments carry the job's own secrets (`--api-key=...`), which no redactor knows.
    pub show_arguments: Option<bool>,
}

impl RunbooksConfig {
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.dirs.clone().unwrap_or_else(super::default_dirs)
    }

    /// What runbooks may run: the shipped catalog and `allow`, from the `search_path`
    /// directories. An error names the key.
    pub fn catalog(&self) -> Result<Catalog, ConfigIssue> {
        if self.allowed_programs.is_some() {
            return Err(ConfigIssue::new(
                "runbooks.allowed_programs",
                "no longer exists: a program name allowed any arguments. \
                 List whole commands in `allow`, e.g. allow = [[\"ibstat\"]] (see docs/runbooks.md)",
            ));
        }
        if let Some(d) = self.search_path.iter().flatten().find(|d| !d.is_absolute()) {
            return Err(ConfigIssue::new(
                "runbooks.search_path",
                format!(
                    "{:?} is relative; give absolute directories",
                    d.display().to_string()
                ),
            ));
        }
        let mut extra = Vec::new();
        for (i, v) in self.allow.iter().flatten().enumerate() {
            let words = v.as_array().and_then(|a| {
                a.iter()
                    .map(|w| w.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
            });
            match words {
                Some(w) => extra.push(w),
                None => {
                    return Err(ConfigIssue::new(
                        format!("runbooks.allow[{i}]"),
                        "give a whole command as a list of strings, e.g. [\"ibstat\"]; never a bare program name",
                    ))
                }
            }
        }
        Catalog::with_additions(&extra)
    }

    pub fn env(&self) -> RunbookEnv {
        let mut env = RunbookEnv::system();
        if let Some(p) = &self.search_path {
            env.search_path = p.clone();
        }
        if let Some(p) = &self.sysfs_root {
            env.sysfs_root = p.clone();
        }
        if let Some(p) = &self.procfs_root {
            env.procfs_root = p.clone();
        }
        env.show_arguments = self.show_arguments.unwrap_or(false);
        env
    }

    /// The ceilings, or which key is out of range.
    pub fn limits(&self) -> Result<RunLimits, ConfigIssue> {
        let d = RunLimits::default();
        let secs = |v: Option<f64>, key: &str, def: Duration| match v {
            None => Ok(def),
            Some(s) if s.is_finite() && s > 0.0 && s <= 3600.0 => Ok(Duration::from_secs_f64(s)),
            Some(_) => Err(ConfigIssue::new(
                format!("runbooks.{key}"),
                "give seconds above 0 and at most 3600",
            )),
        };
        let count = |v: Option<u64>, key: &str, def: usize, max: u64| match v {
            None => Ok(def),
            Some(n) if n >= 1 && n <= max => Ok(n as usize),
            Some(_) => Err(ConfigIssue::new(
                format!("runbooks.{key}"),
                format!("give 1 to {max}"),
            )),
        };
        if let Some(n) = self.max_parallel_runbooks {
            if !(1..=64).contains(&n) {
                return Err(ConfigIssue::new(
                    "runbooks.max_parallel_runbooks",
                    "give 1 to 64",
                ));
            }
        }
        Ok(RunLimits {
            max_budget: secs(self.max_budget_secs, "max_budget_secs", d.max_budget)?,
            max_step_timeout: secs(
                self.max_step_timeout_secs,
                "max_step_timeout_secs",
                d.max_step_timeout,
            )?,
            max_output_bytes: count(
                self.max_output_bytes,
                "max_output_bytes",
                d.max_output_bytes,
                16 * 1024 * 1024,
            )?,
            max_concurrency: count(
                self.max_parallel_steps,
                "max_parallel_steps",
                d.max_concurrency,
                64,
            )?,
        })
    }

    pub fn max_parallel_runbooks(&self) -> usize {
        self.max_parallel_runbooks
            .map_or(2, |n| n.clamp(1, 64) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects_unknown_keys() {
        let c: RunbooksConfig = toml::from_str(
            "dirs = [\"/a\", \"/b\"]\nallow = [[\"ibstat\"]]\nmax_budget_secs = 30\n",
        )
        .unwrap();
        assert_eq!(c.dirs(), vec![PathBuf::from("/a"), PathBuf::from("/b")]);
        let n = c.catalog().unwrap().patterns().count();
        assert_eq!(n, crate::runbook::Catalog::default().patterns().count() + 1);
        for bad in [
            "allow = [\"ibstat\"]",
            "allow = [[\"cat\", \"/etc/shadow\"]]",
            "allowed_programs = [\"lsmod\"]",
            "search_path = [\".\"]",
            "search_path = [\"relbin\"]",
        ] {
            let c: RunbooksConfig = toml::from_str(bad).unwrap();
            assert!(c.catalog().is_err(), "{bad}");
        }
        assert_eq!(c.limits().unwrap().max_budget, Duration::from_secs(30));
        assert!(toml::from_str::<RunbooksConfig>("dir = []").is_err());
        let bad: RunbooksConfig = toml::from_str("max_parallel_steps = 0").unwrap();
        assert_eq!(bad.limits().unwrap_err().key, "runbooks.max_parallel_steps");
    }
}
