//! Per-Xid overrides from the config: a different severity, ignore it, or run another runbook.
//!
//! ```toml
//! [xid.13]
//! severity = "info"        # this site's jobs trip Xid 13 all day
//! [xid.45]
//! ignore = true            # an echo of the Xid before it
//! [xid.79]
//! runbook = "fallen-off-bus-deep"
//! ```
//! Applied by the incident stage, after classification, so `scan` shows the catalog's verdict
//! unless it is given the same config.

use crate::model::ConfigIssue;
use std::collections::BTreeMap;

use serde::Deserialize;

use crate::model::{Finding, FindingKind, Severity};

/// What the operator wants for one Xid.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XidOverride {
    /// Replaces the catalog's severity.
    pub severity: Option<Severity>,
    /// Drop findings of this Xid entirely (they are still counted).
    #[serde(default)]
    pub ignore: bool,
    /// Run this runbook instead of the one the matching rules pick.
    pub runbook: Option<String>,
    /// Open an incident only once this many occurrences fall within `window_secs` (e.g. alert on
    /// Xid 13 only when it repeats). Default 1: the first occurrence opens it.
    pub min_count: Option<u64>,
    /// The correlation window for this Xid, replacing `[incidents] window_secs`.
    pub window_secs: Option<u64>,
}

/// All overrides, keyed by Xid.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XidOverrides(BTreeMap<u32, XidOverride>);

/// What to do with a finding after the overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Keep { runbook: Option<String> },
    Ignore,
}

impl XidOverrides {
    /// Builds the table from the config's `[xid.N]` tables; keys must be Xid numbers.
    pub fn from_table(table: BTreeMap<String, XidOverride>) -> Result<Self, ConfigIssue> {
        let mut map = BTreeMap::new();
        for (key, value) in table {
            let code: u32 = key.parse().map_err(|_| {
                ConfigIssue::new(
                    format!("xid.{key}"),
                    "expected an Xid number such as [xid.79]",
                )
            })?;
            if value.min_count == Some(0) {
                return Err(ConfigIssue::new(
                    format!("xid.{key}.min_count"),
                    "expected at least 1",
                ));
            }
            if let Some(w) = value.window_secs {
                if w == 0 || w > crate::model::MAX_WINDOW_SECS {
                    return Err(ConfigIssue::new(
                        format!("xid.{key}.window_secs"),
                        format!(
                            "expected seconds from 1 to {} (30 days)",
                            crate::model::MAX_WINDOW_SECS
                        ),
                    ));
                }
            }
            map.insert(code, value);
        }
        Ok(XidOverrides(map))
    }

    /// Every override, by Xid.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &XidOverride)> {
        self.0.iter().map(|(k, v)| (*k, v))
    }

    pub fn get(&self, xid: u32) -> Option<&XidOverride> {
        self.0.get(&xid)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Applies the override for the finding's Xid (GPU Xids only, not SXids).
    pub fn apply(&self, f: &mut Finding) -> Verdict {
        let o = match (f.kind, f.xid) {
            (FindingKind::Xid, Some(x)) => self.0.get(&x),
            _ => None,
        };
        match o {
            Some(o) if o.ignore => Verdict::Ignore,
            Some(o) => {
                if let Some(s) = o.severity {
                    f.severity = s;
                }
                Verdict::Keep {
                    runbook: o.runbook.clone(),
                }
            }
            None => Verdict::Keep { runbook: None },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Category;

    #[test]
    fn applies_severity_ignore_and_runbook() {
        let t: BTreeMap<String, XidOverride> = toml::from_str(
            "[13]\nseverity = \"info\"\n[45]\nignore = true\n[79]\nrunbook = \"deep\"\n",
        )
        .unwrap();
        let o = XidOverrides::from_table(t).unwrap();
        let mut f = Finding::new(
            FindingKind::Xid,
            Severity::Warning,
            Category::Application,
            "x",
        );
        f.xid = Some(13);
        assert_eq!(o.apply(&mut f), Verdict::Keep { runbook: None });
        assert_eq!(f.severity, Severity::Info);
        f.xid = Some(45);
        assert_eq!(o.apply(&mut f), Verdict::Ignore);
        f.xid = Some(79);
        assert_eq!(
            o.apply(&mut f),
            Verdict::Keep {
                runbook: Some("deep".into())
            }
        );
        f.kind = FindingKind::Sxid;
        f.xid = Some(45);
        assert_eq!(o.apply(&mut f), Verdict::Keep { runbook: None });
    }

    #[test]
    fn rejects_bad_keys_and_values() {
        let bad: BTreeMap<String, XidOverride> = toml::from_str("[abc]\nignore = true\n").unwrap();
        assert_eq!(XidOverrides::from_table(bad).unwrap_err().key, "xid.abc");
        assert!(
            toml::from_str::<BTreeMap<String, XidOverride>>("[13]\nsevrity = \"info\"\n").is_err()
        );
        assert!(
            toml::from_str::<BTreeMap<String, XidOverride>>("[13]\nseverity = \"loud\"\n").is_err()
        );
    }
}
