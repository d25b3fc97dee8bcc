//! Program and file output as evidence text: never longer than the bytes it came from, and
//! unable to drive a terminal.

/// Bytes to text of at most the same length: invalid UTF-8 and control characters become `?`
/// (NUL, the separator in /proc cmdline files, a space), so output can neither grow past its cap
/// nor drive a terminal.
pub(super) fn decode(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        s.push_str(&sanitize(chunk.valid()));
        s.extend(std::iter::repeat_n('?', chunk.invalid().len()));
    }
    s
}

/// Control characters other than newline and tab become `?` (NUL a space).
pub fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' | '\t' => c,
            '\0' => ' ',
            c if c.is_control() => '?',
            c => c,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_keeps_length_and_neutralises() {
        let b = b"ok\n\x1b[2J\x00arg\xff\xfe\tend";
        let s = decode(b);
        assert_eq!(s, "ok\n?[2J arg??\tend");
        assert!(s.len() <= b.len());
        // A multi-byte character cut by the cap.
        let cut = &"é".as_bytes()[..1];
        assert_eq!(decode(cut), "?");
    }
}
