//! Which runbook serves which incident (pure).
//!
//! A runbook lists `[[match]]` tables; it serves a subject when any one of them holds, and a table
//! holds when every key it sets holds. When several runbooks match, the winner is decided by:
//!
//! 1. a runbook named by the configuration for this incident (`runbook_override`), if it exists;
//! 2. the most specific match: an Xid listed by its own number beats an Xid in a range (a
//!    narrower range beats a wider one), which beats a match on the finding kind, which beats a
//!    match on category or severity alone; at the same level, a table with more keys wins;
//! 3. the higher `priority`;
//! 4. the name, alphabetically (so the choice never depends on file order);
//!
//! and when nothing matches, the runbook with `fallback = true`.

use std::cmp::Ordering;
use std::fmt;

use crate::model::{Category, FindingKind, Severity};

use super::subject::Subject;

/// An Xid (or SXid) in a match list: one number or an inclusive range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumberSpec {
    One(u32),
    Range(u32, u32),
}

impl NumberSpec {
    fn matches(self, n: u32) -> bool {
        match self {
            NumberSpec::One(x) => x == n,
            NumberSpec::Range(lo, hi) => (lo..=hi).contains(&n),
        }
    }
}

impl fmt::Display for NumberSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NumberSpec::One(x) => write!(f, "{x}"),
            NumberSpec::Range(lo, hi) => write!(f, "{lo}-{hi}"),
        }
    }
}

/// One `[[match]]` table: every key that is set must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MatchRule {
    pub kinds: Vec<FindingKind>,
    /// Xids; only [`FindingKind::Xid`] subjects can match.
    pub xids: Vec<NumberSpec>,
    /// SXids; only [`FindingKind::Sxid`] subjects can match.
    pub sxids: Vec<NumberSpec>,
    pub categories: Vec<Category>,
    pub min_severity: Option<Severity>,
}

/// How specifically a runbook matched; greater is more specific.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Specificity {
    /// 4: the number itself, 3: a range, 2: the kind, 1: category or severity only.
    level: u8,
    /// For ranges: narrower is more specific.
    narrowness: u32,
    /// How many other keys the table set.
    extra: u8,
}

impl Specificity {
    /// Words for people: why this runbook was chosen.
    pub fn describe(&self) -> &'static str {
        match self.level {
            4 => "its number is listed",
            3 => "its number is in a listed range",
            2 => "its kind is listed",
            _ => "its category or severity is listed",
        }
    }
}

impl MatchRule {
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
            && self.xids.is_empty()
            && self.sxids.is_empty()
            && self.categories.is_empty()
            && self.min_severity.is_none()
    }

    /// Whether the rule holds for the subject, and how specifically.
    pub fn matches(&self, s: &Subject) -> Option<Specificity> {
        if self.is_empty() {
            return None;
        }
        if !self.kinds.is_empty() && !self.kinds.contains(&s.kind) {
            return None;
        }
        if !self.categories.is_empty() && !self.categories.contains(&s.category) {
            return None;
        }
        if self.min_severity.is_some_and(|min| s.severity < min) {
            return None;
        }
        let mut number = None;
        for (list, kind) in [
            (&self.xids, FindingKind::Xid),
            (&self.sxids, FindingKind::Sxid),
        ] {
            if list.is_empty() {
                continue;
            }
            let n = s.xid.filter(|_| s.kind == kind)?;
            let best = list
                .iter()
                .filter(|spec| spec.matches(n))
                .map(|spec| match *spec {
                    NumberSpec::One(_) => (4, u32::MAX),
                    NumberSpec::Range(lo, hi) => (3, u32::MAX - (hi - lo)),
                })
                .max()?;
            number = Some(best);
        }
        let extra = u8::from(!self.categories.is_empty())
            + u8::from(self.min_severity.is_some())
            + u8::from(number.is_some() && !self.kinds.is_empty());
        let (level, narrowness) = match number {
            Some(b) => b,
            None if !self.kinds.is_empty() => (2, 0),
            None => (1, 0),
        };
        Some(Specificity {
            level,
            narrowness,
            extra,
        })
    }
}

impl fmt::Display for MatchRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list<T: fmt::Display>(v: &[T]) -> String {
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        }
        let mut parts = Vec::new();
        if !self.xids.is_empty() {
            parts.push(format!("xid {}", list(&self.xids)));
        }
        if !self.sxids.is_empty() {
            parts.push(format!("sxid {}", list(&self.sxids)));
        }
        if !self.kinds.is_empty() {
            parts.push(format!("kind {}", list(&self.kinds)));
        }
        if !self.categories.is_empty() {
            parts.push(format!("category {}", list(&self.categories)));
        }
        if let Some(s) = self.min_severity {
            parts.push(format!("severity >= {s}"));
        }
        f.write_str(&parts.join(" and "))
    }
}

/// The best of a runbook's rules for this subject.
pub fn best_match(rules: &[MatchRule], s: &Subject) -> Option<Specificity> {
    rules.iter().filter_map(|r| r.matches(s)).max()
}

/// Orders two matching candidates `(specificity, priority, name)`: `Greater` means `a` wins.
pub fn compare(a: (Specificity, i32, &str), b: (Specificity, i32, &str)) -> Ordering {
    a.0.cmp(&b.0)
        .then(a.1.cmp(&b.1))
        // Alphabetically first wins.
        .then_with(|| b.2.cmp(a.2))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xid(n: u32) -> Subject {
        let mut s = Subject::manual(None, Some(n), None);
        s.category = Category::Memory;
        s.severity = Severity::Critical;
        s
    }

    #[test]
    fn xids_only_match_xid_subjects() {
        let r = MatchRule {
            xids: vec![NumberSpec::One(79)],
            ..Default::default()
        };
        assert!(r.matches(&xid(79)).is_some());
        assert!(r.matches(&xid(80)).is_none());
        let mut sxid = xid(79);
        sxid.kind = FindingKind::Sxid;
        assert!(r.matches(&sxid).is_none());
        let r = MatchRule {
            sxids: vec![NumberSpec::Range(20000, 29999)],
            ..Default::default()
        };
        let mut sxid = xid(20034);
        sxid.kind = FindingKind::Sxid;
        assert!(r.matches(&sxid).is_some());
        assert!(r.matches(&xid(20034)).is_none());
    }

    #[test]
    fn specificity_orders_number_range_kind_category() {
        let one = MatchRule {
            xids: vec![NumberSpec::One(145)],
            ..Default::default()
        };
        let narrow = MatchRule {
            xids: vec![NumberSpec::Range(144, 150)],
            ..Default::default()
        };
        let wide = MatchRule {
            xids: vec![NumberSpec::Range(1, 200)],
            ..Default::default()
        };
        let kind = MatchRule {
            kinds: vec![FindingKind::Xid],
            ..Default::default()
        };
        let cat = MatchRule {
            categories: vec![Category::Memory],
            ..Default::default()
        };
        let s = xid(145);
        let m = |r: &MatchRule| r.matches(&s).unwrap();
        assert!(m(&one) > m(&narrow));
        assert!(m(&narrow) > m(&wide));
        assert!(m(&wide) > m(&kind));
        assert!(m(&kind) > m(&cat));
        let cat_sev = MatchRule {
            categories: vec![Category::Memory],
            min_severity: Some(Severity::Warning),
            ..Default::default()
        };
        assert!(m(&cat_sev) > m(&cat));
    }

    #[test]
    fn every_key_must_hold() {
        let r = MatchRule {
            categories: vec![Category::Memory],
            min_severity: Some(Severity::Critical),
            ..Default::default()
        };
        assert!(r.matches(&xid(48)).is_some());
        let mut s = xid(48);
        s.severity = Severity::Warning;
        assert!(r.matches(&s).is_none());
        s.severity = Severity::Critical;
        s.category = Category::Pcie;
        assert!(r.matches(&s).is_none());
        assert!(MatchRule::default().matches(&xid(48)).is_none());
    }

    #[test]
    fn ties_go_to_priority_then_name() {
        let sp = MatchRule {
            kinds: vec![FindingKind::Xid],
            ..Default::default()
        }
        .matches(&xid(1))
        .unwrap();
        assert_eq!(compare((sp, 1, "b"), (sp, 0, "a")), Ordering::Greater);
        assert_eq!(compare((sp, 0, "a"), (sp, 0, "b")), Ordering::Greater);
    }
}
