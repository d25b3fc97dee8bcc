//! The event lines: Xid (kernel and device-plugin forms), SXid, and PCIe AER.

use super::*;
use crate::classify::trim;

/// Parses an Xid line after `NVRM: `.
pub fn parse_xid(m: &str) -> Option<XidLine> {
    parse_xid_after(m.strip_prefix("Xid ")?)
}

/// The Xid line grammar, read left to right without backtracking:
/// `(` [`PCI:`] ADDRESS `)` [spaces] `:` [spaces] NUMBER [`,` | spaces] [`pid=`PID`,`]
/// [`name=`NAME`,`] REST. A redacted address (`PCI:...`) still gives the Xid number. Old drivers
/// put a space before the colon (`NVRM Xid (PCI:0000:0b:00) : 32, Channel ID 00000009 ...`).
pub(super) fn parse_xid_after(x: &str) -> Option<XidLine> {
    // No address at all, the reporter having cut it out with its parentheses (`Xid: 154, GPU
    // recovery action changed ...`): the number and what follows it still read.
    if let Some(rest) = x.strip_prefix(':') {
        return xid_tail(None, trim::spaces(rest));
    }
    let inner = x.strip_prefix('(')?;
    let ib = inner.as_bytes();
    let colon_after = |i: usize| {
        let spaces = ib[i + 1..].iter().take_while(|&&c| c == b' ').count();
        (ib.get(i + 1 + spaces) == Some(&b':')).then_some(i + 1 + spaces)
    };
    let (close, colon) = memchr::memchr_iter(b')', ib).find_map(|i| Some((i, colon_after(i)?)))?;
    let addr = &inner[..close];
    if memchr::memchr(b'(', addr.as_bytes()).is_some() {
        return None;
    }
    // The address is the first word: on a MIG GPU the driver adds the instances after it
    // (`PCI:0000:01:00 GPU-I:05 GPU-CI:02`). An address the reporter redacted (`PCI:...`,
    // `PCI:0000:XX:00`, `PCI:<redacted>`) or the driver left out still gives the Xid number.
    let addr = if addr.bytes().all(|c| c.is_ascii_graphic()) {
        addr
    } else {
        addr.split_whitespace().next().unwrap_or("")
    };
    let addr = match addr.as_bytes() {
        [b'P', b'C', b'I', b':', ..] => &addr[4..],
        _ => addr,
    };
    let pci = PciAddress::parse(addr).ok();
    xid_tail(pci, trim::spaces(&inner[colon + 1..]))
}

/// Where the `pid=` or `name=` field starting `rest` ends: at its comma, a few bytes on. A byte
/// loop, not `str::find`: the general searcher's set-up cost more than the search, twice for every
/// Xid of a storm.
fn comma_or_end(rest: &str) -> usize {
    rest.bytes().position(|b| b == b',').unwrap_or(rest.len())
}

/// The Xid number and what follows it (`79, pid=2207, name=python3, GPU has fallen off the
/// bus.`), after the address.
fn xid_tail(pci: Option<PciAddress>, after: &str) -> Option<XidLine> {
    let digits = after.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 10 {
        return None;
    }
    let xid: u32 = after[..digits].parse().ok()?;
    let mut tail = &after[digits..];
    if !tail.is_empty() {
        // The number ends at a comma or a space; anything else ("79x") is not this grammar.
        tail = if let Some(t) = tail.strip_prefix(',') {
            t
        } else if tail.starts_with(' ') {
            tail
        } else {
            return None;
        };
        tail = trim::start(tail);
    }
    let (mut pid, mut process) = (None, None);
    if let [b'p', b'i', b'd', b'=', ..] = tail.as_bytes() {
        let rest = &tail[4..];
        let end = comma_or_end(rest);
        let v = trim::both(&rest[..end]).trim_matches('\'');
        pid = v.parse().ok();
        tail = trim::start(rest[end..].strip_prefix(',').unwrap_or(&rest[end..]));
    }
    if let [b'n', b'a', b'm', b'e', b'=', ..] = tail.as_bytes() {
        let rest = &tail[5..];
        let end = comma_or_end(rest);
        let v = trim::both(&rest[..end]);
        if !v.is_empty() && v != "<unknown>" && v != "'<unknown>'" {
            process = Some(v.to_string());
        }
        tail = trim::start(rest[end..].strip_prefix(',').unwrap_or(&rest[end..]));
    }
    Some(XidLine {
        pci,
        xid,
        pid,
        process,
        rest: trim::both(tail).to_string(),
        uuid: None,
    })
}

/// An NVML Xid event as the Kubernetes device plugin logs it:
/// `XidCriticalError: Xid=94 on Device=GPU-3b6e...; marking device as unhealthy.` The driver
/// printed the same Xid to the kernel log, which the pasted log often lacks.
pub(super) fn parse_xid_event(msg: &str) -> Option<XidLine> {
    if msg.starts_with("XID ") {
        return agent_xid(msg);
    }
    let rest = msg.strip_prefix("XidCriticalError: Xid=")?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 10 {
        return None;
    }
    let xid = rest[..digits].parse().ok()?;
    let after = rest[digits..].trim_start();
    let device = after
        .strip_prefix("on")
        .map(str::trim_start)
        .and_then(|d| d.strip_prefix("Device="))
        .unwrap_or("");
    let uuid: String = device
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    // A UUID the reporter redacted (`GPU-XXXX`) names no GPU.
    let uuid = (uuid.starts_with("GPU-") || uuid.starts_with("MIG-"))
        .then_some(uuid)
        .filter(|u| u[4..].bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') && u.len() > 12);
    Some(XidLine {
        pci: None,
        xid,
        pid: None,
        process: None,
        rest:
            "Xid event reported through NVML (the Kubernetes device plugin marks the GPU unhealthy)"
                .into(),
        uuid,
    })
}

/// A GPU health agent's summary of an Xid it read (GPUd): `XID 79(GPU has fallen off the bus)
/// detected on PCI:0000:ae:00`. The kernel's own line may be gone from the log the agent's is in
/// (a rotated journal, a container's output), so the summary stands for it. A NIC's `XID 641`
/// (Realtek's chip version, no parenthesis, no address) is not one.
pub fn agent_xid(msg: &str) -> Option<XidLine> {
    let rest = msg.strip_prefix("XID ")?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 10 || rest.as_bytes().get(digits) != Some(&b'(') {
        return None;
    }
    let xid = rest[..digits].parse().ok()?;
    let (what, after) = rest[digits + 1..].split_once(") detected on PCI:")?;
    let addr: String = after
        .chars()
        .take_while(|c| c.is_ascii_hexdigit() || *c == ':' || *c == '.')
        .collect();
    Some(XidLine {
        pci: Some(pci(&addr)?),
        xid,
        pid: None,
        process: None,
        rest: what.trim().to_string(),
        uuid: None,
    })
}

/// The SXid grammar: `nvidia-nvswitchN: SXid (PCI:ADDRESS): NUMBER, REST`.
pub(super) fn parse_sxid(m: &str) -> Option<SxidLine> {
    let (switch, rest) = m.split_once(": SXid (")?;
    if !switch.starts_with("nvidia-nvswitch") || switch.contains(' ') {
        return None;
    }
    let close = rest.find("):")?;
    let addr = &rest[..close];
    // As for Xid lines: a redacted address still leaves the SXid number to read.
    let pci = pci(addr.strip_prefix("PCI:").unwrap_or(addr));
    let after = rest[close + 2..].trim_start();
    let digits = after.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 10 {
        return None;
    }
    let sxid = after[..digits].parse().ok()?;
    let rest = after[digits..].strip_prefix(',')?.trim().to_string();
    let lower = rest.as_bytes();
    let starts =
        |w: &str| lower.len() >= w.len() && lower[..w.len()].eq_ignore_ascii_case(w.as_bytes());
    let fatal = if starts("non-fatal") || starts("nonfatal") {
        Some(false)
    } else if starts("fatal") {
        Some(true)
    } else {
        None
    };
    Some(SxidLine {
        switch: switch.to_string(),
        pci,
        sxid,
        fatal,
        rest,
    })
}

/// The AER classes the kernel names, longest first (so "Multiple ..." wins over its tail).
pub(super) const AER_CLASSES: &[&str] = &[
    "Multiple Uncorrected (Non-Fatal)",
    "Multiple Uncorrectable (Non-Fatal)",
    "Multiple Uncorrected (Fatal)",
    "Multiple Uncorrectable (Fatal)",
    "Multiple Correctable",
    "Multiple Corrected",
    "Uncorrected (Non-Fatal)",
    "Uncorrectable (Non-Fatal)",
    "Uncorrected (Fatal)",
    "Uncorrectable (Fatal)",
    "Correctable",
    "Corrected",
];

/// `pcieport|nvidia ADDRESS: [AER: ]TEXT`, read without regexes: AER lines come in bursts.
pub(super) fn parse_aer(m: &str) -> Option<AerLine> {
    let (driver, rest) = m.split_once(' ')?;
    if driver != "pcieport" && driver != "nvidia" {
        return None;
    }
    // The address holds two colons itself (`0000:16:01.0`); the third ends it.
    let mut fields = rest.splitn(4, ':');
    let (a, b, c) = (fields.next()?, fields.next()?, fields.next()?);
    let after = fields.next()?;
    let addr = &rest[..a.len() + b.len() + c.len() + 2];
    let reporter = pci(addr)?;
    let after = after.trim_start();
    let has_aer = after.starts_with("AER:");
    let text = after
        .strip_prefix("AER:")
        .unwrap_or(after)
        .trim()
        .to_string();
    // Without the `AER:` tag only the older kernels' "PCIe Bus Error" lines and their detail
    // lines are AER; "pcieport ...: PCI bridge to [bus 04-24]" is not.
    let older_kernel_line = text.starts_with("PCIe Bus Error")
        || text.starts_with("device [")
        || text.starts_with('[')
        || text.starts_with("device has no AER-aware driver")
        || text.starts_with("broadcast error_detected message");
    if !has_aer && !older_kernel_line {
        return None;
    }
    let (mut source, mut class) = (None, None);
    let received = text
        .find(" error received")
        .or_else(|| text.find(" error message received"));
    if let Some(i) = received {
        let before = &text[..i];
        if let Some(c) = AER_CLASSES.iter().find(|c| before.ends_with(*c)) {
            class = Some(normalise_class(c.trim_start_matches("Multiple ")));
            let tail = &text[i..];
            let tail = tail[tail.find("received").map_or(0, |j| j + "received".len())..]
                .trim_start_matches(':')
                .trim_start();
            let tail = tail.strip_prefix("from").unwrap_or(tail).trim_start();
            let tail = match tail.strip_prefix("id=") {
                // `id=00e5` names a requester id, not an address; an address may follow.
                Some(t) => t.split_once(' ').map_or("", |(_, r)| r).trim_start(),
                None => tail,
            };
            source = tail.split_whitespace().next().and_then(pci);
        }
    } else if let Some(i) = text.find("severity=") {
        let v = &text[i + "severity=".len()..];
        class = AER_CLASSES
            .iter()
            .find(|c| v.starts_with(*c))
            .map(|c| normalise_class(c));
    }
    let status = if text.starts_with("device recovery failed") {
        Some(AerStatus::RecoveryFailed)
    } else if text.contains("link has been reset") {
        Some(AerStatus::LinkReset)
    } else if text.starts_with("can't recover")
        || text.starts_with("device has no AER-aware driver")
    {
        Some(AerStatus::CantRecover)
    } else {
        None
    };
    Some(AerLine {
        reporter,
        driver: driver.to_string(),
        source,
        class,
        nvidia_device: text.contains("[10de:"),
        status,
        text,
    })
}

/// Newer kernels say "Correctable"/"Uncorrectable"; older ones "Corrected"/"Uncorrected".
pub(super) fn normalise_class(c: &str) -> String {
    c.replace("Correctable", "Corrected")
        .replace("Uncorrectable", "Uncorrected")
}
