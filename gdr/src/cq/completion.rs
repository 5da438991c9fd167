//! One reaped work completion, typed.

use crate::error::{Error, Hint, Result};
use crate::qp::WorkQueue;

use super::{WcOpcode, WcStatus};

/// One reaped work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Completion {
    /// The id the application gave the request.
    pub wr_id: u64,
    /// Success or the error.
    pub status: WcStatus,
    /// What the request was (valid on success).
    pub opcode: WcOpcode,
    /// Bytes received (receives) or transferred (reads/atomics).
    pub byte_len: u32,
    /// Immediate data, host byte order, when the sender attached one.
    pub imm: Option<u32>,
    /// The local queue pair number.
    pub qp_num: u32,
    /// Provider-specific error code.
    pub vendor_err: u32,
    /// Whether it completes a receive request (as opposed to a send-queue request).
    pub is_recv: bool,
    /// Whether the async layer (`gdr::aio`) posted the request, with an id of its own: it routes
    /// such completions by this provenance, never by comparing ids with requests posted by hand.
    pub(crate) owned: bool,
}

impl Completion {
    /// The work queue the request was posted to.
    pub fn queue(&self) -> WorkQueue {
        if self.is_recv {
            WorkQueue::Recv
        } else {
            WorkQueue::Send
        }
    }
}

impl Completion {
    /// Whether the request succeeded.
    pub fn is_ok(&self) -> bool {
        self.status == WcStatus::Success
    }

    /// `Ok(self)` on success, otherwise an [`Error::Completion`] with the status's hint.
    pub fn result(&self) -> Result<&Self> {
        if self.is_ok() {
            Ok(self)
        } else {
            Err(Error::Completion {
                wr_id: self.wr_id,
                queue: self.queue(),
                status: self.status,
                qp_num: self.qp_num,
                vendor_err: self.vendor_err,
                hint: self.status.hint().map(Hint::new).unwrap_or_default(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_completion_becomes_a_matchable_error_with_hint() {
        let c = Completion {
            wr_id: 9,
            status: WcStatus::RetryExceeded,
            qp_num: 0x11,
            ..Default::default()
        };
        let e = c.result().unwrap_err();
        assert!(matches!(
            e,
            Error::Completion {
                wr_id: 9,
                status: WcStatus::RetryExceeded,
                queue: WorkQueue::Send,
                qp_num: 0x11,
                ..
            }
        ));
        let e = e.to_string();
        assert!(e.starts_with("work request 9 (send queue of QP 0x11) completed with transport retry counter exceeded (RetryExceeded"), "{e}");
        assert!(e.contains("hint: the peer did not acknowledge"), "{e}");
        assert!(Completion::default().result().is_ok());
    }
}
