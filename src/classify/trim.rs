//! `str::trim` and its kin with the common case first: a classified line's pieces mostly start
//! and end with a visible ASCII byte, or with a few ASCII spaces, and the standard trims decode
//! and test a character at each end to find that out (three calls per Xid line, a twentieth of a
//! storm scan's instructions). Any other edge goes to the standard trim, so the answers are the
//! standard ones (a test compares them), Unicode whitespace included.

/// `s.trim_start()`.
#[inline]
pub fn start(s: &str) -> &str {
    let b = s.as_bytes();
    let spaces = b.iter().take_while(|&&c| c == b' ').count();
    match b.get(spaces) {
        None => "",
        Some(c) if c.is_ascii_graphic() => &s[spaces..],
        Some(_) => s[spaces..].trim_start(),
    }
}

/// `s.trim_end()`.
#[inline]
pub fn end(s: &str) -> &str {
    match s.as_bytes().last() {
        Some(c) if c.is_ascii_graphic() => s,
        _ => s.trim_end(),
    }
}

/// `s.trim_start_matches(' ')`: leading ASCII spaces only, by bytes (the character-pattern
/// search went through the general machinery).
#[inline]
pub fn spaces(s: &str) -> &str {
    &s[s.bytes().take_while(|&c| c == b' ').count()..]
}

/// `s.trim()`.
#[inline]
pub fn both(s: &str) -> &str {
    end(start(s))
}

/// The first `n` characters of `s` (all of it when it is shorter), cut at a character boundary:
/// a title's slot, a prefix shown to people, a line quoted in the daemon's log.
#[inline]
pub fn chars(s: &str, n: usize) -> &str {
    s.char_indices().nth(n).map_or(s, |(at, _)| &s[..at])
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_first_characters_are_cut_at_a_character() {
        assert_eq!(super::chars("héllo", 2), "hé");
        assert_eq!(super::chars("héllo", 5), "héllo");
        assert_eq!(super::chars("héllo", 9), "héllo");
        assert_eq!(super::chars("😀😀", 1), "😀");
        assert_eq!(super::chars("", 3), "");
    }

    /// The same answers as the standard trims on strings of spaces, tabs, Unicode whitespace
    /// (no-break and ideographic spaces, the line separator), visible ASCII and other characters,
    /// at either end and alone.
    #[test]
    fn trims_answer_as_the_standard_ones() {
        let parts = [
            "", " ", "  ", "\t", "\n", "\r", "\u{a0}", "\u{3000}", "\u{2028}", "a", "Z9", "é",
            "‘q’", "x y", "\u{7f}", "\0",
        ];
        for a in parts {
            for b in parts {
                for c in parts {
                    let s = format!("{a}{b}{c}");
                    assert_eq!(super::start(&s), s.trim_start(), "{s:?}");
                    assert_eq!(super::end(&s), s.trim_end(), "{s:?}");
                    assert_eq!(super::both(&s), s.trim(), "{s:?}");
                    assert_eq!(super::spaces(&s), s.trim_start_matches(' '), "{s:?}");
                }
            }
        }
    }
}
