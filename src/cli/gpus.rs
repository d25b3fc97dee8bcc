//! `xidwatch inventory` and `xidwatch history`: what the daemon stored about this machine's GPUs,
//! read from the state directory without the daemon (and without its lock: both files are
//! replaced atomically, so a reader sees one whole version).

use std::fmt::Write as _;
use std::path::PathBuf;

use super::EXIT_CONFIG;

#[derive(Debug, clap::Args)]
pub struct InventoryArgs {
    /// Config file (its `[state] dir` says where the inventory is).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Show what changed since the previous boot instead of this boot's inventory.
    #[arg(long)]
    pub diff: bool,
}

#[derive(Debug, clap::Args)]
pub struct HistoryArgs {
    /// Config file (its `[state] dir` says where the history is).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Only this GPU: a board serial, a UUID or a PCI address.
    #[arg(long)]
    pub gpu: Option<String>,
    /// Only events this recent: `7d`, `12h`, `30m`, `90s`.
    #[arg(long)]
    pub since: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn state_dir(config: Option<&std::path::Path>) -> Result<PathBuf, u8> {
    match super::status::state_dir(config) {
        Ok((dir, note)) => {
            if let Some(n) = note {
                eprintln!("xidwatch: {n}");
            }
            Ok(dir)
        }
        Err(e) => {
            eprintln!("xidwatch: config error: {e}");
            Err(EXIT_CONFIG)
        }
    }
}

/// `xidwatch inventory`: exit 0, or 1 when no inventory has been taken yet.
pub fn inventory(args: &InventoryArgs) -> anyhow::Result<u8> {
    let dir = match state_dir(args.config.as_deref()) {
        Ok(d) => d,
        Err(code) => return Ok(code),
    };
    let Some(stored) = crate::inventory::load(&dir)? else {
        eprintln!(
            "xidwatch: no inventory in {} yet: the daemon takes one at its first start in each boot, when NVML answers",
            dir.display()
        );
        return Ok(1);
    };
    if args.diff {
        let diff = stored.diff();
        if args.json {
            println!("{}", serde_json::to_string_pretty(&diff)?);
        } else if stored.previous.is_none() {
            println!("no previous boot to compare with");
        } else if diff.is_empty() {
            println!("nothing changed since the previous boot");
        } else {
            for c in &diff {
                println!("{}", c.describe());
            }
        }
        return Ok(0);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&stored.current)?);
        return Ok(0);
    }
    let s = &stored.current;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "boot {} (taken {}), driver {}, {} GPU(s)",
        s.boot_id,
        crate::alert::document::rfc3339(s.taken_ms),
        s.driver_version.as_deref().unwrap_or("?"),
        s.gpu_count
    );
    for g in &s.gpus {
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".into());
        let num = |v: Option<u32>| v.map_or_else(|| "?".into(), |n| n.to_string());
        let _ = writeln!(
            o,
            "  {} {}  {}  serial {}  {}  VBIOS {}  max link Gen{} x{}  ECC {}  persistence {}  retired pages {}/{}  remapped rows {}/{}",
            g.index,
            g.pci,
            opt(&g.name),
            opt(&g.serial),
            opt(&g.uuid),
            opt(&g.vbios),
            num(g.link_gen_max),
            num(g.link_width_max),
            g.ecc_enabled.map_or("?", |b| if b { "on" } else { "off" }),
            g.persistence.map_or("?", |b| if b { "on" } else { "off" }),
            num(g.retired_sbe),
            num(g.retired_dbe),
            num(g.remapped_correctable),
            num(g.remapped_uncorrectable),
        );
    }
    print!("{o}");
    Ok(0)
}

/// Parses `7d`, `12h`, `30m`, `90s` into milliseconds.
pub fn parse_since(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("--since {s:?}: expected a number and a unit, like 7d or 12h"))?;
    let ms = match unit {
        "d" => 86_400_000,
        "h" => 3_600_000,
        "m" => 60_000,
        "s" => 1000,
        _ => {
            return Err(format!(
                "--since {s:?}: the unit must be d, h, m or s (7d, 12h, 30m, 90s)"
            ))
        }
    };
    Ok(n.saturating_mul(ms))
}

/// `xidwatch history`.
pub fn history(args: &HistoryArgs) -> anyhow::Result<u8> {
    let dir = match state_dir(args.config.as_deref()) {
        Ok(d) => d,
        Err(code) => return Ok(code),
    };
    let since = match args.since.as_deref().map(parse_since).transpose() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("xidwatch: {e}");
            return Ok(super::EXIT_ERROR);
        }
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    let from = since.map_or(0, |s| now.saturating_sub(s));
    let h = crate::history::load(&dir)?;
    let events = h.query(args.gpu.as_deref(), from);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&events)?);
        return Ok(0);
    }
    if events.is_empty() {
        println!("no events");
        return Ok(0);
    }
    for e in events {
        println!(
            "{}  {:<28} {:<9} {:<22} {}",
            crate::alert::document::rfc3339(e.at_ms),
            crate::history::board_words(&e.board),
            format!("{:?}", e.severity).to_lowercase(),
            e.what(),
            e.title
        );
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn since_takes_units() {
        assert_eq!(super::parse_since("7d"), Ok(7 * 86_400_000));
        assert_eq!(super::parse_since("90s"), Ok(90_000));
        assert!(super::parse_since("7").is_err());
        assert!(super::parse_since("d").is_err());
        assert!(super::parse_since("7w").is_err());
    }
}
