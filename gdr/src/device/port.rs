//! Port attributes (`ibv_query_port`): state, link layer, MTU, width and speed.

use std::fmt;

use gdr_sys::ibv;

use super::context::Context;
use crate::error::{Hint, Result};
use crate::raw_enum::constants;
use crate::return_code::check;

/// The `IBV_LINK_LAYER_*` values of `verbs.h`: an anonymous enum that rdma-sys does not bind.
mod link_layer {
    pub(super) const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
    pub(super) const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
    pub(super) const IBV_LINK_LAYER_ETHERNET: u8 = 2;
}

/// Port state (`ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// No state change.
    Nop,
    /// Link down.
    Down,
    /// Initialising (InfiniBand: waiting for the subnet manager).
    Init,
    /// Armed.
    Armed,
    /// Active: traffic can flow.
    Active,
    /// Active, deferred.
    ActiveDefer,
    /// A value this version does not know.
    Unknown(u32),
}

constants!(PortState: u32 {
    Nop = ibv::ibv_port_state::IBV_PORT_NOP,
    Down = ibv::ibv_port_state::IBV_PORT_DOWN,
    Init = ibv::ibv_port_state::IBV_PORT_INIT,
    Armed = ibv::ibv_port_state::IBV_PORT_ARMED,
    Active = ibv::ibv_port_state::IBV_PORT_ACTIVE,
    ActiveDefer = ibv::ibv_port_state::IBV_PORT_ACTIVE_DEFER,
});

impl PortState {
    /// From the `ibv_port_state` value; values this version does not know are `Unknown`.
    pub fn from_raw(v: u32) -> PortState {
        Self::from_constant(v).unwrap_or(PortState::Unknown(v))
    }

    /// The `ibv_port_state` value.
    pub fn raw(self) -> u32 {
        match self {
            PortState::Unknown(v) => v,
            known => known.constant().unwrap_or_default(),
        }
    }
}

/// Link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand.
    InfiniBand,
    /// Ethernet (RoCE).
    Ethernet,
    /// Not reported (also every value this version does not know).
    Unspecified,
}

constants!(LinkLayer: u8 {
    InfiniBand = link_layer::IBV_LINK_LAYER_INFINIBAND,
    Ethernet = link_layer::IBV_LINK_LAYER_ETHERNET,
    Unspecified = link_layer::IBV_LINK_LAYER_UNSPECIFIED,
});

impl LinkLayer {
    /// From `ibv_port_attr::link_layer`; unknown values are `Unspecified`.
    pub fn from_raw(v: u8) -> LinkLayer {
        Self::from_constant(v).unwrap_or(LinkLayer::Unspecified)
    }

    /// The `IBV_LINK_LAYER_*` value.
    pub fn raw(self) -> u8 {
        self.constant()
            .unwrap_or(link_layer::IBV_LINK_LAYER_UNSPECIFIED)
    }
}

/// Path MTU of a port or connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes.
    B256,
    /// 512 bytes.
    B512,
    /// 1024 bytes.
    B1024,
    /// 2048 bytes.
    B2048,
    /// 4096 bytes.
    B4096,
}

constants!(Mtu: u32 {
    B256 = ibv::ibv_mtu::IBV_MTU_256,
    B512 = ibv::ibv_mtu::IBV_MTU_512,
    B1024 = ibv::ibv_mtu::IBV_MTU_1024,
    B2048 = ibv::ibv_mtu::IBV_MTU_2048,
    B4096 = ibv::ibv_mtu::IBV_MTU_4096,
});

impl Mtu {
    /// Every MTU, smallest first.
    pub const ALL: [Mtu; 5] = [Mtu::B256, Mtu::B512, Mtu::B1024, Mtu::B2048, Mtu::B4096];

    /// From the `ibv_mtu` value (`IBV_MTU_256` ..= `IBV_MTU_4096`).
    pub fn from_raw(v: u32) -> Option<Mtu> {
        Self::from_constant(v)
    }

    /// From a size in bytes (256, 512, 1024, 2048, 4096).
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        Mtu::ALL.into_iter().find(|m| m.bytes() == bytes)
    }

    /// The size in bytes.
    pub fn bytes(self) -> u32 {
        match self {
            Mtu::B256 => 256,
            Mtu::B512 => 512,
            Mtu::B1024 => 1024,
            Mtu::B2048 => 2048,
            Mtu::B4096 => 4096,
        }
    }

    /// The `ibv_mtu` value.
    pub fn raw(self) -> u32 {
        // Every variant is in the constants list.
        self.constant().unwrap_or(ibv::ibv_mtu::IBV_MTU_1024)
    }
}

impl fmt::Display for Mtu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

/// What `ibv_devinfo` reports about a port.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PortAttributes {
    /// Port number (1-based).
    pub port: u8,
    /// State.
    pub state: PortState,
    /// Physical state (`ibv_devinfo` numbering: 5 = LinkUp, 3 = Disabled, 2 = Polling).
    pub phys_state: u8,
    /// Largest MTU the port supports (1024 when the provider reports a value outside `ibv_mtu`).
    pub max_mtu: Mtu,
    /// MTU in use (1024 when the provider reports a value outside `ibv_mtu`).
    pub active_mtu: Mtu,
    /// Entries in the GID table.
    pub gid_tbl_len: i32,
    /// Local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Active width code (1 = 1x, 2 = 4x, 4 = 8x, 8 = 12x, 16 = 2x).
    pub active_width: u8,
    /// Active speed code (`ibv_devinfo`'s numbering).
    pub active_speed: u8,
    /// Link rate in Gb/s computed from width and speed, when the codes are known.
    pub rate_gbps: Option<f64>,
}

impl PortAttributes {
    fn from_raw(port: u8, a: &ibv::ibv_port_attr) -> Self {
        PortAttributes {
            port,
            state: PortState::from_raw(a.state),
            phys_state: a.phys_state,
            max_mtu: Mtu::from_raw(a.max_mtu).unwrap_or(Mtu::B1024),
            active_mtu: Mtu::from_raw(a.active_mtu).unwrap_or(Mtu::B1024),
            gid_tbl_len: a.gid_tbl_len,
            lid: a.lid,
            link_layer: LinkLayer::from_raw(a.link_layer),
            active_width: a.active_width,
            active_speed: a.active_speed,
            rate_gbps: link_rate_gbps(a.active_width, a.active_speed),
        }
    }
}

impl Context {
    /// Attributes of one port (1-based).
    pub fn query_port(&self, port: u8) -> Result<PortAttributes> {
        // SAFETY: ibv_port_attr is plain old data; all-zero is valid.
        let mut attr: ibv::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and attribute struct; ___ibv_query_port is the non-compat entry.
        let rc = unsafe { ibv::___ibv_query_port(self.as_raw(), port, &mut attr) };
        check(
            "ibv_query_port",
            rc,
            || format!("device={}, port={port}", self.name()),
            |_| Hint::new("ports are numbered from 1; `ibv_devinfo` lists them"),
        )?;
        Ok(PortAttributes::from_raw(port, &attr))
    }
}

/// Link rate in Gb/s from the `active_width` and `active_speed` codes of `ibv_port_attr`.
pub fn link_rate_gbps(width: u8, speed: u8) -> Option<f64> {
    let lanes = match width {
        1 => 1.0,
        2 => 4.0,
        4 => 8.0,
        8 => 12.0,
        16 => 2.0,
        _ => return None,
    };
    let per_lane = match speed {
        1 => 2.5,       // SDR
        2 => 5.0,       // DDR
        4 | 8 => 10.0,  // QDR, FDR10
        16 => 14.0625,  // FDR
        32 => 25.78125, // EDR
        64 => 50.0,     // HDR
        128 => 100.0,   // NDR
        _ => return None,
    };
    Some(lanes * per_lane)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_port_state_constant_round_trips() {
        assert_eq!(PortState::CONSTANTS.len(), 6);
        for &(raw, state) in PortState::CONSTANTS {
            assert_eq!(PortState::from_raw(raw), state, "{raw}");
            assert_eq!(state.raw(), raw, "{state:?}");
        }
        assert_eq!(PortState::from_raw(77), PortState::Unknown(77));
        assert_eq!(PortState::Unknown(77).raw(), 77);
        assert_eq!(
            PortState::from_raw(ibv::ibv_port_state::IBV_PORT_ACTIVE),
            PortState::Active
        );
    }

    #[test]
    fn every_link_layer_constant_round_trips() {
        assert_eq!(LinkLayer::CONSTANTS.len(), 3);
        for &(raw, ll) in LinkLayer::CONSTANTS {
            assert_eq!(LinkLayer::from_raw(raw), ll, "{raw}");
            assert_eq!(ll.raw(), raw, "{ll:?}");
        }
        assert_eq!(LinkLayer::from_raw(200), LinkLayer::Unspecified);
    }

    #[test]
    fn every_mtu_constant_round_trips() {
        assert_eq!(Mtu::CONSTANTS.len(), Mtu::ALL.len());
        for &(raw, mtu) in Mtu::CONSTANTS {
            assert_eq!(Mtu::from_raw(raw), Some(mtu), "{raw}");
            assert_eq!(mtu.raw(), raw, "{mtu:?}");
            assert_eq!(Mtu::from_bytes(mtu.bytes()), Some(mtu));
        }
        for m in Mtu::ALL {
            assert!(
                Mtu::CONSTANTS.iter().any(|&(_, c)| c == m),
                "{m:?} has a constant"
            );
        }
        assert_eq!(Mtu::from_raw(ibv::ibv_mtu::IBV_MTU_4096), Some(Mtu::B4096));
        assert_eq!(Mtu::from_raw(0), None);
        assert_eq!(Mtu::from_raw(9), None);
        assert_eq!(Mtu::from_bytes(1500), None);
        assert_eq!(Mtu::B4096.bytes(), 4096);
        assert!(Mtu::B256 < Mtu::B4096, "ordered by size");
    }

    #[test]
    fn link_rates() {
        assert_eq!(link_rate_gbps(2, 64), Some(200.0)); // 4x HDR
        assert_eq!(link_rate_gbps(2, 32), Some(103.125)); // 4x EDR
        assert_eq!(link_rate_gbps(3, 1), None);
        assert_eq!(link_rate_gbps(1, 0), None);
    }

    #[test]
    fn port_attributes_from_raw_values() {
        // SAFETY: plain old data; all-zero is valid.
        let mut a: ibv::ibv_port_attr = unsafe { std::mem::zeroed() };
        a.state = ibv::ibv_port_state::IBV_PORT_ACTIVE;
        a.link_layer = link_layer::IBV_LINK_LAYER_ETHERNET;
        a.active_mtu = ibv::ibv_mtu::IBV_MTU_1024;
        a.max_mtu = 42; // hostile: outside ibv_mtu
        a.active_width = 2;
        a.active_speed = 64;
        let p = PortAttributes::from_raw(1, &a);
        assert_eq!(p.state, PortState::Active);
        assert_eq!(p.link_layer, LinkLayer::Ethernet);
        assert_eq!(p.active_mtu, Mtu::B1024);
        assert_eq!(
            p.max_mtu,
            Mtu::B1024,
            "unknown MTU values fall back to 1024"
        );
        assert_eq!(p.rate_gbps, Some(200.0));
    }
}
