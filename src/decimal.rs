//! Decimal digits written two at a time, right to left, into a caller's buffer: the one writer
//! behind the numbers of `scan --json` and the kernel stamps every kernel log finding carries,
//! both written once per finding of a storm (half the divisions of a digit at a time, and no
//! formatting machinery).

/// The two ASCII digits of every value below 100, at twice the value.
const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
    2021222324252627282930313233343536373839\
    4041424344454647484950515253545556575859\
    6061626364656667686970717273747576777879\
    8081828384858687888990919293949596979899";

/// Writes `v` in decimal so that its last digit is `buf[end - 1]`, and returns where its first
/// digit is. `buf[..end]` must hold its digits (20 for any `u64`).
pub(crate) fn write_left_of(buf: &mut [u8], end: usize, mut v: u64) -> usize {
    let mut i = end;
    while v >= 100 {
        let d = (v % 100) as usize * 2;
        v /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[d..d + 2]);
    }
    if v >= 10 {
        let d = v as usize * 2;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[d..d + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + v as u8;
    }
    i
}

/// Writes `v` below 1,000,000 as exactly six digits, leading zeros kept, into `buf[..6]` (a
/// kernel stamp's microseconds).
pub(crate) fn write_six(buf: &mut [u8], mut v: u32) {
    for at in [4, 2, 0] {
        let d = (v % 100) as usize * 2;
        v /= 100;
        buf[at..at + 2].copy_from_slice(&PAIRS[d..d + 2]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_read_as_rust_formats_them() {
        for v in [
            0,
            1,
            9,
            10,
            99,
            100,
            101,
            999,
            1_000,
            65_535,
            4_294_967_296,
            u64::MAX,
        ] {
            let mut buf = [b'x'; 24];
            let start = write_left_of(&mut buf, 22, v);
            assert_eq!(&buf[start..22], v.to_string().as_bytes());
            assert!(buf[..start].iter().all(|&b| b == b'x') && buf[22..] == *b"xx");
        }
        for v in [0, 7, 42, 999_999, 100_000, 12_345] {
            let mut buf = [b'x'; 7];
            write_six(&mut buf, v);
            assert_eq!(&buf[..6], format!("{v:06}").as_bytes());
            assert_eq!(buf[6], b'x');
        }
    }
}
