//! The runbook file format, as serde reads it. Unknown keys are rejected; every value is checked
//! and turned into the typed [`Runbook`](super::Runbook) by the loader.

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use std::fmt;
use toml::Spanned;

use super::matcher::NumberSpec;

/// One `runbooks/*.toml` file. The runbook's name is the file name without `.toml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunbookFile {
    /// One line for people: "GPU fallen off the bus".
    pub title: String,
    /// Runs for incidents no other runbook matches (at most one per set).
    #[serde(default)]
    pub fallback: bool,
    /// Breaks ties between equally specific runbooks; higher wins.
    #[serde(default)]
    pub priority: i32,
    /// Any one of these must hold (each is an AND of its keys).
    #[serde(default, rename = "match")]
    pub matches: Vec<Spanned<MatchFile>>,
    pub guide: GuideFile,
    #[serde(default)]
    pub limits: LimitsFile,
    #[serde(default, rename = "step")]
    pub steps: Vec<Spanned<StepFile>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MatchFile {
    pub kinds: Option<Vec<String>>,
    pub xids: Option<Vec<NumberSpec>>,
    pub sxids: Option<Vec<NumberSpec>>,
    pub categories: Option<Vec<String>>,
    pub min_severity: Option<String>,
}

/// The human part, rendered into the alert.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GuideFile {
    pub meaning: String,
    pub next_steps: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LimitsFile {
    pub budget_secs: Option<f64>,
    pub step_timeout_secs: Option<f64>,
    pub max_output_bytes: Option<u64>,
    pub concurrency: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StepFile {
    pub name: Option<String>,
    pub run: Option<Vec<String>>,
    pub read: Option<OneOrMany>,
    pub kmsg: Option<KmsgFile>,
    pub nvml: Option<String>,
    pub timeout_secs: Option<f64>,
    pub max_output_bytes: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct KmsgFile {
    pub lines_before: Option<u64>,
    pub lines_after: Option<u64>,
    pub seconds_before: Option<u64>,
    pub seconds_after: Option<u64>,
    #[serde(default)]
    pub grep: Vec<String>,
    #[serde(default)]
    pub this_gpu: bool,
}

/// `read = "path"` or `read = ["path", ...]`.
#[derive(Debug)]
pub(crate) struct OneOrMany(pub Vec<String>);

impl<'de> Deserialize<'de> for OneOrMany {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OneOrMany;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a path or a list of paths")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<OneOrMany, E> {
                Ok(OneOrMany(vec![v.to_string()]))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<OneOrMany, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(OneOrMany(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// An Xid in a match list: `79` or `"144-150"`.
impl<'de> Deserialize<'de> for NumberSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = NumberSpec;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number such as 79 or a range such as \"144-150\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<NumberSpec, E> {
                u32::try_from(v)
                    .map(NumberSpec::One)
                    .map_err(|_| E::custom(format!("{v} is not a valid Xid")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<NumberSpec, E> {
                u32::try_from(v)
                    .map(NumberSpec::One)
                    .map_err(|_| E::custom(format!("{v} is not a valid Xid")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<NumberSpec, E> {
                let bad = || E::custom(format!("{v:?} is not a number or a range LOW-HIGH"));
                let parse = |s: &str| s.trim().parse::<u32>().map_err(|_| bad());
                match v.split_once('-') {
                    Some((lo, hi)) => {
                        let (lo, hi) = (parse(lo)?, parse(hi)?);
                        if lo > hi {
                            return Err(E::custom(format!("range {v:?} is empty")));
                        }
                        Ok(NumberSpec::Range(lo, hi))
                    }
                    None => parse(v).map(NumberSpec::One),
                }
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_ranges() {
        #[derive(Deserialize)]
        struct T {
            x: Vec<NumberSpec>,
        }
        let t: T = toml::from_str(r#"x = [79, "144-150", "13"]"#).unwrap();
        assert_eq!(
            t.x,
            vec![
                NumberSpec::One(79),
                NumberSpec::Range(144, 150),
                NumberSpec::One(13)
            ]
        );
        for bad in [
            r#"x = ["150-144"]"#,
            r#"x = [-1]"#,
            r#"x = ["a"]"#,
            r#"x = [1.5]"#,
        ] {
            assert!(toml::from_str::<T>(bad).is_err(), "{bad}");
        }
    }
}
