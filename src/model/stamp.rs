//! [`Stamp`]: a line's timestamp text, held inline.

use serde::{Serialize, Serializer};
use std::fmt;
use std::ops::Deref;

/// Bytes a stamp holds without the heap: every format the readers know fits (`[ 9512.238711]`,
/// `Nov 29 08:14:03`, `2024-11-29T08:14:03.123456+00:00`), with room for a zone name.
const INLINE: usize = 38;

/// The timestamp text a line carried (`[ 9512.238711]`, `Nov 29 08:14:03`, ...), verbatim.
///
/// Every finding and every line it is read from carries one: as a heap string, the copy into
/// each finding was an allocation and a free for every line of an Xid storm. A longer text (a
/// locale's wordy date) goes to the heap, as before.
#[derive(Clone, PartialEq, Eq)]
pub struct Stamp(Repr);

#[derive(Clone, PartialEq, Eq)]
enum Repr {
    Inline { len: u8, buf: [u8; INLINE] },
    Heap(Box<str>),
}

impl Stamp {
    pub fn new(text: &str) -> Stamp {
        if text.len() <= INLINE {
            let mut buf = [0u8; INLINE];
            buf[..text.len()].copy_from_slice(text.as_bytes());
            Stamp(Repr::Inline {
                len: text.len() as u8,
                buf,
            })
        } else {
            Stamp(Repr::Heap(text.into()))
        }
    }

    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Copied whole from a `&str`, so valid UTF-8; checked rather than assumed (a few
            // dozen bytes, read only when a finding is written out).
            Repr::Inline { len, buf } => {
                std::str::from_utf8(&buf[..usize::from(*len)]).unwrap_or("")
            }
            Repr::Heap(s) => s,
        }
    }

    /// The text's bytes, without [`Stamp::as_str`]'s check: they were copied from a `&str`, so
    /// they are UTF-8. For writers that handle bytes (the JSON writer of a storm's findings).
    pub fn utf8_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, buf } => &buf[..usize::from(*len)],
            Repr::Heap(s) => s.as_bytes(),
        }
    }
}

impl Default for Stamp {
    fn default() -> Self {
        Stamp::new("")
    }
}

impl Deref for Stamp {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for Stamp {
    fn from(s: &str) -> Stamp {
        Stamp::new(s)
    }
}

impl PartialEq<str> for Stamp {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Stamp {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Debug for Stamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Stamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Stamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_gives_back_its_text_inline_or_not() {
        for t in [
            "",
            "[ 9512.238711]",
            "Nov 29 08:14:03",
            "2024-11-29T08:14:03.123456+00:00",
            "ß€😀 wide bytes at the end of the inline room ééé",
            &"x".repeat(INLINE),
            &"y".repeat(INLINE + 1),
            &"月".repeat(40),
        ] {
            let s = Stamp::new(t);
            assert_eq!(s.as_str(), t);
            assert_eq!(s.utf8_bytes(), t.as_bytes());
            assert_eq!(s, t);
            assert_eq!(
                serde_json::to_string(&s).ok(),
                serde_json::to_string(t).ok()
            );
            assert_eq!(format!("{s}"), t);
            assert_eq!(format!("{s:?}"), format!("{t:?}"));
        }
        assert!(matches!(
            Stamp::new(&"x".repeat(INLINE)).0,
            Repr::Inline { .. }
        ));
        assert!(matches!(
            Stamp::new(&"x".repeat(INLINE + 1)).0,
            Repr::Heap(_)
        ));
    }
}
