//! Decoding of PCI configuration space and sysfs link values: the ACS extended capability, the
//! PCI Express capability's relaxed-ordering bit, link speeds.
//!
//! Pure functions on bytes and strings; no I/O.

use serde::{Deserialize, Serialize};

/// Extended capability id of Access Control Services.
pub const EXT_CAP_ID_ACS: u16 = 0x000d;
/// Capability id of the PCI Express capability.
pub const CAP_ID_PCIE: u8 = 0x10;
/// Bytes of the standard configuration header plus capabilities; extended capabilities start here.
pub const EXT_CONFIG_START: usize = 0x100;
/// Size of a PCI Express function's whole configuration space.
pub const CONFIG_SPACE_MAX: usize = 4096;

/// Lowercase hex of bytes.
pub fn bytes_to_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Bytes of a hex string (even length, no separators); `None` if malformed.
pub fn hex_to_bytes(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) || !hex.is_ascii() {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect()
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes([*b.get(off)?, *b.get(off + 1)?]))
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes([
        *b.get(off)?,
        *b.get(off + 1)?,
        *b.get(off + 2)?,
        *b.get(off + 3)?,
    ]))
}

/// The ACS Control register's bits (PCIe base spec, ACS Extended Capability, offset 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcsControl {
    /// The raw 16-bit register.
    pub raw: u16,
}

impl AcsControl {
    /// Source Validation Enable (bit 0).
    pub const SOURCE_VALIDATION: u16 = 1 << 0;
    /// Translation Blocking Enable (bit 1).
    pub const TRANSLATION_BLOCKING: u16 = 1 << 1;
    /// P2P Request Redirect Enable (bit 2): peer requests go up to the root complex.
    pub const P2P_REQUEST_REDIRECT: u16 = 1 << 2;
    /// P2P Completion Redirect Enable (bit 3).
    pub const P2P_COMPLETION_REDIRECT: u16 = 1 << 3;
    /// Upstream Forwarding Enable (bit 4).
    pub const UPSTREAM_FORWARDING: u16 = 1 << 4;
    /// P2P Egress Control Enable (bit 5).
    pub const P2P_EGRESS_CONTROL: u16 = 1 << 5;
    /// Direct Translated P2P Enable (bit 6).
    pub const DIRECT_TRANSLATED_P2P: u16 = 1 << 6;

    /// The bits that send or block peer-to-peer traffic away from the direct path.
    pub const P2P_BLOCKING: u16 =
        Self::P2P_REQUEST_REDIRECT | Self::P2P_COMPLETION_REDIRECT | Self::P2P_EGRESS_CONTROL;

    /// Names of the set bits, in bit order (`lspci -vvv` spelling).
    pub fn set_bits(&self) -> Vec<&'static str> {
        const NAMES: [(u16, &str); 7] = [
            (AcsControl::SOURCE_VALIDATION, "SrcValid"),
            (AcsControl::TRANSLATION_BLOCKING, "TransBlk"),
            (AcsControl::P2P_REQUEST_REDIRECT, "ReqRedir"),
            (AcsControl::P2P_COMPLETION_REDIRECT, "CmpltRedir"),
            (AcsControl::UPSTREAM_FORWARDING, "UpstreamFwd"),
            (AcsControl::P2P_EGRESS_CONTROL, "EgressCtrl"),
            (AcsControl::DIRECT_TRANSLATED_P2P, "DirectTrans"),
        ];
        NAMES
            .iter()
            .filter(|(bit, _)| self.raw & bit != 0)
            .map(|(_, n)| *n)
            .collect()
    }

    /// Whether any of [`AcsControl::P2P_BLOCKING`] is set.
    pub fn redirects_p2p(&self) -> bool {
        self.raw & Self::P2P_BLOCKING != 0
    }
}

/// What the configuration space says about ACS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acs {
    /// Only the first 256 bytes (or fewer) were readable: extended capabilities are unknown.
    /// Reading `config` beyond 64 bytes needs root.
    NotReadable {
        /// Bytes that were read.
        len: usize,
    },
    /// The extended capability list has no ACS capability.
    Absent,
    /// The ACS capability at `offset`, with its Control register.
    Present {
        /// Offset of the capability header.
        offset: u16,
        /// The Control register.
        control: AcsControl,
    },
}

/// Find the ACS extended capability in a configuration space.
pub fn acs(config: &[u8]) -> Acs {
    if config.len() <= EXT_CONFIG_START {
        return Acs::NotReadable { len: config.len() };
    }
    let mut off = EXT_CONFIG_START;
    // The list is at most (4096 - 256) / 4 entries long; bound the walk against loops.
    for _ in 0..960 {
        let Some(header) = u32_at(config, off) else {
            return Acs::Absent;
        };
        if header == 0 || header == 0xffff_ffff {
            return Acs::Absent;
        }
        if (header & 0xffff) as u16 == EXT_CAP_ID_ACS {
            return match u16_at(config, off + 6) {
                Some(raw) => Acs::Present {
                    offset: off as u16,
                    control: AcsControl { raw },
                },
                None => Acs::Absent,
            };
        }
        let next = ((header >> 20) & 0xffc) as usize;
        if next < EXT_CONFIG_START {
            return Acs::Absent;
        }
        off = next;
    }
    Acs::Absent
}

/// Offset of a standard capability, walking the list from the pointer at 0x34.
/// `None` when the list or the capability is not inside the bytes read.
pub fn find_capability(config: &[u8], id: u8) -> Option<usize> {
    // Status register bit 4: capabilities list present.
    let status = u16_at(config, 0x06)?;
    if status & 0x10 == 0 {
        return None;
    }
    let mut off = (*config.get(0x34)? & 0xfc) as usize;
    for _ in 0..48 {
        if off < 0x40 {
            return None;
        }
        let cap_id = *config.get(off)?;
        if cap_id == id {
            return Some(off);
        }
        off = (*config.get(off + 1)? & 0xfc) as usize;
    }
    None
}

/// Relaxed-ordering state from the PCI Express capability's Device Control register (bit 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelaxedOrdering {
    /// The capability lies beyond the bytes that could be read (non-root reads 64 bytes).
    Unknown,
    /// Enable Relaxed Ordering is set.
    Enabled,
    /// Enable Relaxed Ordering is clear.
    Disabled,
}

/// Read the relaxed-ordering enable bit of a device.
pub fn relaxed_ordering(config: &[u8]) -> RelaxedOrdering {
    let Some(cap) = find_capability(config, CAP_ID_PCIE) else {
        return RelaxedOrdering::Unknown;
    };
    match u16_at(config, cap + 8) {
        Some(ctl) if ctl & 0x10 != 0 => RelaxedOrdering::Enabled,
        Some(_) => RelaxedOrdering::Disabled,
        None => RelaxedOrdering::Unknown,
    }
}

/// Transfer rate of a sysfs link speed, e.g. `16.0 GT/s PCIe` -> 16.0. `None` for `Unknown`.
pub fn link_speed_gts(s: &str) -> Option<f64> {
    let first = s.split_whitespace().next()?;
    let v: f64 = first.parse().ok()?;
    (v > 0.0).then_some(v)
}

/// Usable bandwidth of a PCIe link in Gb/s per direction, after line encoding
/// (8b/10b up to 5 GT/s, 128b/130b from 8 GT/s), e.g. 16 GT/s x16 -> 252.
pub fn link_gbps(gts: f64, width: u32) -> f64 {
    let efficiency = if gts <= 5.0 { 0.8 } else { 128.0 / 130.0 };
    gts * efficiency * width as f64
}

/// PCIe generation of a transfer rate, e.g. 16.0 -> 4.
pub fn generation(gts: f64) -> u32 {
    match gts {
        g if g <= 2.5 => 1,
        g if g <= 5.0 => 2,
        g if g <= 8.0 => 3,
        g if g <= 16.0 => 4,
        g if g <= 32.0 => 5,
        _ => 6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with_acs(control: u16) -> Vec<u8> {
        let mut c = vec![0u8; 4096];
        // AER at 0x100 pointing to ACS at 0x148.
        c[0x100..0x104].copy_from_slice(&(0x0001u32 | (1 << 16) | (0x148 << 20)).to_le_bytes());
        c[0x148..0x14c].copy_from_slice(&(0x000du32 | (1 << 16)).to_le_bytes());
        c[0x14c..0x14e].copy_from_slice(&0x005fu16.to_le_bytes());
        c[0x14e..0x150].copy_from_slice(&control.to_le_bytes());
        c
    }

    #[test]
    fn acs_found_through_the_extended_list() {
        let acs = acs(&config_with_acs(0x001d));
        let Acs::Present { offset, control } = acs else {
            panic!("expected ACS, got {acs:?}");
        };
        assert_eq!(offset, 0x148);
        assert_eq!(
            control.set_bits(),
            ["SrcValid", "ReqRedir", "CmpltRedir", "UpstreamFwd"]
        );
        assert!(control.redirects_p2p());
        let Acs::Present { control, .. } = super::acs(&config_with_acs(0x0011)) else {
            panic!("no ACS");
        };
        assert!(!control.redirects_p2p());
    }

    #[test]
    fn short_config_is_not_readable_and_a_loop_terminates() {
        assert_eq!(acs(&[0u8; 64]), Acs::NotReadable { len: 64 });
        assert_eq!(acs(&[0u8; 256]), Acs::NotReadable { len: 256 });
        let mut c = vec![0u8; 4096];
        // A capability that points to itself and is not ACS.
        c[0x100..0x104].copy_from_slice(&(0x0001u32 | (0x100 << 20)).to_le_bytes());
        assert_eq!(acs(&c), Acs::Absent);
    }

    #[test]
    fn relaxed_ordering_bit() {
        let mut c = vec![0u8; 256];
        c[0x06] = 0x10;
        c[0x34] = 0x60;
        c[0x60] = CAP_ID_PCIE;
        c[0x68] = 0x10;
        assert_eq!(relaxed_ordering(&c), RelaxedOrdering::Enabled);
        c[0x68] = 0;
        assert_eq!(relaxed_ordering(&c), RelaxedOrdering::Disabled);
        assert_eq!(relaxed_ordering(&c[..64]), RelaxedOrdering::Unknown);
    }

    #[test]
    fn hex_round_trip_and_link_math() {
        assert_eq!(
            hex_to_bytes(&bytes_to_hex(&[0, 1, 0xab])),
            Some(vec![0, 1, 0xab])
        );
        assert_eq!(hex_to_bytes("abc"), None);
        assert_eq!(hex_to_bytes("zz"), None);
        assert_eq!(link_speed_gts("16.0 GT/s PCIe"), Some(16.0));
        assert_eq!(link_speed_gts("Unknown"), None);
        assert_eq!(link_gbps(16.0, 16).round(), 252.0);
        assert_eq!(generation(8.0), 3);
    }
}
