//! `xidwatch explain`: the catalog entry for an Xid or an NVSwitch SXid, as the on-call needs it.

use std::io::{self, Write};

use anyhow::Context;

use super::ExplainArgs;
use crate::classify::{catalog, sxid};

pub fn run(args: &ExplainArgs) -> anyhow::Result<u8> {
    let out = io::stdout().lock();
    match write_explanation(args, io::BufWriter::new(out)) {
        Ok(()) => Ok(0),
        // `explain --list | head`: the reader has what it wanted; that is not an error.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(0),
        Err(e) => Err(e).context("writing to standard output"),
    }
}

fn write_explanation(args: &ExplainArgs, mut out: impl Write) -> io::Result<()> {
    if args.list && args.sxid {
        for e in sxid::all() {
            writeln!(out, "{:>5}  {:<12}  {}", e.sxid, e.class.as_str(), e.name)?;
        }
        writeln!(out, "source: {}", sxid::SOURCE)?;
        return out.flush();
    }
    if args.list {
        for e in catalog::entries() {
            writeln!(
                out,
                "{:>4}  {:<8}  {:<22}  {:<45}  {}",
                e.code,
                e.severity.as_str(),
                e.category.label(),
                e.mnemonic,
                e.summary
            )?;
        }
        return out.flush();
    }
    let Some(code) = args.xid else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "an Xid number is required (or --list)",
        ));
    };
    let text = if args.sxid {
        explain_sxid(code)
    } else {
        explain_text(code)
    };
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// The explanation of one NVSwitch SXid as text.
pub fn explain_sxid(code: u32) -> String {
    match sxid::lookup(code) {
        Some(e) => format!(
            "SXid {code}  {}\n\n  device      an NVSwitch (SXids come from the NVSwitch driver, not from a GPU)\n  class       {}\n  meaning     {}\n  source      {}\n",
            e.name,
            e.class.as_str(),
            match e.class {
                sxid::SxidClass::NonFatal => "the link or an automatically corrected error; traffic goes on. Watch for repeats.",
                sxid::SxidClass::Fatal => "fatal to the partitions (jobs, guest VMs) using this NVSwitch port; they must be restarted, and GPUs behind it see Xid 74/45.",
                sxid::SxidClass::AlwaysFatal => "fatal to the whole NVLink fabric: reset every NVSwitch and GPU (restart the host) before using the fabric again.",
            },
            sxid::SOURCE
        ),
        None => format!(
            "SXid {code}: not in this catalog ({}). xidwatch still reports it, with the Fatal/Non-fatal word the line carries.\n",
            sxid::SOURCE
        ),
    }
}

/// The explanation of one Xid as text.
pub fn explain_text(code: u32) -> String {
    let Some(e) = catalog::lookup(code) else {
        return format!(
            "Xid {code}: unknown to this catalog (the catalog may be older than the driver).\n\
             \n  xidwatch reports it as \"unknown Xid {code}\" at warning severity and never drops it.\n\
             \x20 Look it up in NVIDIA's current Xid catalog, and read the kernel log around it.\n\
             \n  catalog    codes 1..{} from the {}\n",
            catalog::XID_CODES_MAX,
            catalog::SOURCE
        );
    };
    let mut s = format!("Xid {}  {}\n\n", e.code, e.mnemonic);
    let row = |s: &mut String, k: &str, v: &str| {
        if !v.is_empty() {
            s.push_str(&format!("  {k:<12}{v}\n"));
        }
    };
    row(&mut s, "severity", e.severity.as_str());
    row(&mut s, "category", e.category.label());
    row(&mut s, "meaning", e.summary);
    row(&mut s, "causes", e.causes);
    row(&mut s, "check", e.check);
    // NVIDIA gives some Xids (48, 145, ...) the same bucket for both steps: say it once.
    let same = e.immediate == e.investigatory;
    let cells: &[(&str, &str)] = if same {
        &[("action", e.immediate)]
    } else {
        &[("immediate", e.immediate), ("investigate", e.investigatory)]
    };
    for &(label, cell) in cells {
        if cell.is_empty() {
            continue;
        }
        let meanings = catalog::bucket_meanings(cell);
        let what = if same {
            "NVIDIA's resolution bucket, both immediate and investigatory"
        } else {
            "NVIDIA's resolution bucket"
        };
        row(&mut s, label, &format!("{cell} ({what})"));
        for b in meanings {
            row(&mut s, "", &format!("{}: {}", b.name, b.meaning));
        }
    }
    if !e.in_use {
        row(
            &mut s,
            "note",
            "NVIDIA lists this code as unused on current data-centre GPUs.",
        );
    }
    row(&mut s, "applies to", &e.applies_to.join(", "));
    if !e.added_in.is_empty() {
        // Said outright: an on-call comparing with NVIDIA's catalog page will not find the code.
        row(
            &mut s,
            "source",
            &format!(
                "defined by the driver from {}; not yet in NVIDIA's published Xid catalog (no resolution bucket given)",
                e.added_in
            ),
        );
    }
    if !e.xid154.is_empty() {
        row(
            &mut s,
            "xid 154",
            &format!("also raises Xid 154 ({})", e.xid154),
        );
    }
    if (144..=150).contains(&code) {
        let rows = catalog::nvlink5_rows()
            .iter()
            .filter(|r| r.xid == code)
            .count();
        row(&mut s, "decode", &format!("{rows} rows of NVIDIA's NVLink5 decode table apply; xidwatch decodes IntrInfo and Error Status from the log line"));
    }
    row(&mut s, "runbook", &crate::cli::explain::runbook_for(e));
    s
}

/// Which runbook xidwatch runs for this Xid (with the config in force, else the shipped set).
pub fn runbook_for(e: &catalog::XidEntry) -> String {
    let set = match crate::config::Config::load(None) {
        Ok(c) => c.runbook_set,
        Err(_) => match crate::runbook::RunbookSet::shipped() {
            Ok(s) => std::sync::Arc::new(s),
            Err(_) => return "(runbooks could not be loaded: run `xidwatch check`)".into(),
        },
    };
    let mut subject = crate::runbook::Subject::manual(None, Some(e.code), None);
    subject.category = e.category;
    subject.severity = e.severity;
    match set.select_explained(&subject) {
        Some(sel) => format!(
            "{} ({}); see `xidwatch runbook show {}`",
            sel.runbook.name(),
            sel.reason,
            sel.runbook.name()
        ),
        None => "none".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explain_names_the_codes_past_the_published_catalog() {
        for (code, name, sev) in [
            (173, "C2C fatal link failure", "critical"),
            (174, "Silent channel reset", "warning"),
            (175, "Memory subsystem error", "critical"),
            (176, "PCIe correctable-error fault", "warning"),
            (185, "Sparing event", "warning"),
        ] {
            let t = explain_text(code);
            assert!(t.starts_with(&format!("Xid {code}  {name}\n")), "{t}");
            assert!(t.contains(&format!("severity    {sev}")), "{t}");
            assert!(
                t.contains("not yet in NVIDIA's published Xid catalog"),
                "{t}"
            );
            assert!(!t.contains("unknown to this catalog"), "{t}");
        }
        assert!(explain_text(79).lines().all(|l| !l.contains("source ")));
        assert!(explain_text(177).contains("unknown to this catalog"));
    }
}
