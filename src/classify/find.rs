//! Substring search in one line.
//!
//! Why not `memmem::find`: it builds a searcher (a rare-byte ranking, a vector prefilter) at
//! every call, which on a line of a hundred bytes costs more than the search; the classifier
//! looks for a few fixed texts in every candidate line. Short haystacks are searched by the
//! needle's first byte (`memchr`) and a comparison at each hit; long ones (a saved line can be a
//! megabyte) by `memmem`, whose set-up their length pays for.

/// Haystacks up to this long are searched by first byte.
const SHORT: usize = 1024;

/// The first position of `needle` in `hay`.
#[inline]
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let Some((&first, rest)) = needle.split_first() else {
        return Some(0);
    };
    if hay.len() > SHORT {
        return memchr::memmem::find(hay, needle);
    }
    let last_start = hay.len().checked_sub(needle.len())?;
    let mut from = 0;
    while from <= last_start {
        let i = from + memchr::memchr(first, &hay[from..=last_start])?;
        if hay[i + 1..i + needle.len()] == *rest {
            return Some(i);
        }
        from = i + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::find;

    /// The same answers as `memmem` on short and long haystacks, needles at every place, near
    /// misses, the empty needle and needles longer than the haystack.
    #[test]
    fn finds_what_memmem_finds() {
        let mut rng = fastrand::Rng::with_seed(3);
        for len in [0, 1, 2, 5, 17, 100, 1023, 1024, 1025, 3000] {
            for _ in 0..60 {
                let hay: Vec<u8> = (0..len).map(|_| b"ab c"[rng.usize(..4)]).collect();
                for nlen in [0, 1, 2, 3, 5, 9] {
                    let needle: Vec<u8> = if len >= nlen && nlen > 0 && rng.bool() {
                        let at = rng.usize(..=len - nlen);
                        hay[at..at + nlen].to_vec()
                    } else {
                        (0..nlen).map(|_| b"ab c"[rng.usize(..4)]).collect()
                    };
                    assert_eq!(
                        find(&hay, &needle),
                        memchr::memmem::find(&hay, &needle),
                        "{hay:?} {needle:?}"
                    );
                }
            }
        }
    }
}
