//! `scan --json`'s writer: one JSON object per finding, written field by field into a line
//! buffer that the caller hands to its output in one write. No per-finding allocation once the
//! buffer has grown, and strings are escaped eight bytes at a time: a storm log is mostly
//! findings, and a general serializer spent most of its time there. Appending to a `Vec` rather
//! than to the `BufWriter` lets the fixed keys compile to plain stores: through the writer every
//! piece was a call into `memcpy` with its length unknown (a tenth of a storm scan's time).
//!
//! The object is the same as serializing the finding's contract fields with serde (a test checks
//! it byte for byte).

use crate::model::{Detail, Finding, GpuIdentity};

/// Appends `f` as one line of JSON (with its newline) to `out`.
#[cfg(test)]
pub fn write_finding(out: &mut Vec<u8>, file: &str, f: &Finding) {
    let mut name = Vec::new();
    string(&mut name, file);
    write_finding_from(out, &name, f);
}

/// [`write_finding`] with the file name already written as a JSON string: it is the same for
/// every finding of an input, so `scan` escapes it once.
pub fn write_finding_from(out: &mut Vec<u8>, file_json: &[u8], f: &Finding) {
    // Room for the fixed keys and the common strings, so the pieces below rarely reallocate.
    out.reserve(
        256 + file_json.len()
            + f.title.len()
            + f.message.len()
            + f.origin.raw.iter().map(String::len).sum::<usize>(),
    );
    out.extend_from_slice(b"{\"file\":");
    out.extend_from_slice(file_json);
    out.extend_from_slice(b",\"kind\":\"");
    out.extend_from_slice(f.kind.as_str().as_bytes());
    out.extend_from_slice(b"\",\"xid\":");
    opt_u64(out, f.xid.map(u64::from));
    out.extend_from_slice(b",\"pci\":");
    match f.pci {
        Some(p) => pci(out, p),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"pid\":");
    opt_u64(out, f.pid.map(u64::from));
    out.extend_from_slice(b",\"process\":");
    match &f.process {
        Some(p) => string(out, p),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"severity\":\"");
    out.extend_from_slice(f.severity.as_str().as_bytes());
    out.extend_from_slice(b"\",\"category\":\"");
    out.extend_from_slice(f.category.as_str().as_bytes());
    out.extend_from_slice(b"\",\"title\":");
    string(out, &f.title);
    out.extend_from_slice(b",\"line\":");
    u64_(out, f.origin.line);
    out.extend_from_slice(b",\"lines\":");
    u64_(out, u64::from(f.origin.lines));
    out.extend_from_slice(b",\"message\":");
    string(out, &f.message);
    if let Some(c) = f.caused_by {
        out.extend_from_slice(b",\"caused_by\":");
        u64_(out, u64::from(c));
    }
    if let Some(t) = &f.origin.timestamp {
        out.extend_from_slice(b",\"timestamp\":");
        quoted(out, t.utf8_bytes());
    }
    if let Some(t) = f.origin.ts_usec {
        out.extend_from_slice(b",\"ts_usec\":");
        u64_(out, t);
    }
    if let Some(s) = f.origin.seq {
        out.extend_from_slice(b",\"seq\":");
        u64_(out, s);
    }
    if !f.gpu.is_empty() {
        out.extend_from_slice(b",\"gpu\":");
        gpu(out, &f.gpu);
    }
    if let Some(d) = &f.detail {
        out.extend_from_slice(b",\"detail\":");
        detail(out, d);
    }
    if let Some(s) = f.shape {
        out.extend_from_slice(b",\"shape\":");
        string(out, s);
    }
    if let Some(m) = &f.module {
        out.extend_from_slice(b",\"module\":");
        string(out, m);
    }
    out.extend_from_slice(b",\"raw\":[");
    for (i, r) in f.origin.raw.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        string(out, r);
    }
    out.extend_from_slice(b"]}\n");
}

/// A finding's detail. The Xid 13 location (a quarter of a storm's findings) is written here;
/// the other, rarer and nested kinds by serde, into the same buffer.
fn detail(out: &mut Vec<u8>, d: &Detail) {
    match d {
        Detail::GraphicsException { gpc, tpc, sm } => {
            out.extend_from_slice(b"{\"type\":\"graphics_exception\",\"gpc\":");
            u64_(out, u64::from(*gpc));
            out.extend_from_slice(b",\"tpc\":");
            u64_(out, u64::from(*tpc));
            out.extend_from_slice(b",\"sm\":");
            u64_(out, u64::from(*sm));
            out.push(b'}');
        }
        d => {
            // Writing into a `Vec` cannot fail, and every detail serializes (plain data, string
            // keys); should that ever change, the detail is `null` rather than half an object.
            let at = out.len();
            if serde_json::to_writer(&mut *out, d).is_err() {
                out.truncate(at);
                out.extend_from_slice(b"null");
            }
        }
    }
}

fn gpu(out: &mut Vec<u8>, g: &GpuIdentity) {
    let mut first = true;
    let mut key = |out: &mut Vec<u8>, k: &[u8]| {
        out.push(if first { b'{' } else { b',' });
        first = false;
        out.extend_from_slice(k);
    };
    if let Some(i) = g.index {
        key(out, b"\"index\":");
        u64_(out, u64::from(i));
    }
    for (k, v) in [
        (&b"\"uuid\":"[..], &g.uuid),
        (b"\"serial\":", &g.serial),
        (b"\"name\":", &g.name),
    ] {
        if let Some(v) = v {
            key(out, k);
            string(out, v);
        }
    }
    out.push(b'}');
}

/// `"dddd:bb:dd.f"`, as `PciAddress`'s `Display` writes it, without the formatting machinery.
fn pci(out: &mut Vec<u8>, p: crate::model::PciAddress) {
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
    out.extend_from_slice(&buf[..n + 3]);
}

fn opt_u64(out: &mut Vec<u8>, v: Option<u64>) {
    match v {
        Some(v) => u64_(out, v),
        None => out.extend_from_slice(b"null"),
    }
}

/// Writes `v` in decimal. The digits go left-aligned into a 20-byte block that is appended whole,
/// then cut back to the digits: a copy of a length the compiler knows is a few stores, where
/// appending the digits alone was a call into `memcpy` for every number, five or six per finding
/// of a storm.
fn u64_(out: &mut Vec<u8>, v: u64) {
    let digits = v.checked_ilog10().map_or(1, |l| l as usize + 1);
    let mut buf = [0u8; 20];
    crate::decimal::write_left_of(&mut buf, digits, v);
    let at = out.len();
    out.extend_from_slice(&buf);
    out.truncate(at + digits);
}

/// How many leading bytes of `b` need no escaping: sixteen bytes a step with SSE2 (every x86-64
/// CPU has it), where the word-wise test took eight and a dozen operations. The last partial
/// block is tested as the string's last sixteen bytes (its head was tested already), and a
/// string under sixteen bytes as its first and last eight, so no string ends in a byte loop,
/// which was most of the time on a finding's short strings (process, title, timestamp); copying
/// the tail into a padded block instead made every string wait on a store's forwarding. The
/// strings of a finding were a storm scan's largest single cost after reading.
#[cfg(target_arch = "x86_64")]
fn clean_prefix(b: &[u8]) -> usize {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };
    let n = b.len();
    // SAFETY: SSE2 is part of x86-64; every load reads the 16 bytes at `at`, and every `at` is
    // at most `n - 16`, so they lie inside `b`; unaligned loads are allowed.
    let mask_at = |at: usize| unsafe {
        let v = _mm_loadu_si128(b.as_ptr().add(at).cast::<__m128i>());
        // A byte is at most 0x1f where its unsigned minimum with 0x1f is the byte itself.
        let low = _mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(0x1f)), v);
        let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
        let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
        _mm_movemask_epi8(_mm_or_si128(low, _mm_or_si128(quote, backslash))) as u32
    };
    if n < 16 {
        if n >= 8 {
            let word = |at: usize| {
                let mut w = [0u8; 8];
                w.copy_from_slice(&b[at..at + 8]);
                u64::from_le_bytes(w)
            };
            if !needs_escape(word(0)) && !needs_escape(word(n - 8)) {
                return n;
            }
        }
        return b
            .iter()
            .position(|&c| matches!(c, 0..=0x1f | b'"' | b'\\'))
            .unwrap_or(n);
    }
    let mut i = 0;
    while i + 16 <= n {
        let m = mask_at(i);
        if m != 0 {
            return i + m.trailing_zeros() as usize;
        }
        i += 16;
    }
    if i < n {
        // The last sixteen bytes: those before `i` are clean, so a hit lies at or after it.
        let m = mask_at(n - 16);
        if m != 0 {
            return n - 16 + m.trailing_zeros() as usize;
        }
    }
    n
}

/// [`clean_prefix`] eight bytes at a time, where the CPU is not x86-64.
#[cfg(not(target_arch = "x86_64"))]
fn clean_prefix(b: &[u8]) -> usize {
    let mut clean = 0;
    while clean + 8 <= b.len() {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[clean..clean + 8]);
        if needs_escape(u64::from_le_bytes(w)) {
            break;
        }
        clean += 8;
    }
    clean
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
pub fn string(out: &mut Vec<u8>, s: &str) {
    quoted(out, s.as_bytes());
}

/// [`string`] for text held as the bytes of a `str` (a [`Stamp`](crate::model::Stamp), whose
/// check that its inline bytes are UTF-8 was a tenth of the cost of writing a storm finding's
/// stamp). `b` must be UTF-8; only ASCII bytes are ever escaped, so the output is too.
fn quoted(out: &mut Vec<u8>, b: &[u8]) {
    let mut clean = clean_prefix(b);
    while clean < b.len() && !matches!(b[clean], 0..=0x1f | b'"' | b'\\') {
        clean += 1;
    }
    out.reserve(clean + 2);
    out.push(b'"');
    out.extend_from_slice(&b[..clean]);
    if clean < b.len() {
        escaped(out, &b[clean..]);
    }
    out.push(b'"');
}

fn escaped(out: &mut Vec<u8>, b: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
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
                out.extend_from_slice(&b[start..i]);
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(c >> 4)]);
                out.push(HEX[usize::from(c & 0xf)]);
                start = i + 1;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&b[start..i]);
        out.extend_from_slice(esc);
        start = i + 1;
    }
    out.extend_from_slice(&b[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block test stops at the first byte that needs escaping, for every byte value at every
    /// place of a block, across block edges and in the last partial block.
    #[test]
    fn the_clean_prefix_stops_where_escaping_starts() {
        let needs = |c: u8| matches!(c, 0..=0x1f | b'"' | b'\\');
        for len in [0usize, 1, 15, 16, 17, 31, 32, 33, 64, 100] {
            for at in 0..len.max(1) {
                for c in 0..=255u8 {
                    let mut b = vec![b'a'; len];
                    if len > 0 {
                        b[at] = c;
                    }
                    let got = clean_prefix(&b);
                    let first = b.iter().position(|&x| needs(x)).unwrap_or(len);
                    // At most the first such byte; exactly it where whole blocks are tested.
                    if cfg!(target_arch = "x86_64") {
                        assert_eq!(got, first, "len {len}, byte {c:#x} at {at}");
                    } else {
                        assert_eq!(
                            got,
                            first.min(len / 8 * 8),
                            "len {len}, byte {c:#x} at {at}"
                        );
                    }
                }
            }
        }
        for w in 0..=255u8 {
            let x = u64::from_le_bytes([b'a', b'a', w, b'a', b'a', b'a', b'a', b'a']);
            assert_eq!(needs_escape(x), needs(w), "{w:#x}");
        }
    }

    /// Every digit count, its edges, and text already in the buffer kept.
    #[test]
    fn numbers_print_like_display() {
        let mut values = vec![0u64, u64::MAX];
        for p in 0..20 {
            let t = 10u64.pow(p);
            values.extend([t - 1, t, t + 1]);
        }
        for v in values {
            let mut mine = b"x".to_vec();
            u64_(&mut mine, v);
            assert_eq!(String::from_utf8(mine).unwrap(), format!("x{v}"));
        }
    }

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
            pci(&mut mine, p);
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
            string(&mut mine, s);
            assert_eq!(
                String::from_utf8(mine).unwrap(),
                serde_json::to_string(s).unwrap(),
                "{s:?}"
            );
        }
    }
}
