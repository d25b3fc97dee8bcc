//! PCI addresses, parsed once at the edge and compared numerically.
//!
//! The kernel prints `0000:17:00` or `0000:17:00.0`, NVML prints `00000000:17:00.0`, Azure VMs show
//! long domains such as `4a7f1:00:00.0` and GB200 shows `0008:01:00`. Comparing strings would make
//! these different GPUs; comparing numbers makes them the same.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

/// A PCI function address: domain, bus, device, function.
///
/// Only ever built by [`PciAddress::parse`] (or from already numeric values), so a value of this
/// type is safe to place on a command line: it renders as `dddd:bb:dd.f` and nothing else.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PciAddress {
    domain: u32,
    bus: u8,
    device: u8,
    function: u8,
}

/// Why a PCI address did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a PCI address (expected DOMAIN:BUS:DEVICE[.FUNCTION] in hex): {0:?}")]
pub struct PciParseError(pub String);

impl PciAddress {
    /// Builds an address from numbers; `device` must be below 32 and `function` below 8.
    pub fn new(domain: u32, bus: u8, device: u8, function: u8) -> Option<Self> {
        (device < 32 && function < 8).then_some(PciAddress {
            domain,
            bus,
            device,
            function,
        })
    }

    /// Parses `[PCI:]DOMAIN:BUS:DEVICE[.FUNCTION]` or `BUS:DEVICE.FUNCTION` (domain 0), in hex.
    ///
    /// The domain may have any width from 1 to 8 hex digits; a missing function means 0, as the
    /// driver's `Xid (PCI:0000:17:00)` form always names function 0.
    pub fn parse(text: &str) -> Result<Self, PciParseError> {
        // Byte compares, not `strip_prefix`: this is built for size, where a compare with a
        // string is a call to `memcmp`.
        let s = match text.as_bytes() {
            [b'P', b'C', b'I', b':', ..] => &text[4..],
            _ => text,
        };
        if let Some(p) = Self::parse_usual(s.as_bytes()) {
            return Ok(p);
        }
        Self::parse_any(text, s)
    }

    /// The form the driver and NVML print, `DOMAIN:BB:DD[.F]` with a two-digit bus and device,
    /// read byte by byte: every Xid line names one, and the general reader below (splits,
    /// radix parsing) was a twentieth of a storm scan. `None` for any other form, which the
    /// general reader then reads (or refuses) as before; for this form both give the same.
    fn parse_usual(b: &[u8]) -> Option<Self> {
        fn hex(c: u8) -> Option<u32> {
            char::from(c).to_digit(16)
        }
        let colon = b.iter().position(|&c| c == b':')?;
        if colon == 0 || colon > 8 {
            return None;
        }
        let mut domain = 0u32;
        for &c in &b[..colon] {
            domain = domain << 4 | hex(c)?;
        }
        let r = &b[colon..];
        let (bus, device, function) = match *r {
            [b':', b1, b2, b':', d1, d2] => (hex(b1)? << 4 | hex(b2)?, hex(d1)? << 4 | hex(d2)?, 0),
            [b':', b1, b2, b':', d1, d2, b'.', f] => {
                (hex(b1)? << 4 | hex(b2)?, hex(d1)? << 4 | hex(d2)?, hex(f)?)
            }
            _ => return None,
        };
        // Each below 0x100 (two hex digits), function below 0x10 (one).
        PciAddress::new(domain, bus as u8, device as u8, function as u8)
    }

    /// Every accepted form; `s` is `text` without its `PCI:`.
    fn parse_any(text: &str, s: &str) -> Result<Self, PciParseError> {
        let err = || PciParseError(text.chars().take(64).collect());
        let (head, function) = match s.rsplit_once('.') {
            Some((head, f)) => (head, parse_hex_u8(f, 1).ok_or_else(err)?),
            None => (s, 0),
        };
        let mut parts = head.split(':');
        let a = parts.next().ok_or_else(err)?;
        let b = parts.next().ok_or_else(err)?;
        let c = parts.next();
        if parts.next().is_some() {
            return Err(err());
        }
        let (domain, bus, device) = match c {
            Some(c) => {
                if a.is_empty() || a.len() > 8 || !a.bytes().all(|x| x.is_ascii_hexdigit()) {
                    return Err(err());
                }
                let domain = u32::from_str_radix(a, 16).map_err(|_| err())?;
                (
                    domain,
                    parse_hex_u8(b, 2).ok_or_else(err)?,
                    parse_hex_u8(c, 2).ok_or_else(err)?,
                )
            }
            None => (
                0,
                parse_hex_u8(a, 2).ok_or_else(err)?,
                parse_hex_u8(b, 2).ok_or_else(err)?,
            ),
        };
        PciAddress::new(domain, bus, device, function).ok_or_else(err)
    }

    pub fn domain(&self) -> u32 {
        self.domain
    }
    pub fn bus(&self) -> u8 {
        self.bus
    }
    pub fn device(&self) -> u8 {
        self.device
    }
    pub fn function(&self) -> u8 {
        self.function
    }

    /// The same slot with function 0: the GPU itself, when a line names its audio function.
    pub fn with_function(&self, function: u8) -> Option<Self> {
        PciAddress::new(self.domain, self.bus, self.device, function)
    }
}

fn parse_hex_u8(s: &str, max_len: usize) -> Option<u8> {
    if s.is_empty() || s.len() > max_len || !s.bytes().all(|x| x.is_ascii_hexdigit()) {
        return None;
    }
    u8::from_str_radix(s, 16).ok()
}

/// One hash of the packed address rather than one per field: the classifier keeps a set of the
/// GPUs it has seen and looks every Xid line's address up in it. Equal addresses pack equally,
/// as `Eq` (derived, field by field) requires.
impl std::hash::Hash for PciAddress {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        h.write_u64(
            u64::from(self.domain) << 24
                | u64::from(self.bus) << 16
                | u64::from(self.device) << 8
                | u64::from(self.function),
        );
    }
}

impl fmt::Display for PciAddress {
    /// `dddd:bb:dd.f`; domains wider than four digits keep their width (`4a7f1:00:00.0`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl fmt::Debug for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PciAddress({self})")
    }
}

impl FromStr for PciAddress {
    type Err = PciParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PciAddress::parse(s)
    }
}

impl Serialize for PciAddress {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for PciAddress {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        PciAddress::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_every_width() {
        for (input, want) in [
            ("0000:17:00", "0000:17:00.0"),
            ("PCI:0000:17:00", "0000:17:00.0"),
            ("00000000:17:00.0", "0000:17:00.0"),
            ("0008:01:00", "0008:01:00.0"),
            ("4a7f1:00:00.0", "4a7f1:00:00.0"),
            ("17:00.1", "0000:17:00.1"),
            ("0000:C1:00.0", "0000:c1:00.0"),
        ] {
            assert_eq!(
                PciAddress::parse(input).unwrap().to_string(),
                want,
                "{input}"
            );
        }
        assert_eq!(
            PciAddress::parse("00000000:17:00.0").unwrap(),
            PciAddress::parse("0000:17:00").unwrap()
        );
    }

    #[test]
    fn rejects_what_is_not_an_address() {
        for bad in [
            "",
            "79",
            "0000:17",
            "0000:17:00.8",
            "0000:17:20.0",
            "0000:117:00.0",
            "x:17:00.0",
            "0000:17:00.0; rm -rf /",
            "123456789:00:00.0",
            "0000:17:00:00",
        ] {
            assert!(PciAddress::parse(bad).is_err(), "{bad}");
        }
    }

    /// The byte-by-byte reader gives what the general one gives, wherever it answers at all.
    #[test]
    fn the_usual_form_reads_as_the_general_path_does() {
        let digits = [
            "0", "00", "000", "0000", "c1", "C1", "1f", "20", "ff", "x0", "", "4a7f1",
        ];
        let mut n = 0;
        for d in ["0000", "0", "00000000", "4a7f1", "123456789", "x000", ""] {
            for b in digits {
                for v in digits {
                    for f in ["", ".0", ".7", ".8", ".f", ".", ".00"] {
                        let s = format!("{d}:{b}:{v}{f}");
                        if let Some(p) = PciAddress::parse_usual(s.as_bytes()) {
                            assert_eq!(Ok(p), PciAddress::parse_any(&s, &s), "{s}");
                            n += 1;
                        }
                    }
                }
            }
        }
        assert!(n > 100, "{n} addresses compared");
    }
}
