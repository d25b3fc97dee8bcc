//! `xidwatch explain`: the catalog entry for an Xid, as the on-call needs it.

use std::io::Write;

use anyhow::Context;

use super::ExplainArgs;
use crate::classify::catalog;

pub fn run(args: &ExplainArgs) -> anyhow::Result<u8> {
    let mut out = std::io::stdout().lock();
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
            )
            .context("writing to standard output")?;
        }
        return Ok(0);
    }
    let code = args.xid.context("an Xid number is required (or --list)")?;
    out.write_all(explain_text(code).as_bytes())
        .context("writing to standard output")?;
    Ok(0)
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
