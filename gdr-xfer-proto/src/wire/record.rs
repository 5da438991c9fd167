//! The record an agent publishes about itself in a directory.

use super::reader::Reader;
use super::WireError;

/// The version of [`AgentRecord`]s this build writes and reads.
pub const RECORD_VERSION: u16 = 1;
/// Magic bytes of an agent record.
pub const RECORD_MAGIC: [u8; 4] = *b"GXR1";
/// Longest address in an agent record.
pub const MAX_ADDR: usize = 256;

/// What an agent publishes in a directory about itself (the `<agent>/endpoint` record):
/// magic "GXR1" | version u16 | address length u16 (<= MAX_ADDR) | address (UTF-8, `host:port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRecord {
    /// Where peers connect (`host:port`).
    pub addr: String,
}

impl AgentRecord {
    /// Encodes the record.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        if self.addr.is_empty() || self.addr.len() > MAX_ADDR {
            return Err(WireError::invalid(
                format!("agent address {:?}", self.addr),
                format!("give host:port, at most {MAX_ADDR} bytes"),
            ));
        }
        let mut v = Vec::with_capacity(8 + self.addr.len());
        v.extend_from_slice(&RECORD_MAGIC);
        v.extend_from_slice(&RECORD_VERSION.to_be_bytes());
        v.extend_from_slice(&(self.addr.len() as u16).to_be_bytes());
        v.extend_from_slice(self.addr.as_bytes());
        Ok(v)
    }

    /// Decodes a record published by `agent` (named in errors).
    pub fn decode(agent: &str, buf: &[u8]) -> Result<AgentRecord, WireError> {
        let mut r = Reader::new(agent, buf);
        if r.take(4, "magic")? != RECORD_MAGIC {
            return Err(r.err("not a gdr-xfer agent record (bad magic)".into()));
        }
        let version = r.u16("version")?;
        if version != RECORD_VERSION {
            return Err(r.err(format!(
                "agent record version {version}, this build reads {RECORD_VERSION}"
            )));
        }
        let len = r.u16("address length")? as usize;
        if len == 0 || len > MAX_ADDR {
            return Err(r.err(format!("address of {len} bytes (1..={MAX_ADDR})")));
        }
        let addr = String::from_utf8(r.take(len, "address")?.to_vec())
            .map_err(|_| r.err("address is not UTF-8".into()))?;
        r.finish("record")?;
        Ok(AgentRecord { addr })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_records_round_trip_and_refuse_garbage() {
        let r = AgentRecord {
            addr: "10.0.0.2:7100".into(),
        };
        let b = r.encode().unwrap();
        assert_eq!(AgentRecord::decode("a", &b).unwrap(), r);
        for cut in 0..b.len() {
            assert!(AgentRecord::decode("a", &b[..cut]).is_err());
        }
        let mut long = b.clone();
        long.push(b'x');
        assert!(AgentRecord::decode("a", &long).is_err());
        assert!(AgentRecord {
            addr: String::new()
        }
        .encode()
        .is_err());
        assert!(AgentRecord {
            addr: "x".repeat(MAX_ADDR + 1)
        }
        .encode()
        .is_err());
    }
}
