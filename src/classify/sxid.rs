//! The NVSwitch SXid catalog, kept as data (`catalog/nvidia/sxid.csv`) with its source: NVIDIA's
//! Fabric Manager User Guide, appendix "NVSwitch SXid Errors". Used by the classifier (titles,
//! always-fatal SXids are critical whatever the line says), `explain` and `scan`.

use std::sync::OnceLock;

/// How the Fabric Manager guide classes an SXid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SxidClass {
    /// No impact beyond the link or an automatically corrected error.
    NonFatal,
    /// Fatal to the partitions using the port; recovered by restarting them.
    Fatal,
    /// Fatal to the whole fabric: the host (or every NVSwitch and GPU) must be reset.
    AlwaysFatal,
}

impl SxidClass {
    pub fn as_str(self) -> &'static str {
        match self {
            SxidClass::NonFatal => "non-fatal",
            SxidClass::Fatal => "fatal",
            SxidClass::AlwaysFatal => "always fatal",
        }
    }
}

/// One catalog row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SxidEntry {
    pub sxid: u32,
    pub name: &'static str,
    pub class: SxidClass,
    /// Always fatal: critical whatever severity word the line carries.
    pub fatal: bool,
}

/// Where the catalog comes from, for `explain`.
pub const SOURCE: &str =
    "NVIDIA Fabric Manager User Guide (DU-09883-001 v1.3), appendix \"NVSwitch SXid Errors\"";

const CSV: &str = include_str!("catalog/nvidia/sxid.csv");

/// Every catalogued SXid, in number order.
pub fn all() -> &'static [SxidEntry] {
    static ROWS: OnceLock<Vec<SxidEntry>> = OnceLock::new();
    ROWS.get_or_init(|| {
        let mut rows: Vec<SxidEntry> = CSV
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with("sxid,") && !l.trim().is_empty())
            .filter_map(|l| {
                let mut f = l.splitn(3, ',');
                let sxid = f.next()?.trim().parse().ok()?;
                let name = f.next()?.trim();
                let class = match f.next()?.trim() {
                    "non_fatal" => SxidClass::NonFatal,
                    "fatal" => SxidClass::Fatal,
                    "always_fatal" => SxidClass::AlwaysFatal,
                    _ => return None,
                };
                Some(SxidEntry {
                    sxid,
                    name,
                    class,
                    fatal: class == SxidClass::AlwaysFatal,
                })
            })
            .collect();
        rows.sort_by_key(|r| r.sxid);
        rows
    })
}

pub fn lookup(sxid: u32) -> Option<&'static SxidEntry> {
    let rows = all();
    rows.binary_search_by_key(&sxid, |r| r.sxid)
        .ok()
        .map(|i| &rows[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_data_row_of_the_csv_is_read() {
        let data_rows = CSV
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with("sxid,") && !l.trim().is_empty())
            .count();
        assert_eq!(all().len(), data_rows);
        assert!(data_rows > 80);
        let e = lookup(20034).expect("20034");
        assert_eq!((e.name, e.class), ("LTSSM Fault Up", SxidClass::Fatal));
        assert_eq!(lookup(10003).map(|e| e.fatal), Some(true));
        assert!(lookup(1).is_none());
    }
}
