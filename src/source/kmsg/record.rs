//! Parsing of one `/dev/kmsg` record (Linux `Documentation/ABI/testing/dev-kmsg`).
//!
//! A record is `PRIO,SEQ,TS_USEC,FLAGS[,more];MESSAGE\n` followed by continuation lines that start
//! with one space and carry `KEY=VALUE` context. Non-printable bytes and `\` are escaped as `\xNN`,
//! so a multi-line printk arrives as one record with `\x0a` inside. Pure: bytes in, value out.

use std::fmt;

/// One kernel log record, unescaped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KmsgRecord {
    /// Syslog facility; 0 is the kernel itself. Userspace writers get 1 (user) or higher, which is
    /// how an injected line is told from a real kernel line.
    pub facility: u32,
    /// Syslog level, 0 (emerg) to 7 (debug).
    pub level: u8,
    /// Sequence number, +1 per record for the whole boot; a gap means records were lost.
    pub seq: u64,
    /// Microseconds since boot (monotonic clock).
    pub ts_usec: u64,
    /// The flags field as printed (`-`, `c`, `+`).
    pub flags: char,
    /// The message with `\xNN` escapes undone; may hold several lines separated by `\n`.
    pub message: String,
    /// Continuation `KEY=VALUE` lines (`SUBSYSTEM=pci`, `DEVICE=+pci:0000:17:00.0`).
    pub fields: Vec<(String, String)>,
    /// The parser saw no escape in the message, so it holds no newline (a raw one ends the
    /// message; only an unescaped `\x0a` puts one there): [`KmsgRecord::lines`] then yields it
    /// whole without searching it. False unless the parser set it, so a record built otherwise is
    /// searched.
    pub plain: bool,
}

impl KmsgRecord {
    /// True when the kernel itself wrote the record.
    pub fn is_kernel(&self) -> bool {
        self.facility == 0
    }

    /// The message split into its lines (a multi-line printk has several), empty ones skipped.
    /// Split with the SIMD `memchr`, not `str::split`, whose byte search is the portable one:
    /// this runs once per record.
    pub fn lines(&self) -> impl Iterator<Item = &str> {
        let mut rest = Some(self.message.as_str());
        let plain = self.plain;
        std::iter::from_fn(move || loop {
            let r = rest?;
            // Most records are one line: the search of each for a newline it cannot hold held 5 %
            // of the samples of a profile of the daemon on bench/daemon_file.sh's GPU-host mix.
            let found = if plain {
                None
            } else {
                memchr::memchr(b'\n', r.as_bytes())
            };
            let (line, next) = match found {
                // A newline is one byte, so both sides are on character boundaries.
                Some(i) => (&r[..i], Some(&r[i + 1..])),
                None => (r, None),
            };
            rest = next;
            if !line.is_empty() {
                return Some(line);
            }
        })
    }

    /// A context field such as `DEVICE`.
    pub fn field(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a record was rejected. The reader counts these and goes on with the next record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordError {
    Empty,
    /// No `;` between the header and the message.
    NoMessage,
    /// The header has fewer than four comma-separated fields.
    ShortHeader,
    /// A header field is not what the ABI says it is.
    BadField {
        field: &'static str,
        value: String,
    },
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::Empty => f.write_str("empty record"),
            RecordError::NoMessage => {
                f.write_str("no ';' between header and message (torn record?)")
            }
            RecordError::ShortHeader => {
                f.write_str("header has fewer than 4 fields (PRIO,SEQ,TS_USEC,FLAGS)")
            }
            RecordError::BadField { field, value } => {
                write!(f, "bad {field} field {value:?}")
            }
        }
    }
}

impl std::error::Error for RecordError {}

/// Headers are short; anything longer is not a kmsg header and is not worth scanning further.
const MAX_HEADER: usize = 128;

/// Parses one record as returned by one `read()` of `/dev/kmsg`.
pub fn parse_record(buf: &[u8]) -> Result<KmsgRecord, RecordError> {
    let mut rec = KmsgRecord::default();
    parse_record_into(buf, &mut rec)?;
    Ok(rec)
}

/// [`parse_record`] into a record whose buffers are reused: the daemon's reader hands records to
/// the pipeline and gets them back, so that a record costs no allocation of its own (one per
/// record, allocated on the reader's thread and freed on the pipeline's, was a tenth of the
/// daemon's time). On an error `rec` holds nothing useful.
pub fn parse_record_into(buf: &[u8], rec: &mut KmsgRecord) -> Result<(), RecordError> {
    let buf = buf.strip_suffix(b"\n").unwrap_or(buf);
    if buf.is_empty() {
        return Err(RecordError::Empty);
    }
    let semi =
        memchr::memchr(b';', &buf[..buf.len().min(MAX_HEADER)]).ok_or(RecordError::NoMessage)?;
    let header = &buf[..semi];
    let rest = &buf[semi + 1..];

    let mut parts = header.split(|&b| b == b',');
    let prio = parts.next().ok_or(RecordError::ShortHeader)?;
    let seq = parts.next().ok_or(RecordError::ShortHeader)?;
    let ts = parts.next().ok_or(RecordError::ShortHeader)?;
    let flags = parts.next().ok_or(RecordError::ShortHeader)?;

    let prio: u32 = parse_decimal(prio).ok_or_else(|| bad("PRIO", prio))?;
    let seq = parse_decimal(seq).ok_or_else(|| bad("SEQ", seq))?;
    let ts_usec = parse_decimal(ts).ok_or_else(|| bad("TS_USEC", ts))?;
    let flags = match flags {
        [c] if c.is_ascii_graphic() => *c as char,
        [] => '-',
        _ => return Err(bad("FLAGS", flags)),
    };

    // The message ends at the first raw newline; what follows are ` KEY=VALUE` lines.
    let (msg, mut tail) = match memchr::memchr(b'\n', rest) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    rec.fields.clear();
    while !tail.is_empty() {
        let (line, next) = match memchr::memchr(b'\n', tail) {
            Some(i) => (&tail[..i], &tail[i + 1..]),
            None => (tail, &[][..]),
        };
        tail = next;
        if let Some(kv) = line.strip_prefix(b" ") {
            if let Some(eq) = memchr::memchr(b'=', kv) {
                rec.fields
                    .push((unescape(&kv[..eq]), unescape(&kv[eq + 1..])));
            }
        }
    }

    rec.facility = prio >> 3;
    rec.level = (prio & 7) as u8;
    rec.seq = seq;
    rec.ts_usec = ts_usec;
    rec.flags = flags;
    rec.plain = unescape_into(msg, &mut rec.message);
    Ok(())
}

fn bad(field: &'static str, value: &[u8]) -> RecordError {
    RecordError::BadField {
        field,
        value: String::from_utf8_lossy(&value[..value.len().min(32)]).into_owned(),
    }
}

/// A header number: ASCII digits only, none missing, no overflow. By hand rather than through
/// `str::parse`: three per record, on the daemon's hot path.
fn parse_decimal<T: TryFrom<u64>>(b: &[u8]) -> Option<T> {
    if b.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &c in b {
        if !c.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    T::try_from(n).ok()
}

/// Undoes the kernel's `\xNN` escaping, then decodes UTF-8 lossily. A `\x` not followed by two hex
/// digits is kept as written: tolerant, since the kernel never produces it but files might.
pub fn unescape(b: &[u8]) -> String {
    let mut s = String::new();
    unescape_into(b, &mut s);
    s
}

/// [`unescape`] into `out`, replacing what it held (its allocation is kept). True when `b` held
/// no escape: `out` is then `b` as text, with no byte `b` did not have.
pub fn unescape_into(b: &[u8], out: &mut String) -> bool {
    out.clear();
    if memchr::memchr(b'\\', b).is_none() {
        // Valid UTF-8 is the rule: the plain check is faster than the lossy decoder's chunks.
        match std::str::from_utf8(b) {
            Ok(s) => out.push_str(s),
            Err(_) => out.push_str(&String::from_utf8_lossy(b)),
        }
        return true;
    }
    let mut bytes = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1] == b'x' {
            if let (Some(h), Some(l)) = (hex(b[i + 2]), hex(b[i + 3])) {
                bytes.push(h << 4 | l);
                i += 4;
                continue;
            }
        }
        bytes.push(b[i]);
        i += 1;
    }
    out.push_str(&String::from_utf8_lossy(&bytes));
    false
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_record_holds_only_the_new_records_values() {
        let mut rec = parse_record(
            b"4,1187,9512238711,c;a much longer first message\x0a second line\n SUBSYSTEM=pci\n DEVICE=+pci:0000:17:00.0\n",
        )
        .unwrap();
        parse_record_into(b"6,1188,9512238712,-;short", &mut rec).unwrap();
        assert_eq!(rec, parse_record(b"6,1188,9512238712,-;short").unwrap());
        assert!(rec.fields.is_empty());
    }

    #[test]
    fn parses_header_message_and_fields() {
        let r = parse_record(
            b"4,1187,9512238711,-;NVRM: Xid (PCI:0000:17:00): 79, pid=2207, name=python3, GPU has fallen off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:17:00.0\n",
        )
        .unwrap();
        assert_eq!(
            (r.facility, r.level, r.seq, r.ts_usec, r.flags),
            (0, 4, 1187, 9512238711, '-')
        );
        assert!(r.is_kernel());
        assert!(r.message.starts_with("NVRM: Xid (PCI:0000:17:00): 79"));
        assert_eq!(r.field("SUBSYSTEM"), Some("pci"));
        assert_eq!(r.field("DEVICE"), Some("+pci:0000:17:00.0"));
    }

    #[test]
    fn unescapes_multi_line_records_and_backslashes() {
        let r = parse_record(
            b"3,42,100,-;NVRM: The NVIDIA GPU 0000:17:00.0\\x0aNVRM: (PCI ID: 10de:2330) installed in this system has\\x0aNVRM: fallen off the bus and is not responding to commands.\\x0a",
        )
        .unwrap();
        let lines: Vec<_> = r.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[2],
            "NVRM: fallen off the bus and is not responding to commands."
        );
        assert_eq!(unescape(b"a\\x5cb"), "a\\b");
        assert_eq!(unescape(b"bad \\xZZ and \\x4"), "bad \\xZZ and \\x4");
    }

    /// A record without escapes is one line and is marked so; an escaped newline, or a record
    /// not made by the parser, is split as before.
    #[test]
    fn only_a_record_without_escapes_is_taken_as_one_line_unsearched() {
        let r =
            parse_record(b"4,1,2,-;NVRM: Xid (PCI:0000:17:00): 79, GPU has fallen off the bus.")
                .unwrap();
        assert!(r.plain);
        assert_eq!(r.lines().count(), 1);
        let r = parse_record(b"4,1,2,-;first\\x0asecond \\x5c tail").unwrap();
        assert!(!r.plain);
        assert_eq!(r.lines().collect::<Vec<_>>(), ["first", "second \\ tail"]);
        let built = KmsgRecord {
            message: "one\ntwo".into(),
            ..KmsgRecord::default()
        };
        assert_eq!(built.lines().collect::<Vec<_>>(), ["one", "two"]);
    }

    #[test]
    fn lines_skip_empty_ones_and_keep_multibyte_text() {
        let r = parse_record("6,1,2,-;\\x0aé ok\\x0a\\x0a\\x0alast".as_bytes()).unwrap();
        assert_eq!(r.lines().collect::<Vec<_>>(), ["é ok", "last"]);
        let r = parse_record(b"6,1,2,-;").unwrap();
        assert_eq!(r.lines().count(), 0);
    }

    #[test]
    fn userspace_facility_and_extra_header_fields() {
        let r = parse_record(b"12,7,5,-,caller=T123;hello").unwrap();
        assert_eq!((r.facility, r.level), (1, 4));
        assert!(!r.is_kernel());
        assert_eq!(r.message, "hello");
    }

    #[test]
    fn rejects_torn_and_malformed_records() {
        assert_eq!(parse_record(b""), Err(RecordError::Empty));
        assert_eq!(parse_record(b"4,1187,9512"), Err(RecordError::NoMessage));
        assert_eq!(parse_record(b"4,1187;x"), Err(RecordError::ShortHeader));
        assert!(matches!(
            parse_record(b"x,1,2,-;m"),
            Err(RecordError::BadField { field: "PRIO", .. })
        ));
        assert!(matches!(
            parse_record(b"4,-1,2,-;m"),
            Err(RecordError::BadField { field: "SEQ", .. })
        ));
        assert!(matches!(
            parse_record(b"4,99999999999999999999999,2,-;m"),
            Err(RecordError::BadField { field: "SEQ", .. })
        ));
    }

    #[test]
    fn invalid_utf8_is_decoded_lossily() {
        let r = parse_record(b"4,1,2,-;NVRM: \xff\xfe bad").unwrap();
        assert!(r.message.starts_with("NVRM: "));
    }
}
