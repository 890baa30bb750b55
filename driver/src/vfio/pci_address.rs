//! PCI function addresses (`DDDD:BB:DD.F`), as sysfs and VFIO name them.

#![deny(unsafe_code)]

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A PCI function address: domain, bus, device (slot) and function.
///
/// Parses the full form `0000:03:00.0` and the short form `03:00.0` (domain
/// 0, as `lspci` prints it); always displays the full form, which is the
/// name of the function's directory in `/sys/bus/pci/devices` and the name
/// `VFIO_GROUP_GET_DEVICE_FD` expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    /// PCI segment (domain), 16 bits in practice.
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device (slot) number, 0..=31.
    pub device: u8,
    /// Function number, 0..=7.
    pub function: u8,
}

/// Why a string is not a PCI address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{input}` is not a PCI address ({reason}); expected DDDD:BB:DD.F, e.g. 0000:03:00.0")]
pub struct ParsePciAddressError {
    /// The rejected text.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl PciAddress {
    /// Largest device (slot) number.
    pub const MAX_DEVICE: u8 = 31;
    /// Largest function number.
    pub const MAX_FUNCTION: u8 = 7;

    /// An address from its parts; `None` if the device or function is out of range.
    pub fn new(domain: u32, bus: u8, device: u8, function: u8) -> Option<PciAddress> {
        (device <= Self::MAX_DEVICE && function <= Self::MAX_FUNCTION).then_some(PciAddress {
            domain,
            bus,
            device,
            function,
        })
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

fn hex_field(text: &str, max_digits: usize, what: &'static str) -> Result<u32, &'static str> {
    if text.is_empty() || text.len() > max_digits {
        return Err(what);
    }
    if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(what);
    }
    u32::from_str_radix(text, 16).map_err(|_| what)
}

impl FromStr for PciAddress {
    type Err = ParsePciAddressError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let fail = |reason: &'static str| ParsePciAddressError {
            input: input.to_string(),
            reason,
        };
        let text = input.trim();
        let (head, function) = text
            .rsplit_once('.')
            .ok_or_else(|| fail("no `.F` function suffix"))?;
        let parts: Vec<&str> = head.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [domain, bus, device] => (
                hex_field(domain, 4, "domain must be 1-4 hex digits").map_err(fail)?,
                *bus,
                *device,
            ),
            [bus, device] => (0, *bus, *device),
            _ => return Err(fail("expected DDDD:BB:DD or BB:DD before the function")),
        };
        let bus = hex_field(bus, 2, "bus must be 1-2 hex digits").map_err(fail)?;
        let device = hex_field(device, 2, "device must be 1-2 hex digits").map_err(fail)?;
        let function = hex_field(function, 1, "function must be one digit 0-7").map_err(fail)?;
        if device > u32::from(Self::MAX_DEVICE) {
            return Err(fail("device number above 0x1f"));
        }
        if function > u32::from(Self::MAX_FUNCTION) {
            return Err(fail("function number above 7"));
        }
        // The ranges were checked above: every narrowing below is lossless.
        Ok(PciAddress {
            domain,
            bus: bus as u8,
            device: device as u8,
            function: function as u8,
        })
    }
}

impl Serialize for PciAddress {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PciAddress {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_and_short_forms() {
        let a: PciAddress = "0000:03:00.0".parse().unwrap();
        assert_eq!(a, PciAddress::new(0, 3, 0, 0).unwrap());
        let b: PciAddress = "10:1f.7".parse().unwrap();
        assert_eq!(b, PciAddress::new(0, 0x10, 0x1f, 7).unwrap());
        let c: PciAddress = "ffff:ff:1f.7".parse().unwrap();
        assert_eq!(c.domain, 0xffff);
        let d: PciAddress = " 0001:AF:0a.3\n".parse().unwrap();
        assert_eq!(d, PciAddress::new(1, 0xaf, 0x0a, 3).unwrap());
    }

    #[test]
    fn displays_the_sysfs_name() {
        let a = PciAddress::new(0, 0xaf, 0x0a, 3).unwrap();
        assert_eq!(a.to_string(), "0000:af:0a.3");
        let round: PciAddress = a.to_string().parse().unwrap();
        assert_eq!(round, a);
    }

    #[test]
    fn rejects_malformed_addresses_with_a_reason() {
        for (text, reason) in [
            ("", "no `.F` function suffix"),
            ("0000:03:00", "no `.F` function suffix"),
            ("0000:03:00.8", "function number above 7"),
            ("0000:03:20.0", "device number above 0x1f"),
            ("0000:103:00.0", "bus must be 1-2 hex digits"),
            ("00000:03:00.0", "domain must be 1-4 hex digits"),
            ("0000:0g:00.0", "bus must be 1-2 hex digits"),
            ("0000:03:00.", "function must be one digit 0-7"),
            (
                "1:2:3:4.0",
                "expected DDDD:BB:DD or BB:DD before the function",
            ),
            ("eth0", "no `.F` function suffix"),
            ("+0:03:00.0", "domain must be 1-4 hex digits"),
        ] {
            let err = text.parse::<PciAddress>().unwrap_err();
            assert_eq!(err.reason, reason, "{text:?}");
            assert!(err.to_string().contains("DDDD:BB:DD.F"), "{err}");
        }
    }

    #[test]
    fn orders_like_lspci() {
        let mut v: Vec<PciAddress> = ["0000:01:00.0", "0000:00:1f.3", "0000:00:02.0"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        v.sort();
        let names: Vec<String> = v.iter().map(|a| a.to_string()).collect();
        assert_eq!(names, ["0000:00:02.0", "0000:00:1f.3", "0000:01:00.0"]);
    }

    #[test]
    fn new_checks_ranges() {
        assert!(PciAddress::new(0, 0, 32, 0).is_none());
        assert!(PciAddress::new(0, 0, 0, 8).is_none());
    }
}
