//! The Xid catalog: NVIDIA's facts (codes, mnemonics, resolution buckets, GPU generations, Xid 154
//! linkage, the NVLink5 decode table) joined with xidwatch's own words (category, severity,
//! on-call guidance).
//!
//! `generated.rs` is produced from `nvidia/*.csv` and `xidwatch.toml` by the generator in
//! `tests/it/catalog_current.rs`; that test fails when the generated file is stale. Regenerate with
//! `XIDWATCH_REGENERATE=1 cargo test --test it catalog_current`.

#[rustfmt::skip]
mod generated;

use crate::model::{Category, NvlinkDecode, Severity};

pub use generated::{NEWEST_DRIVER_BRANCH, SOURCE, XID_CODES_MAX};

/// One Xid as the catalog knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidEntry {
    pub code: u32,
    /// NVIDIA's mnemonic, exactly as published.
    pub mnemonic: &'static str,
    /// False where NVIDIA marks the code unused (deprecated, or only on V100 and older).
    pub in_use: bool,
    /// GPU generations NVIDIA lists the code for (A100, H100, B100, GB200).
    pub applies_to: &'static [&'static str],
    /// NVIDIA's immediate resolution bucket (what gets the machine back into service).
    pub immediate: &'static str,
    /// NVIDIA's investigatory bucket (what avoids a repeat).
    pub investigatory: &'static str,
    /// Whether, and from which driver, this code also raises Xid 154; empty when not.
    pub xid154: &'static str,
    pub category: Category,
    pub severity: Severity,
    /// xidwatch's own words: what happened.
    pub summary: &'static str,
    /// xidwatch's own words: likely causes.
    pub causes: &'static str,
    /// xidwatch's own words: what to check first.
    pub check: &'static str,
    /// Empty for a code of NVIDIA's published catalog. For a code the driver defines but the
    /// published catalog does not list yet, the driver branch that added it (`R580`): its facts
    /// come from the driver, and `explain` says so.
    pub added_in: &'static str,
}

/// A resolution bucket and what it asks the operator to do, in xidwatch's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub name: &'static str,
    pub meaning: &'static str,
}

/// A bit pattern over a 32-bit register: bits in `mask` must equal those in `value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BitPattern {
    pub mask: u32,
    pub value: u32,
}

impl BitPattern {
    pub fn matches(&self, reg: u32) -> bool {
        reg & self.mask == self.value
    }
}

/// One row of NVIDIA's NVLink5 (Xid 144-150) decode table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nvlink5Row {
    pub xid: u32,
    /// Unit name printed by drivers before R575 and from R575 on (often the same).
    pub unit_v1: &'static str,
    pub unit_v2: &'static str,
    pub intr_v1: BitPattern,
    pub intr_v2: BitPattern,
    /// Error Status values this row applies to; empty means any.
    pub error_status: &'static [u32],
    pub immediate: &'static str,
    /// A second IntrInfo pattern that promotes the row to `action2`.
    pub action2_v1: Option<BitPattern>,
    pub action2_v2: Option<BitPattern>,
    pub action2: &'static str,
    pub investigatory: &'static str,
    pub severity: &'static str,
    pub hw_sw: &'static str,
}

/// The whole catalog, sorted by code.
pub fn entries() -> &'static [XidEntry] {
    generated::XIDS
}

/// Gives an Xid finding that came from somewhere other than a kernel log line (NVML) the
/// catalog's severity, category and name, as the classifier gives its own.
pub fn apply_to(f: &mut crate::model::Finding) {
    let Some(code) = f.xid else { return };
    match lookup(code) {
        Some(e) => {
            f.severity = e.severity;
            f.category = e.category;
            f.title = format!("Xid {code} {} (reported by NVML)", e.mnemonic).into();
        }
        None => {
            f.severity = Severity::Warning;
            f.title = format!(
                "unknown Xid {code} (the catalog may be older than the driver; reported by NVML)"
            )
            .into();
        }
    }
}

/// The entry for a code, or `None` for a code newer than the catalog.
pub fn lookup(code: u32) -> Option<&'static XidEntry> {
    generated::XIDS.get(index(code)?)
}

/// `Xid N MNEMONIC`, the title of an Xid finding, for a code the catalog has: built once per
/// code, so that a storm's findings borrow one title rather than format a copy each.
pub fn title(code: u32) -> Option<&'static str> {
    static TITLES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let titles = TITLES.get_or_init(|| {
        generated::XIDS
            .iter()
            .map(|e| format!("Xid {} {}", e.code, e.mnemonic))
            .collect()
    });
    titles.get(index(code)?).map(String::as_str)
}

/// Where a code's entry is in the catalog.
fn index(code: u32) -> Option<usize> {
    // Codes below 256 (all of today's) by a table built once: the binary search over the
    // entries missed the cache on every Xid of a storm.
    static INDEX: std::sync::OnceLock<[u16; 256]> = std::sync::OnceLock::new();
    if code < 256 {
        let idx = INDEX.get_or_init(|| {
            let mut t = [u16::MAX; 256];
            for (i, e) in generated::XIDS.iter().enumerate() {
                if e.code < 256 {
                    t[e.code as usize] = i as u16;
                }
            }
            t
        });
        let i = usize::from(idx[code as usize]);
        return (i < generated::XIDS.len()).then_some(i);
    }
    generated::XIDS.binary_search_by_key(&code, |e| e.code).ok()
}

/// Every resolution bucket.
pub fn buckets() -> &'static [Bucket] {
    generated::BUCKETS
}

/// What a bucket cell asks for. Cells sometimes hold several buckets or a note
/// ("Solo: RESTART_FM / Not Solo: IGNORE ..."); each known bucket name in it is explained.
pub fn bucket_meanings(cell: &str) -> Vec<&'static Bucket> {
    let mut out: Vec<&'static Bucket> = Vec::new();
    if let Some(b) = generated::BUCKETS.iter().find(|b| b.name == cell.trim()) {
        out.push(b);
        return out;
    }
    for word in cell.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '/')) {
        if let Some(b) = generated::BUCKETS.iter().find(|b| b.name == word) {
            if !out.iter().any(|o| o.name == b.name) {
                out.push(b);
            }
        }
    }
    out
}

/// The NVLink5 decode rows.
pub fn nvlink5_rows() -> &'static [Nvlink5Row] {
    generated::NVLINK5
}

/// Which register layout the driver uses for Xids 144-150: it changed in R575.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nvlink5Layout {
    /// Drivers before R575: the unit is in IntrInfo[9:5].
    V1,
    /// R575 and later: the unit is in IntrInfo[6:0].
    V2,
}

impl Nvlink5Layout {
    /// The layout for a driver version such as `575.51.03`; `None` when it does not parse.
    pub fn for_driver(version: &str) -> Option<Self> {
        let major: u32 = version.trim().split('.').next()?.parse().ok()?;
        Some(if major >= 575 {
            Nvlink5Layout::V2
        } else {
            Nvlink5Layout::V1
        })
    }
}

/// Decodes an NVLink5 Xid's registers with NVIDIA's table. With no known layout both are tried and
/// every match is returned, labelled, so the on-call sees both readings rather than a guess.
pub fn decode_nvlink5(
    xid: u32,
    intr_info: u32,
    error_status: u32,
    layout: Option<Nvlink5Layout>,
) -> Vec<NvlinkDecode> {
    let mut out = Vec::new();
    for row in generated::NVLINK5.iter().filter(|r| r.xid == xid) {
        if !row.error_status.is_empty() && !row.error_status.contains(&error_status) {
            continue;
        }
        for (lay, pat, a2, unit, name) in [
            (
                Nvlink5Layout::V1,
                row.intr_v1,
                row.action2_v1,
                row.unit_v1,
                "V1",
            ),
            (
                Nvlink5Layout::V2,
                row.intr_v2,
                row.action2_v2,
                row.unit_v2,
                "V2",
            ),
        ] {
            if layout.is_some_and(|l| l != lay) {
                continue;
            }
            let promoted = a2.is_some_and(|p| p.matches(intr_info)) && !row.action2.is_empty();
            if pat.matches(intr_info) || promoted {
                out.push(NvlinkDecode {
                    layout: name,
                    unit,
                    severity: row.severity,
                    immediate: if promoted { row.action2 } else { row.immediate },
                    investigatory: row.investigatory,
                    origin: row.hw_sw,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The index by code finds what a search of the entries finds, for every code.
    #[test]
    fn lookup_by_index_matches_the_search() {
        for code in 0..1024u32 {
            let searched = generated::XIDS
                .binary_search_by_key(&code, |e| e.code)
                .ok()
                .map(|i| &generated::XIDS[i]);
            assert_eq!(
                lookup(code).map(|e| e.code),
                searched.map(|e| e.code),
                "{code}"
            );
        }
    }

    #[test]
    fn covers_every_published_code_and_the_drivers_newer_ones() {
        let codes: Vec<u32> = entries().iter().map(|e| e.code).collect();
        let mut want: Vec<u32> = (1..=XID_CODES_MAX).collect();
        want.extend([173, 174, 175, 176, 185]);
        assert_eq!(codes, want);
        assert!(entries()
            .iter()
            .all(|e| e.added_in.is_empty() == (e.code <= XID_CODES_MAX)));
        assert_eq!(lookup(175).map(|e| e.severity), Some(Severity::Critical));
        assert_eq!(lookup(173).map(|e| e.severity), Some(Severity::Critical));
        assert_eq!(lookup(185).map(|e| e.added_in), Some("R620"));
        let e = lookup(79).unwrap();
        assert_eq!(e.mnemonic, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS");
        assert_eq!(e.severity, Severity::Critical);
        assert_eq!(e.category, Category::Pcie);
        assert!(lookup(177).is_none());
        assert!(lookup(0).is_none());
    }

    #[test]
    fn every_bucket_named_by_an_entry_is_explained() {
        for e in entries() {
            for cell in [e.immediate, e.investigatory] {
                if !cell.is_empty() {
                    assert!(
                        !bucket_meanings(cell).is_empty(),
                        "Xid {} bucket {cell:?} unexplained",
                        e.code
                    );
                }
            }
        }
    }

    #[test]
    fn decodes_nvlink5_by_layout() {
        // V1 RLW_SRC_TRACK: IntrInfo[9:0] = 0011100010, error status 0x1 -> fatal, reset GPU.
        let v1 = 0b00_1110_0010;
        let d = decode_nvlink5(145, v1, 0x1, Some(Nvlink5Layout::V1));
        assert_eq!(d.len(), 1);
        assert_eq!(
            (d[0].unit, d[0].immediate, d[0].severity),
            ("RLW_SRC_TRACK", "RESET_GPU", "Fatal")
        );
        // V2 RLW_SRC_TRACK: IntrInfo[6:0] = 0000111.
        let d = decode_nvlink5(145, 0b000_0111, 0x1, Some(Nvlink5Layout::V2));
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].layout, "V2");
        assert!(decode_nvlink5(145, v1, 0x1, Some(Nvlink5Layout::V2)).is_empty());
        assert_eq!(
            Nvlink5Layout::for_driver("575.51.03"),
            Some(Nvlink5Layout::V2)
        );
        assert_eq!(
            Nvlink5Layout::for_driver("570.124.06"),
            Some(Nvlink5Layout::V1)
        );
        assert_eq!(Nvlink5Layout::for_driver("x"), None);
    }

    #[test]
    fn promotes_rxpipe_to_action_2() {
        // V1 RLW_RXPIPE with IntrInfo bit 10 set: the "action 2" pattern, which asks for a reset.
        let intr = 0b100_1100_0010;
        let d = decode_nvlink5(145, intr, 0x1, Some(Nvlink5Layout::V1));
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].immediate, "RESET_GPU");
    }
}
