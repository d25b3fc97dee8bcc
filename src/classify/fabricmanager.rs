//! Fabric Manager's own log (`/var/log/fabricmanager.log`, and the same records in the journal
//! under `nv-fabricmanager[pid]:` and in bug-report archives).
//!
//! Fabric Manager is the user-space daemon that programs an NVSwitch system's fabric. When it
//! stops, or a switch port fails under it, CUDA jobs on the node die or never start, and the
//! kernel log may hold no Xid at all: its log is then the only place the cause is written.
//!
//! A record reads `[Jul 23 2024 07:53:55] [ERROR] [tid 841] TEXT`; the journal carries the same
//! record after its own tag, sometimes without Fabric Manager's stamp. Levels are ERROR, WARNING,
//! INFO and DEBUG: only ERROR records become findings of their own (INFO and DEBUG are the
//! daemon's chatter), and WARNING records only where their text is one of the failures below.

use crate::model::PciAddress;

/// What a Fabric Manager record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FmEvent {
    /// `detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id ... physical id 3
    /// port 33`: an SXid, as Fabric Manager saw it, with the switch and the port.
    SwitchError {
        fatal: bool,
        sxid: u32,
        switch: Option<PciAddress>,
        physical_id: Option<u32>,
        port: Option<u32>,
    },
    /// Fabric Manager gave up: a topology it does not support, or another reason it names.
    Aborted { topology: bool },
    /// `failed to find the GPU handle N in the multicast team request setup M`: a GPU the fabric
    /// lost, so the job's NVLink multicast (NVLS) setup fails.
    GpuHandleMissing,
    /// A request to the NVSwitch kernel driver failed: Fabric Manager cannot program the fabric.
    SwitchDriverRequestFailed,
    /// Any other ERROR record.
    OtherError,
}

/// One Fabric Manager record, its stamp and thread id dropped.
pub struct Record<'a> {
    /// `ERROR`, `WARNING`, ...; `None` where the journal dropped the level.
    pub level: Option<&'a str>,
    pub text: &'a str,
}

/// Splits `[ERROR] [tid 841] TEXT` (optionally after a `[Mon DD YYYY HH:MM:SS] ` stamp) into
/// level and text. `None` when the line has no level bracket.
pub fn record(msg: &str) -> Option<Record<'_>> {
    let msg = strip_stamp(msg).unwrap_or(msg);
    let rest = msg.strip_prefix('[')?;
    let (level, rest) = rest.split_once("] ")?;
    if !matches!(level, "ERROR" | "WARNING" | "INFO" | "DEBUG" | "FATAL") {
        return None;
    }
    let text = match rest.strip_prefix("[tid ") {
        Some(t) => t.split_once("] ").map_or("", |(_, t)| t),
        None => rest,
    };
    Some(Record {
        level: Some(level),
        text: text.trim_end(),
    })
}

/// The text after Fabric Manager's `[Jul 23 2024 07:53:55] ` stamp, when the line starts with one.
pub fn strip_stamp(s: &str) -> Option<&str> {
    let b = s.as_bytes();
    // "[Mon DD YYYY HH:MM:SS] " is 23 bytes.
    if b.len() < 23 || b[0] != b'[' || b[21] != b']' || b[22] != b' ' {
        return None;
    }
    let month = &s.get(1..4)?;
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    let ok = month.bytes().all(|c| c.is_ascii_alphabetic())
        && b[4] == b' '
        && digits(5..7)
        && b[7] == b' '
        && digits(8..12)
        && b[12] == b' '
        && digits(13..15)
        && b[15] == b':'
        && digits(16..18)
        && b[18] == b':'
        && digits(19..21);
    ok.then(|| &s[23..])
}

/// Where a Fabric Manager record starts in a saved line: at its level bracket right after its
/// stamp (`[Jul 23 2024 07:53:55] [ERROR] ...`). Only ERROR and WARNING records: the others are
/// never findings, so `scan` need not look at them.
pub fn record_start(line: &str) -> Option<usize> {
    for needle in ["] [ERROR] ", "] [WARNING] "] {
        let mut from = 0;
        while let Some(i) = line.get(from..).and_then(|l| l.find(needle)) {
            let at = from + i;
            // The stamp is the 22 bytes ending at `at`.
            if at >= 21 && line.is_char_boundary(at - 21) && strip_stamp(&line[at - 21..]).is_some()
            {
                return Some(at + 2);
            }
            from = at + 1;
        }
    }
    None
}

/// What a record's text says. `error` is whether the record is at ERROR level (or has none, as
/// the journal may print it): an unrecognised ERROR is still an error, an unrecognised WARNING is
/// not.
pub fn classify(text: &str, error: bool) -> Option<FmEvent> {
    let lower = text.to_ascii_lowercase();
    for (needle, fatal) in [
        ("detected nvswitch fatal error ", true),
        ("detected nvswitch non-fatal error ", false),
    ] {
        if let Some(i) = lower.find(needle) {
            let rest = &text[i + needle.len()..];
            let sxid = leading_number(rest)?;
            return Some(FmEvent::SwitchError {
                fatal,
                sxid,
                switch: word_after(rest, "pci bus id ").and_then(|w| PciAddress::parse(w).ok()),
                physical_id: word_after(rest, "physical id ").and_then(leading_number),
                port: word_after(rest, "port ").and_then(leading_number),
            });
        }
    }
    let topology = lower.contains("supported system topology")
        || (lower.contains("topology") && lower.contains("not supported"));
    if lower.contains("aborting fabric manager") || topology {
        return Some(FmEvent::Aborted { topology });
    }
    if lower.contains("failed to find the gpu handle") || lower.contains("cannot find gpu handle") {
        return Some(FmEvent::GpuHandleMissing);
    }
    if lower.contains("nvswitch driver") && lower.contains("failed") {
        // NV_WARN_NOTHING_TO_DO: the driver has no NVSwitch to offer; on a machine with none (an
        // NVLink bridge between two cards) Fabric Manager simply has nothing to manage.
        if lower.contains("nv_warn_nothing_to_do") {
            return None;
        }
        return Some(FmEvent::SwitchDriverRequestFailed);
    }
    error.then_some(FmEvent::OtherError)
}

fn leading_number(s: &str) -> Option<u32> {
    let d: String = s.chars().take_while(char::is_ascii_digit).collect();
    d.parse().ok()
}

/// The word after `key` (which ends in a space), up to the next space or comma.
fn word_after<'a>(s: &'a str, key: &str) -> Option<&'a str> {
    let i = s.find(key)?;
    let w = s[i + key.len()..].split([' ', ',']).next()?;
    (!w.is_empty()).then_some(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::testing::{loud_line, read};
    use crate::model::{Detail, FindingKind, Severity};

    // Lines as Fabric Manager writes them (public examples: leptonai/gpud's fabric-manager
    // component, NVIDIA/gpu-operator#610).
    const FATAL: &str = "[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 33";
    const NON_FATAL: &str = "[Jul 09 2024 18:14:07] [ERROR] [tid 12727] detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 61";
    const TOPOLOGY: &str = "[Sep 08 2025 23:21:50] [ERROR] detected number of NVSwitches don't match with any supported system topology, aborting fabric manager";
    const HANDLE: &str = "[Sep 17 2024 06:01:46] [ERROR] [tid 1230079] failed to find the GPU handle 5410063385821516767 in the multicast team request setup 6130285411925746235.";

    #[test]
    fn switch_errors_carry_the_sxid_switch_and_port() {
        for prefilter in [false, true] {
            let f = loud_line(FATAL, prefilter);
            assert_eq!(f.len(), 1, "{f:#?}");
            let f = &f[0];
            assert_eq!(
                (f.kind, f.xid, f.severity),
                (FindingKind::Sxid, Some(20034), Severity::Critical)
            );
            assert_eq!(
                f.pci.map(|p| p.to_string()).as_deref(),
                Some("0000:86:00.0")
            );
            assert!(matches!(
                f.detail,
                Some(Detail::Sxid {
                    fatal: true,
                    link: Some(33),
                    ..
                })
            ));
            assert!(f.title.contains("LTSSM Fault Up"), "{}", f.title);
            assert!(
                f.title.contains("port 33") && f.title.contains("Fabric Manager"),
                "{}",
                f.title
            );
        }
        let f = loud_line(NON_FATAL, true);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!((f[0].xid, f[0].severity), (Some(12028), Severity::Warning));
    }

    #[test]
    fn fabric_manager_failures_are_critical() {
        let journal = "Sep 08 23:21:50 node7 nv-fabricmanager[2211]: detected number of NVSwitches don't match with any supported system topology, aborting fabric manager";
        let driver = "Nov 15 14:15:47 node7 nv-fabricmanager[4177]: request to query NVSwitch device information from NVSwitch driver failed with error:generic error [NV_ERR_GENERIC]";
        let wrapped = "Sep 17 06:01:46 node7 nv-fabricmanager[99]: [Sep 17 2024 06:01:46] [ERROR] [tid 1230079] failed to find the GPU handle 5410063385821516767 in the multicast team request setup 6130285411925746235.";
        for line in [TOPOLOGY, HANDLE, journal, driver, wrapped] {
            let f = loud_line(line, true);
            assert_eq!(f.len(), 1, "{line}: {f:#?}");
            assert_eq!(f[0].severity, Severity::Critical, "{line}");
            assert_eq!(f[0].kind, FindingKind::DriverError, "{line}");
            assert!(f[0].title.starts_with("Fabric Manager"), "{}", f[0].title);
        }
    }

    #[test]
    fn info_lines_and_other_error_texts() {
        for quiet in [
            "[Jul 23 2024 07:50:01] [INFO] [tid 841] Fabric Manager version 550.54.15 is running",
            "May 16 15:10:22 host nv-fabricmanager[29850]: [May 16 2025 15:10:21] [INFO] [tid 30042] GPU probe request received from node Id 0 and module Id 7 GUID 0x3b",
            "[Jul 23 2024 07:50:01] [WARNING] [tid 841] something the daemon only warns about",
            // No NVSwitch at all: nothing for Fabric Manager to manage.
            "11月 15 14:15:47 leon-NF5468M6 nv-fabricmanager[4177]: request to query NVSwitch device information from NVSwitch driver failed with error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]",
            // Another program's log with a bracketed level is not Fabric Manager's.
            "[2024-07-23 07:53:55] [ERROR] [tid 841] connection refused",
        ] {
            assert!(loud_line(quiet, true).is_empty(), "{quiet}");
        }
        let f = read(&["[Jul 23 2024 07:53:55] [ERROR] [tid 841] failed to open fabric manager config file"], true);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].severity, Severity::Warning);
    }

    #[test]
    fn odd_records_never_panic() {
        for s in [
            "[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error",
            "[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error x on pci bus id ",
            "[Jul 23 2024 07:53:55] [ERROR] [tid",
            "[Jul 23 2024 07:53:55] [ERROR] ",
            "é] [ERROR] x",
            "[Jul 23 2024 07:53:5é] [ERROR] x",
        ] {
            let _ = read(&[s], true);
            let _ = read(&[s], false);
        }
        assert_eq!(strip_stamp("[Jul 23 2024 07:53:55] x"), Some("x"));
        assert_eq!(
            record_start("junk [Jul 23 2024 07:53:55] [ERROR] x"),
            Some(28)
        );
    }
}
