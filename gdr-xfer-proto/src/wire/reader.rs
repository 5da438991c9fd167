//! A bounds-checked reader over a received message: every read names what it reads, and
//! running past the end is a [`WireError::Protocol`] naming the peer.

use super::{Codec, WireError, MAX_NAME, MAX_QPS, MAX_SEGMENTS_PER_MESSAGE};

pub(super) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    peer: &'a str,
}

impl<'a> Reader<'a> {
    pub(super) fn new(peer: &'a str, buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0, peer }
    }

    pub(super) fn err(&self, detail: String) -> WireError {
        WireError::Protocol {
            peer: self.peer.to_string(),
            detail,
        }
    }

    /// An error unless every byte was read.
    pub(super) fn finish(&self, what: &str) -> Result<(), WireError> {
        if self.pos != self.buf.len() {
            return Err(self.err(format!(
                "{} trailing bytes after the {what}",
                self.buf.len() - self.pos
            )));
        }
        Ok(())
    }

    pub(super) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], WireError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                self.err(format!(
                    "message ends inside the {what} ({} bytes left, {n} needed)",
                    self.buf.len() - self.pos
                ))
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], WireError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(super) fn u8(&mut self, what: &str) -> Result<u8, WireError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(super) fn u16(&mut self, what: &str) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    pub(super) fn u32(&mut self, what: &str) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    pub(super) fn u64(&mut self, what: &str) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    /// A u16 count of segment entries or ids, within [`MAX_SEGMENTS_PER_MESSAGE`].
    pub(super) fn count(&mut self, what: &str) -> Result<usize, WireError> {
        let n = self.u16(what)? as usize;
        if n > MAX_SEGMENTS_PER_MESSAGE {
            return Err(self.err(format!(
                "{what} {n} exceeds the limit {MAX_SEGMENTS_PER_MESSAGE}"
            )));
        }
        Ok(n)
    }

    /// A queue pair count and that many endpoints, each decoded by `C`.
    pub(super) fn endpoints<C: Codec>(&mut self) -> Result<Vec<C::Endpoint>, WireError> {
        let n = self.u8("queue pair count")? as usize;
        if n == 0 || n > MAX_QPS {
            return Err(self.err(format!("{n} queue pairs (must be 1..={MAX_QPS})")));
        }
        let mut endpoints = Vec::with_capacity(n);
        for i in 0..n {
            let len = self.u16("endpoint length")? as usize;
            let body = self.take(len, "endpoint")?;
            let e = C::decode_endpoint(body).map_err(|e| self.err(format!("endpoint {i}: {e}")))?;
            endpoints.push(e);
        }
        Ok(endpoints)
    }

    /// A u8 length and that many bytes of UTF-8, within [`MAX_NAME`].
    pub(super) fn name(&mut self, what: &str) -> Result<String, WireError> {
        let len = self.u8(what)? as usize;
        if len > MAX_NAME {
            return Err(self.err(format!("{what} of {len} bytes (at most {MAX_NAME})")));
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.err(format!("{what} is not UTF-8")))
    }
}
