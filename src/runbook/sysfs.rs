//! What the PCI files under /sys say about a GPU: link speed and width against their maximum,
//! AER counters, and the port above the device.
//!
//! The interpretation is pure (file name and contents in, notes out); only [`parent_port`] reads
//! the filesystem, under a root the caller chooses.

use std::path::Path;

use crate::model::PciAddress;

/// Link speed in GT/s from `current_link_speed` / `max_link_speed` (`"16.0 GT/s PCIe"`,
/// `"2.5 GT/s"`, older kernels `"8 GT/s"`). `None` for `"Unknown"` and anything else.
pub fn parse_link_speed(text: &str) -> Option<f64> {
    let t = text.trim();
    let num = t.split_whitespace().next()?;
    let num = num.strip_suffix("GT/s").unwrap_or(num);
    let v: f64 = num.parse().ok()?;
    (v.is_finite() && v > 0.0 && t.contains("GT/s")).then_some(v)
}

/// Link width from `current_link_width` / `max_link_width` (`"16"`, `"x16"`).
pub fn parse_link_width(text: &str) -> Option<u32> {
    let t = text.trim();
    t.strip_prefix('x').unwrap_or(t).parse().ok()
}

fn gts(v: f64) -> String {
    // 2.5 stays 2.5, 16.0 prints as 16.
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

/// A note on the PCIe link when the four link files are known (by file name) and say something
/// worth reading. `files` are `(file name, contents)`.
pub fn link_note(files: &[(&str, &str)]) -> Option<String> {
    let get = |name: &str| files.iter().find(|(n, _)| *n == name).map(|(_, c)| *c);
    let cur_s = get("current_link_speed")?;
    let max_s = get("max_link_speed")?;
    let cur_w = get("current_link_width")?;
    let max_w = get("max_link_width")?;
    let (cs, ms) = (parse_link_speed(cur_s), parse_link_speed(max_s));
    let (cw, mw) = (parse_link_width(cur_w), parse_link_width(max_w));
    if cw == Some(0) || (cs.is_none() && cur_s.trim().to_ascii_lowercase().starts_with("unknown")) {
        return Some(format!(
            "PCIe link is down (speed {}, width {}): the GPU is not reachable over the bus; \
             it has fallen off the bus, lost power, or its slot or riser failed",
            cur_s.trim(),
            cur_w.trim()
        ));
    }
    let (cs, ms, cw, mw) = (cs?, ms?, cw?, mw?);
    let now = format!("{} GT/s x{cw}", gts(cs));
    let max = format!("{} GT/s x{mw}", gts(ms));
    if cw < mw {
        Some(format!(
            "PCIe link at {now} where the maximum is {max}: a reduced width is never normal; \
             the card is badly seated, or the riser, cable or slot is failing"
        ))
    } else if cs < ms {
        Some(format!(
            "PCIe link at {now} where the maximum is {max}: an idle GPU lowers its link speed to \
             save power, so this is normal at rest; if it stays low under load, the link \
             retrained down after errors (check the AER counters) or the riser is marginal"
        ))
    } else {
        None
    }
}

/// Notes on non-zero AER counters in `aer_dev_correctable`, `aer_dev_nonfatal`,
/// `aer_dev_fatal` (lines `NAME COUNT`; the `TOTAL_ERR_*` lines are the sums).
pub fn aer_notes(files: &[(&str, &str)]) -> Vec<String> {
    let mut notes = Vec::new();
    for (file, what) in [
        ("aer_dev_fatal", "fatal (uncorrectable) PCIe errors"),
        ("aer_dev_nonfatal", "non-fatal uncorrectable PCIe errors"),
        ("aer_dev_correctable", "correctable PCIe errors"),
    ] {
        let Some((_, text)) = files.iter().find(|(n, _)| *n == file) else {
            continue;
        };
        let counts: Vec<String> = text
            .lines()
            .filter_map(|l| {
                let (name, n) = l.trim().rsplit_once(char::is_whitespace)?;
                let n: u64 = n.trim().parse().ok()?;
                (n > 0 && !name.starts_with("TOTAL_")).then(|| format!("{} {n}", name.trim()))
            })
            .collect();
        if !counts.is_empty() {
            let advice = if file == "aer_dev_correctable" {
                "a few are harmless; a growing count points at a marginal link (riser, cable, seating)"
            } else {
                "the link or the device is failing; expect the GPU to drop off the bus"
            };
            notes.push(format!(
                "{what} counted since boot: {}; {advice}",
                counts.join(", ")
            ));
        }
    }
    notes
}

/// The PCI bridge or root port directly above `pci`, from the sysfs topology
/// (`<root>/bus/pci/devices/<pci>` links to `.../<port>/<pci>`). `None` when the device is absent
/// or sits directly on a root bus.
pub fn parent_port(sysfs_root: &Path, pci: PciAddress) -> Option<PciAddress> {
    let link = sysfs_root.join("bus/pci/devices").join(pci.to_string());
    let target = std::fs::read_link(&link).ok()?;
    let parent = target.parent()?.file_name()?.to_str()?;
    PciAddress::parse(parent).ok()
}

/// The PCI devices above `pci` in the topology (its port, any switch ports, the root port),
/// nearest first, read from where its sysfs link points
/// (`../../../devices/pci0000:00/0000:00:01.0/0000:17:00.0`).
pub fn ports_above(sysfs_root: &Path, pci: PciAddress) -> Vec<PciAddress> {
    let link = sysfs_root.join("bus/pci/devices").join(pci.to_string());
    let Ok(target) = std::fs::read_link(&link) else {
        return Vec::new();
    };
    let mut out: Vec<PciAddress> = target
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .filter_map(|c| PciAddress::parse(c).ok())
        .filter(|a| *a != pci)
        .collect();
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(cs: &str, ms: &str, cw: &str, mw: &str) -> Option<String> {
        link_note(&[
            ("current_link_speed", cs),
            ("max_link_speed", ms),
            ("current_link_width", cw),
            ("max_link_width", mw),
        ])
    }

    #[test]
    fn parses_kernel_spellings() {
        assert_eq!(parse_link_speed("16.0 GT/s PCIe\n"), Some(16.0));
        assert_eq!(parse_link_speed("2.5 GT/s"), Some(2.5));
        assert_eq!(parse_link_speed("8 GT/s"), Some(8.0));
        assert_eq!(parse_link_speed("Unknown"), None);
        assert_eq!(parse_link_speed("Unknown speed"), None);
        assert_eq!(parse_link_width("16\n"), Some(16));
        assert_eq!(parse_link_width("x4"), Some(4));
        assert_eq!(parse_link_width("ff"), None);
    }

    #[test]
    fn degraded_width_is_a_seating_problem() {
        let n = link("2.5 GT/s PCIe", "16.0 GT/s PCIe", "4", "16").unwrap();
        assert!(
            n.starts_with("PCIe link at 2.5 GT/s x4 where the maximum is 16 GT/s x16"),
            "{n}"
        );
        assert!(n.contains("badly seated"), "{n}");
    }

    #[test]
    fn reduced_speed_alone_may_be_idle() {
        let n = link("2.5 GT/s PCIe", "32.0 GT/s PCIe", "16", "16").unwrap();
        assert!(n.contains("idle"), "{n}");
        assert_eq!(link("32.0 GT/s PCIe", "32.0 GT/s PCIe", "16", "16"), None);
        assert!(link("Unknown", "16.0 GT/s PCIe", "0", "16")
            .unwrap()
            .contains("link is down"));
        assert_eq!(link("garbage", "16.0 GT/s", "16", "16"), None);
    }

    #[test]
    fn aer_counts() {
        let fatal = "Undefined 0\nDLP 0\nCmpltTO 3\nMalfTLP 1\nTOTAL_ERR_FATAL 4\n";
        let cor = "RxErr 0\nBadTLP 0\nTOTAL_ERR_COR 0\n";
        let notes = aer_notes(&[("aer_dev_fatal", fatal), ("aer_dev_correctable", cor)]);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("CmpltTO 3, MalfTLP 1"), "{notes:?}");
    }
}
