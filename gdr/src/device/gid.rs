//! GIDs, their types, and the GID table of a port (`ibv_query_gid_table`, `ibv_query_gid_ex`).

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use gdr_sys::ibv;

use super::context::Context;
use super::port::LinkLayer;
use crate::error::{Error, Hint, Result};
use crate::raw_enum::constants;
use crate::return_code::{check, no_hint};

/// Most GID entries read in one table query: real tables hold at most a few hundred per port;
/// the bound keeps a provider's absurd `gid_tbl_len` from sizing the buffer.
const MAX_GID_ENTRIES: usize = 1 << 16;

/// A 128-bit GID.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        Ipv6Addr::from(self.0).to_ipv4_mapped()
    }

    /// Whether all bytes are zero (an empty table slot).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// Whether this is an IPv6 link-local address (fe80::/10).
    pub fn is_link_local(&self) -> bool {
        self.0[0] == 0xfe && (self.0[1] & 0xc0) == 0x80
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ipv4() {
            Some(v4) => write!(f, "::ffff:{v4}"),
            None => write!(f, "{}", Ipv6Addr::from(self.0)),
        }
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// Type of a GID table entry (`ibv_gid_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidType {
    /// InfiniBand.
    Ib,
    /// RoCE v1 (Ethernet, not routable).
    RoceV1,
    /// RoCE v2 (UDP/IP, routable): what RoCE fabrics use.
    RoceV2,
    /// A value this version does not know.
    Unknown(u32),
}

constants!(GidType: u32 {
    Ib = ibv::gid_type::IBV_GID_TYPE_IB,
    RoceV1 = ibv::gid_type::IBV_GID_TYPE_ROCE_V1,
    RoceV2 = ibv::gid_type::IBV_GID_TYPE_ROCE_V2,
});

impl GidType {
    /// From `ibv_gid_entry::gid_type`; values this version does not know are `Unknown`.
    pub fn from_raw(v: u32) -> GidType {
        Self::from_constant(v).unwrap_or(GidType::Unknown(v))
    }

    /// The `ibv_gid_type` value.
    pub fn raw(self) -> u32 {
        match self {
            GidType::Unknown(v) => v,
            known => known.constant().unwrap_or_default(),
        }
    }
}

/// One GID table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the port's table (what `-x` / `NCCL_IB_GID_INDEX` take).
    pub index: u32,
    /// The GID.
    pub gid: Gid,
    /// Its type.
    pub gid_type: GidType,
    /// Interface index of the network device it belongs to (RoCE), 0 otherwise.
    pub ndev_ifindex: u32,
}

impl GidEntry {
    fn from_raw(index: u32, e: &ibv::ibv_gid_entry) -> GidEntry {
        GidEntry {
            index,
            // SAFETY: every member of the GID union is plain bytes of the same size; `raw`
            // is valid whichever member the provider wrote.
            gid: Gid(unsafe { e.gid.raw }),
            gid_type: GidType::from_raw(e.gid_type),
            ndev_ifindex: e.ndev_ifindex,
        }
    }
}

/// Picks the GID a RoCE connection should use, as NCCL does with `NCCL_IB_GID_INDEX=-1`:
/// a RoCE v2 entry with an IPv4-mapped address first, then a RoCE v2 global IPv6 entry, then a
/// RoCE v2 link-local one. RoCE v1 entries are never picked automatically.
pub fn pick_roce_gid(table: &[GidEntry]) -> Option<&GidEntry> {
    let v2 = || {
        table
            .iter()
            .filter(|e| e.gid_type == GidType::RoceV2 && !e.gid.is_zero())
    };
    v2().find(|e| e.gid.ipv4().is_some())
        .or_else(|| v2().find(|e| !e.gid.is_link_local()))
        .or_else(|| v2().next())
}

impl Context {
    /// The port's GID table: every valid entry with its type and network device index.
    pub fn gid_table(&self, port: u8) -> Result<Vec<GidEntry>> {
        let per_port = usize::try_from(self.query_port(port)?.gid_tbl_len.max(1)).unwrap_or(1);
        // The query returns the entries of every port: room for all of them.
        let ports = usize::from(self.query_device()?.phys_port_cnt.max(1));
        let cap = per_port.saturating_mul(ports).min(MAX_GID_ENTRIES);
        let mut entries: Vec<ibv::ibv_gid_entry> = (0..cap)
            // SAFETY: ibv_gid_entry is plain old data; all-zero is a valid value.
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        // SAFETY: the buffer holds `cap` entries of the size we pass.
        let n = unsafe {
            ibv::_ibv_query_gid_table(
                self.as_raw(),
                entries.as_mut_ptr(),
                cap,
                0,
                std::mem::size_of::<ibv::ibv_gid_entry>(),
            )
        };
        // A count, or a negative errno.
        let count = match usize::try_from(n) {
            Ok(count) => count,
            Err(_) => {
                let rc = i32::try_from(n).unwrap_or(i32::MIN);
                check(
                    "ibv_query_gid_table",
                    rc,
                    || format!("device={}, max_entries={cap}", self.name()),
                    no_hint,
                )?;
                0
            }
        };
        // Never trust the count beyond the buffer.
        entries.truncate(count);
        Ok(entries
            .iter()
            .filter(|e| e.port_num == u32::from(port))
            .map(|e| GidEntry::from_raw(e.gid_index, e))
            .collect())
    }

    /// One GID entry.
    pub fn gid(&self, port: u8, index: u32) -> Result<GidEntry> {
        // SAFETY: plain old data.
        let mut e: ibv::ibv_gid_entry = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and entry buffer of the size we pass.
        let rc = unsafe {
            ibv::_ibv_query_gid_ex(
                self.as_raw(),
                u32::from(port),
                index,
                &mut e,
                0,
                std::mem::size_of::<ibv::ibv_gid_entry>(),
            )
        };
        check(
            "ibv_query_gid_ex",
            rc,
            || format!("device={}, port={port}, index={index}", self.name()),
            |_| {
                Hint::new("the GID slot is empty or out of range; `show_gids` or /sys/class/infiniband/DEV/ports/N/gids lists valid ones")
            },
        )?;
        Ok(GidEntry::from_raw(index, &e))
    }

    /// The GID to use on a port: on Ethernet (RoCE) the RoCE v2 IPv4 entry as NCCL picks it
    /// ([`pick_roce_gid`]); on InfiniBand index 0.
    pub fn default_gid(&self, port: u8) -> Result<GidEntry> {
        let attr = self.query_port(port)?;
        let table = self.gid_table(port)?;
        if attr.link_layer == LinkLayer::InfiniBand {
            return table.into_iter().find(|e| e.index == 0).ok_or_else(|| {
                Error::unsupported(
                    format!("{} port {port}: GID index 0 is empty", self.name()),
                    "is the port up? `ibstat`",
                )
            });
        }
        pick_roce_gid(&table).cloned().ok_or_else(|| {
            Error::unsupported(
                format!("{} port {port}: no RoCE v2 GID in a table of {} entries", self.name(), table.len()),
                "give the network device an IP address (`ip addr add ... dev <netdev>`); RoCE v2 GIDs follow the addresses",
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u32, gid: &str, t: GidType) -> GidEntry {
        let addr: Ipv6Addr = gid.parse().unwrap();
        GidEntry {
            index,
            gid: Gid(addr.octets()),
            gid_type: t,
            ndev_ifindex: 3,
        }
    }

    #[test]
    fn every_gid_type_constant_round_trips() {
        assert_eq!(GidType::CONSTANTS.len(), 3);
        for &(raw, t) in GidType::CONSTANTS {
            assert_eq!(GidType::from_raw(raw), t, "{raw}");
            assert_eq!(t.raw(), raw, "{t:?}");
        }
        assert_eq!(GidType::from_raw(9), GidType::Unknown(9));
        assert_eq!(GidType::Unknown(9).raw(), 9);
        assert_eq!(
            GidType::from_raw(ibv::gid_type::IBV_GID_TYPE_ROCE_V2),
            GidType::RoceV2
        );
    }

    #[test]
    fn gid_entries_from_raw_values() {
        // SAFETY: plain old data; all-zero is valid.
        let mut e: ibv::ibv_gid_entry = unsafe { std::mem::zeroed() };
        e.gid.raw = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1];
        e.gid_type = ibv::gid_type::IBV_GID_TYPE_ROCE_V2;
        e.ndev_ifindex = 2;
        let g = GidEntry::from_raw(3, &e);
        assert_eq!(g.index, 3);
        assert_eq!(g.gid_type, GidType::RoceV2);
        assert_eq!(g.gid.ipv4(), Some(Ipv4Addr::new(10, 77, 0, 1)));
        e.gid_type = 0xdead;
        assert_eq!(GidEntry::from_raw(3, &e).gid_type, GidType::Unknown(0xdead));
    }

    #[test]
    fn roce_v2_ipv4_gid_is_preferred() {
        let table = vec![
            entry(0, "fe80::1", GidType::RoceV1),
            entry(1, "fe80::1", GidType::RoceV2),
            entry(2, "::ffff:10.0.0.1", GidType::RoceV1),
            entry(3, "::ffff:10.0.0.1", GidType::RoceV2),
            entry(4, "2001:db8::1", GidType::RoceV2),
        ];
        assert_eq!(pick_roce_gid(&table).unwrap().index, 3);
        assert_eq!(
            pick_roce_gid(&table[..2]).unwrap().index,
            1,
            "link-local v2 as last resort"
        );
        assert_eq!(
            pick_roce_gid(&[table[0].clone(), table[4].clone()])
                .unwrap()
                .index,
            4
        );
        assert!(
            pick_roce_gid(&[table[0].clone(), table[2].clone()]).is_none(),
            "never RoCE v1"
        );
        assert!(
            pick_roce_gid(&[entry(5, "::", GidType::RoceV2)]).is_none(),
            "never an empty slot"
        );
    }

    #[test]
    fn gid_display_and_ipv4() {
        let e = entry(1, "::ffff:10.77.0.1", GidType::RoceV2);
        assert_eq!(e.gid.to_string(), "::ffff:10.77.0.1");
        assert_eq!(e.gid.ipv4(), Some(Ipv4Addr::new(10, 77, 0, 1)));
        assert!(entry(0, "fe80::5054:ff:fe12:3456", GidType::RoceV2)
            .gid
            .is_link_local());
        assert!(Gid::default().is_zero());
        assert_eq!(format!("{:?}", e.gid), "Gid(::ffff:10.77.0.1)");
    }
}
