//! `scan --json`'s writer: one JSON object per finding, written field by field straight into the
//! output buffer. No per-finding allocation, and strings are escaped eight bytes at a time: a
//! storm log is mostly findings, and a general serializer spent most of its time there.
//!
//! The object is the same as serializing the finding's contract fields with serde (a test checks
//! it byte for byte).

use std::io::{self, Write};

use crate::model::{Finding, GpuIdentity};

/// Writes `f` as one line of JSON.
pub fn write_finding<W: Write>(out: &mut W, file: &str, f: &Finding) -> io::Result<()> {
    out.write_all(b"{\"file\":")?;
    string(out, file)?;
    out.write_all(b",\"kind\":\"")?;
    out.write_all(f.kind.as_str().as_bytes())?;
    out.write_all(b"\",\"xid\":")?;
    opt_u64(out, f.xid.map(u64::from))?;
    out.write_all(b",\"pci\":")?;
    match f.pci {
        Some(p) => pci(out, p)?,
        None => out.write_all(b"null")?,
    }
    out.write_all(b",\"pid\":")?;
    opt_u64(out, f.pid.map(u64::from))?;
    out.write_all(b",\"process\":")?;
    match &f.process {
        Some(p) => string(out, p)?,
        None => out.write_all(b"null")?,
    }
    out.write_all(b",\"severity\":\"")?;
    out.write_all(f.severity.as_str().as_bytes())?;
    out.write_all(b"\",\"category\":\"")?;
    out.write_all(f.category.as_str().as_bytes())?;
    out.write_all(b"\",\"title\":")?;
    string(out, &f.title)?;
    out.write_all(b",\"line\":")?;
    u64_(out, f.origin.line)?;
    out.write_all(b",\"lines\":")?;
    u64_(out, u64::from(f.origin.lines))?;
    out.write_all(b",\"message\":")?;
    string(out, &f.message)?;
    if let Some(c) = f.caused_by {
        out.write_all(b",\"caused_by\":")?;
        u64_(out, u64::from(c))?;
    }
    if let Some(t) = &f.origin.timestamp {
        out.write_all(b",\"timestamp\":")?;
        string(out, t)?;
    }
    if let Some(t) = f.origin.ts_usec {
        out.write_all(b",\"ts_usec\":")?;
        u64_(out, t)?;
    }
    if let Some(s) = f.origin.seq {
        out.write_all(b",\"seq\":")?;
        u64_(out, s)?;
    }
    if !f.gpu.is_empty() {
        out.write_all(b",\"gpu\":")?;
        gpu(out, &f.gpu)?;
    }
    if let Some(d) = &f.detail {
        // Rare and nested: serde writes it (into the same buffer, no allocation of its own).
        out.write_all(b",\"detail\":")?;
        serde_json::to_writer(&mut *out, d).map_err(io::Error::from)?;
    }
    if let Some(s) = f.shape {
        out.write_all(b",\"shape\":")?;
        string(out, s)?;
    }
    if let Some(m) = &f.module {
        out.write_all(b",\"module\":")?;
        string(out, m)?;
    }
    out.write_all(b",\"raw\":[")?;
    for (i, r) in f.origin.raw.iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        string(out, r)?;
    }
    out.write_all(b"]}\n")
}

fn gpu<W: Write>(out: &mut W, g: &GpuIdentity) -> io::Result<()> {
    let mut first = true;
    let mut key = |out: &mut W, k: &[u8]| -> io::Result<()> {
        out.write_all(if first { b"{" } else { b"," })?;
        first = false;
        out.write_all(k)
    };
    if let Some(i) = g.index {
        key(out, b"\"index\":")?;
        u64_(out, u64::from(i))?;
    }
    for (k, v) in [
        (&b"\"uuid\":"[..], &g.uuid),
        (b"\"serial\":", &g.serial),
        (b"\"name\":", &g.name),
    ] {
        if let Some(v) = v {
            key(out, k)?;
            string(out, v)?;
        }
    }
    out.write_all(b"}")
}

/// `"dddd:bb:dd.f"`, as `PciAddress`'s `Display` writes it, without the formatting machinery.
fn pci<W: Write>(out: &mut W, p: crate::model::PciAddress) -> io::Result<()> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 24];
    let mut n = 0;
    buf[n] = b'"';
    n += 1;
    let d = p.domain();
    let digits = (8 - d.leading_zeros() as usize / 4).max(4);
    for i in (0..digits).rev() {
        buf[n] = HEX[((d >> (i * 4)) & 0xf) as usize];
        n += 1;
    }
    for (sep, v) in [(b':', p.bus()), (b':', p.device())] {
        buf[n] = sep;
        buf[n + 1] = HEX[usize::from(v >> 4)];
        buf[n + 2] = HEX[usize::from(v & 0xf)];
        n += 3;
    }
    buf[n] = b'.';
    buf[n + 1] = HEX[usize::from(p.function() & 0xf)];
    buf[n + 2] = b'"';
    out.write_all(&buf[..n + 3])
}

fn opt_u64<W: Write>(out: &mut W, v: Option<u64>) -> io::Result<()> {
    match v {
        Some(v) => u64_(out, v),
        None => out.write_all(b"null"),
    }
}

fn u64_<W: Write>(out: &mut W, mut v: u64) -> io::Result<()> {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.write_all(&buf[i..])
}

/// Whether any of the 8 bytes needs escaping: below 0x20, `"` or `\`.
#[inline]
fn needs_escape(x: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let below_20 = x.wrapping_sub(ONES * 0x20) & !x & HIGH;
    below_20 | zero(x ^ (ONES * b'"' as u64)) | zero(x ^ (ONES * b'\\' as u64)) != 0
}

/// A JSON string; the common case (nothing to escape) is one copy.
pub fn string<W: Write>(out: &mut W, s: &str) -> io::Result<()> {
    let b = s.as_bytes();
    let mut clean = 0;
    while clean + 8 <= b.len() {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[clean..clean + 8]);
        if needs_escape(u64::from_le_bytes(w)) {
            break;
        }
        clean += 8;
    }
    while clean < b.len() && !matches!(b[clean], 0..=0x1f | b'"' | b'\\') {
        clean += 1;
    }
    out.write_all(b"\"")?;
    out.write_all(&b[..clean])?;
    if clean < b.len() {
        escaped(out, &s[clean..])?;
    }
    out.write_all(b"\"")
}

fn escaped<W: Write>(out: &mut W, s: &str) -> io::Result<()> {
    let b = s.as_bytes();
    let mut start = 0;
    for (i, &c) in b.iter().enumerate() {
        let esc: &[u8] = match c {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => {
                out.write_all(&b[start..i])?;
                write!(out, "\\u{c:04x}")?;
                start = i + 1;
                continue;
            }
            _ => continue,
        };
        out.write_all(&b[start..i])?;
        out.write_all(esc)?;
        start = i + 1;
    }
    out.write_all(&b[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_print_like_display() {
        for a in [
            "0000:17:00.0",
            "4a7f1:00:00.0",
            "ffffffff:ff:1f.7",
            "0:0:0.0",
        ] {
            let p: crate::model::PciAddress = a.parse().unwrap();
            let mut mine = Vec::new();
            pci(&mut mine, p).unwrap();
            assert_eq!(String::from_utf8(mine).unwrap(), format!("\"{p}\""));
        }
    }

    #[test]
    fn strings_escape_like_serde() {
        for s in [
            "",
            "plain ascii text that is longer than eight bytes",
            "quote \" and backslash \\ in the middle of a long line",
            "ctl \u{1} \u{1f} \t\n\r \u{8} \u{c} end",
            "unicode ‘quotes’ and é, 0x7f \u{7f}",
            "\"",
            "12345678\"",
        ] {
            let mut mine = Vec::new();
            string(&mut mine, s).unwrap();
            assert_eq!(
                String::from_utf8(mine).unwrap(),
                serde_json::to_string(s).unwrap(),
                "{s:?}"
            );
        }
    }
}
