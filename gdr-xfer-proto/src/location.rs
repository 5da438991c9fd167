//! Where a segment's memory lives: host memory near a NUMA node, or a CUDA device.

use std::fmt;
use std::str::FromStr;

/// The memory location of a segment, written as Mooncake and the rest of the field write it:
/// `cpu`, `cpu:<numa node>` or `cuda:<ordinal>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// Host memory, near the given NUMA node when known.
    Cpu {
        /// The NUMA node, if known.
        numa: Option<u32>,
    },
    /// Memory of the CUDA device with this ordinal.
    Cuda {
        /// The device ordinal.
        ordinal: u32,
    },
}

impl Location {
    /// Whether the memory is GPU memory.
    pub fn is_gpu(self) -> bool {
        matches!(self, Location::Cuda { .. })
    }

    /// The wire form: kind (0 cpu without node, 1 cpu with node, 2 cuda) and index.
    pub(crate) fn to_wire(self) -> (u8, u32) {
        match self {
            Location::Cpu { numa: None } => (0, 0),
            Location::Cpu { numa: Some(n) } => (1, n),
            Location::Cuda { ordinal } => (2, ordinal),
        }
    }

    /// The inverse of [`Location::to_wire`]; `None` for an unknown kind.
    pub(crate) fn from_wire(kind: u8, index: u32) -> Option<Location> {
        match kind {
            0 => Some(Location::Cpu { numa: None }),
            1 => Some(Location::Cpu { numa: Some(index) }),
            2 => Some(Location::Cuda { ordinal: index }),
            _ => None,
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Cpu { numa: None } => write!(f, "cpu"),
            Location::Cpu { numa: Some(n) } => write!(f, "cpu:{n}"),
            Location::Cuda { ordinal } => write!(f, "cuda:{ordinal}"),
        }
    }
}

/// A string that is not a [`Location`] (`cpu`, `cpu:<numa node>` or `cuda:<ordinal>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseLocationError {
    /// The string given.
    pub input: String,
}

impl ParseLocationError {
    /// How to write a location.
    pub const HINT: &'static str = "write cpu, cpu:<numa node> or cuda:<ordinal>";
}

impl fmt::Display for ParseLocationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "memory location {:?}; hint: {}", self.input, Self::HINT)
    }
}

impl std::error::Error for ParseLocationError {}

impl FromStr for Location {
    type Err = ParseLocationError;

    fn from_str(s: &str) -> Result<Location, ParseLocationError> {
        let bad = || ParseLocationError {
            input: s.to_string(),
        };
        let (kind, index) = match s.split_once(':') {
            Some((k, i)) => (k, Some(i.parse::<u32>().map_err(|_| bad())?)),
            None => (s, None),
        };
        match (kind, index) {
            ("cpu", numa) => Ok(Location::Cpu { numa }),
            ("cuda", Some(ordinal)) => Ok(Location::Cuda { ordinal }),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_print_and_cross_the_wire() {
        for s in ["cpu", "cpu:1", "cuda:7"] {
            let l: Location = s.parse().unwrap();
            assert_eq!(l.to_string(), s);
            let (k, i) = l.to_wire();
            assert_eq!(Location::from_wire(k, i), Some(l));
        }
        for bad in ["", "gpu:0", "cuda", "cpu:-1", "cuda:x", "cpu:1:2"] {
            assert_eq!(
                bad.parse::<Location>(),
                Err(ParseLocationError {
                    input: bad.to_string()
                }),
                "{bad:?}"
            );
        }
        assert_eq!(Location::from_wire(3, 0), None);
    }
}
