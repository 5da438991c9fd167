//! How NCCL reads its variables: `NCCL_IB_HCA` lists, integers (`strtoll`), path levels.

use crate::path::PathClass;

/// A parsed `NCCL_IB_HCA`: `[^][=]name[:port],name[:port]...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HcaList {
    pub exclude: bool,
    pub exact: bool,
    pub entries: Vec<(String, Option<u32>)>,
}

pub(crate) fn parse_hca(s: &str) -> HcaList {
    let mut rest = s.trim();
    let exclude = rest.starts_with('^');
    if exclude {
        rest = &rest[1..];
    }
    let exact = rest.starts_with('=');
    if exact {
        rest = &rest[1..];
    }
    let entries = rest
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| match e.split_once(':') {
            // `<hca>[:<port>[:<rail>[:<plane>]]]`: an empty port field means every port.
            Some((n, p)) => (
                n.to_string(),
                p.split(':').next().and_then(|p| p.parse().ok()),
            ),
            None => (e.to_string(), None),
        })
        .collect();
    HcaList {
        exclude,
        exact,
        entries,
    }
}

impl HcaList {
    pub(crate) fn matches(&self, entry: &str, dev: &str) -> bool {
        if self.exact {
            dev == entry
        } else {
            dev.starts_with(entry)
        }
    }

    /// Whether NCCL would use `dev`.
    pub(crate) fn selects(&self, dev: &str) -> bool {
        let hit = self.entries.iter().any(|(e, _)| self.matches(e, dev));
        hit != self.exclude
    }

    /// The port this list names for `dev` (include lists only).
    pub(crate) fn port_for(&self, dev: &str) -> Option<u32> {
        if self.exclude {
            return None;
        }
        self.entries
            .iter()
            .find(|(e, _)| self.matches(e, dev))
            .and_then(|(_, p)| *p)
    }
}

/// An integer as NCCL's `NCCL_PARAM` reads it (`strtoll(str, &end, 0)`, the whole string):
/// decimal, `0x` hex or leading-zero octal, leading blanks allowed. `None`: NCCL ignores the
/// value and keeps its default.
pub(crate) fn nccl_int(s: &str) -> Option<i64> {
    let t = s.trim_start();
    let (neg, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let v = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        i64::from_str_radix(h, 16).ok()?
    } else if t.len() > 1 && t.starts_with('0') {
        i64::from_str_radix(&t[1..], 8).ok()?
    } else {
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()?
    };
    Some(if neg { -v } else { v })
}

/// What a level variable (`NCCL_NET_GDR_LEVEL`, `NCCL_P2P_LEVEL`) allows, as NCCL reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    /// `LOC` (or legacy `0`): never.
    Never,
    /// `NVL`, `NVB` or `C2C`: only over NVLink or a C2C link, never over PCIe.
    NvlinkOnly(&'static str),
    /// Up to this PCIe class (`PXN` and `P2C`, which lie between PXB and PHB, count as PXB).
    UpTo(PathClass, &'static str),
}

impl Level {
    /// Whether a GPU-NIC (or GPU-GPU) path of `class` is allowed.
    pub(crate) fn allows(self, class: PathClass) -> bool {
        match self {
            Level::UpTo(c, _) => class <= c,
            _ => false,
        }
    }

    /// NCCL's name for the level.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Level::Never => "LOC",
            Level::NvlinkOnly(n) | Level::UpTo(_, n) => n,
        }
    }
}

/// How NCCL read a level variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LevelRead {
    /// An exact path-type name.
    Name(Level),
    /// A legacy integer (0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 and above SYS).
    Legacy(i64, Level),
    /// Not a name NCCL knows (the comparison is case-sensitive) nor a number: NCCL ignores it.
    Ignored,
}

/// `ncclGetLevel` of NCCL's `src/graph/paths.cc`: an exact name of `topoPathTypeStr` up to SYS,
/// else, when the first character is a digit, the legacy integer (`strtol`, values above 4
/// read as SYS), else nothing.
pub(crate) fn read_level(s: &str) -> LevelRead {
    let named = match s {
        "LOC" => Some(Level::Never),
        "NVL" => Some(Level::NvlinkOnly("NVL")),
        "NVB" => Some(Level::NvlinkOnly("NVB")),
        "C2C" => Some(Level::NvlinkOnly("C2C")),
        "PIX" => Some(Level::UpTo(PathClass::Pix, "PIX")),
        "PXB" => Some(Level::UpTo(PathClass::Pxb, "PXB")),
        "P2C" => Some(Level::UpTo(PathClass::Pxb, "P2C")),
        "PXN" => Some(Level::UpTo(PathClass::Pxb, "PXN")),
        "PHB" => Some(Level::UpTo(PathClass::Phb, "PHB")),
        "SYS" => Some(Level::UpTo(PathClass::Sys, "SYS")),
        _ => None,
    };
    if let Some(l) = named {
        return LevelRead::Name(l);
    }
    if s.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
        let n: i64 = digits.parse().unwrap_or(i64::MAX);
        let level = match n {
            0 => Level::Never,
            1 => Level::UpTo(PathClass::Pix, "PIX"),
            2 => Level::UpTo(PathClass::Pxb, "PXB"),
            3 => Level::UpTo(PathClass::Phb, "PHB"),
            _ => Level::UpTo(PathClass::Sys, "SYS"),
        };
        return LevelRead::Legacy(n, level);
    }
    LevelRead::Ignored
}
