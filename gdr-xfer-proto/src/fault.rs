//! Why things fail, as values: the driver's own errors carried through the core unchanged
//! ([`DriverError`]), why a rail was paused ([`RailFault`]), where every rail stood when none
//! was left ([`RailReport`]), why a transfer was refused ([`Rejection`]) and why a connection
//! ended ([`Lost`]). Nothing here is text to parse: a driver gets its own error type back
//! ([`DriverError::downcast_ref`]) and every other case is a variant with its values.

use std::fmt;
use std::sync::Arc;

/// An error of the driver ([`crate::Io::Error`]), kept as the driver made it: shared, so that
/// it can be copied to every waiter of an outcome, and downcast back to the driver's type.
#[derive(Clone)]
pub struct DriverError(Arc<dyn std::error::Error + Send + Sync>);

impl DriverError {
    /// Wraps a driver's error.
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        DriverError(Arc::new(e))
    }

    /// The driver's error as its own type, when it is one.
    pub fn downcast_ref<T: std::error::Error + 'static>(&self) -> Option<&T> {
        self.0.downcast_ref::<T>()
    }

    /// The error itself.
    pub fn get(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl fmt::Debug for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for DriverError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// Two driver errors are equal when they are the same error (one copied to several
/// outcomes) or say the same: what a simulation compares.
impl PartialEq for DriverError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for DriverError {}

/// What the driver was asked to do when it failed ([`RailFault::Driver`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Posting requests or a message on one of the rail's queue pairs.
    Post,
    /// Making new queue pairs for a renewal.
    Create,
    /// Connecting new queue pairs to the peer's.
    Connect,
    /// Posting the probe that re-admits a rail.
    Probe,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Post => "posting",
            Step::Create => "making queue pairs",
            Step::Connect => "connecting queue pairs",
            Step::Probe => "posting the probe",
        })
    }
}

/// Why a rail was paused, or its renewal failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RailFault {
    /// A send request completed with an error status.
    Completion {
        /// The queue pair's number.
        qp_num: u32,
        /// The provider's status code.
        status: u32,
    },
    /// A receive completed with an error (its queue pair broke).
    Receive {
        /// The lane.
        lane: usize,
    },
    /// The driver failed at `step`.
    Driver {
        /// What it was doing.
        step: Step,
        /// What it said.
        error: DriverError,
    },
    /// The peer did not answer a renewal in time.
    Unanswered,
    /// The peer could not renew it (it refused the offer).
    Refused,
    /// The probe that re-admits the rail could not be posted.
    ProbeUnposted {
        /// Why.
        why: Unposted,
    },
}

impl RailFault {
    /// A [`RailFault::Driver`] of the driver's error `e` at `step`.
    pub fn driver(step: Step, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        RailFault::Driver {
            step,
            error: DriverError::new(e),
        }
    }
}

/// Why a rail's probe was not posted ([`RailFault::ProbeUnposted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unposted {
    /// The rail has no queue pair.
    NoQueuePair,
    /// Every send slot of the rail is in use.
    NoSendSlot,
    /// The new queue pair's send queue is full.
    QueueFull,
}

impl fmt::Display for RailFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RailFault::Completion { qp_num, status } => {
                write!(
                    f,
                    "a request on QP {qp_num:#x} completed with status {status}"
                )
            }
            RailFault::Receive { lane } => {
                write!(f, "a receive on lane {lane} completed with an error")
            }
            RailFault::Driver { step, error } => write!(f, "{step}: {error}"),
            RailFault::Unanswered => f.write_str("the peer did not answer the renewal"),
            RailFault::Refused => f.write_str("the peer could not renew it"),
            RailFault::ProbeUnposted { why } => write!(
                f,
                "posting the probe: {}",
                match why {
                    Unposted::NoQueuePair => "the rail has no queue pair",
                    Unposted::NoSendSlot => "no send slot for the probe",
                    Unposted::QueueFull => "the new queue pair's send queue is full",
                }
            ),
        }
    }
}

/// Why a connection to a peer ended ([`crate::Failure::PeerLost`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lost {
    /// This agent closed it (a disconnect).
    Disconnected,
    /// A control message of the peer's ended it: a goodbye ([`crate::TableError::Goodbye`],
    /// with the peer's words), or a message breaking the segment table's rules.
    Message {
        /// Which, with its values.
        why: crate::TableError,
    },
    /// The control link to the peer failed (reading or writing): the driver's error.
    Link {
        /// What the driver said.
        error: DriverError,
    },
    /// The handshake did not complete (no transfer can have used the connection yet: its
    /// error goes to whoever connected, or to the log of an accepted connection).
    Handshake,
    /// The directory no longer lists the peer (its record's lease ended).
    Unlisted,
    /// This agent's engine failed handling one of the connection's completions (a bug).
    EngineFault,
}

impl fmt::Display for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lost::Disconnected => f.write_str("disconnected by this agent"),
            Lost::Message { why } => write!(f, "{why}"),
            Lost::Link { error } => write!(f, "control connection: {error}"),
            Lost::Handshake => f.write_str("the handshake did not complete"),
            Lost::Unlisted => f.write_str(
                "its directory record is gone: its lease ended (the agent died or hung) or it withdrew",
            ),
            Lost::EngineFault => {
                f.write_str("the engine failed handling one of its completions (a bug)")
            }
        }
    }
}

impl std::error::Error for Lost {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Lost::Link { error } => Some(error),
            _ => None,
        }
    }
}

/// Where one rail to a peer stood when no rail was left ([`crate::Failure::NoRail`],
/// [`crate::Event::NoRail`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RailReport {
    /// The rail.
    pub rail: usize,
    /// Its state.
    pub state: crate::RailState,
    /// Why it was last paused, or its renewal failed, if it was.
    pub last_error: Option<RailFault>,
}

impl fmt::Display for RailReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rail {} {:?}", self.rail, self.state)?;
        match &self.last_error {
            Some(e) => write!(f, ": {e}"),
            None => Ok(()),
        }
    }
}

/// Every rail's [`RailReport`], in rail order; shown as `rail 0 Paused: ...; rail 1 ...`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RailReports(pub Vec<RailReport>);

impl std::ops::Deref for RailReports {
    type Target = [RailReport];
    fn deref(&self) -> &[RailReport] {
        &self.0
    }
}

impl fmt::Display for RailReports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// Why a transfer was refused for its own sake (nothing else is affected).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// Neither runs nor a notification.
    Empty,
    /// A notification longer than the connection carries ([`crate::Config::notify_max`]).
    NotificationTooLong {
        /// Its bytes.
        len: usize,
        /// The most the peer takes.
        max: u32,
    },
    /// A run of no bytes, or naming a local segment the transfer does not have.
    BadRun {
        /// The shortest run's length.
        min_len: u64,
        /// The largest local segment index a run names.
        max_local: u32,
        /// Local segments given.
        locals: u64,
    },
    /// A run names a local segment its transfer does not have (found while posting).
    UnknownLocal {
        /// The run.
        run: usize,
    },
    /// A range past the transfer's runs (a bug of the caller's cursor; nothing is posted).
    PastRuns {
        /// The run the range ends in (exclusive).
        end_run: usize,
        /// The transfer's runs.
        runs: usize,
    },
    /// A request's remote range overflows the address space.
    RemoteOverflow {
        /// Where it starts.
        addr: u64,
        /// Its bytes.
        len: u64,
    },
    /// Fewer remote keys than `remotes` segments on `rails` rails need.
    MissingKeys {
        /// Keys given.
        keys: usize,
        /// Remote segments the runs name.
        remotes: u64,
        /// Rails of the connection.
        rails: usize,
    },
    /// The driver refused to post one of its requests for the request's own reason (memory
    /// of another protection domain, a range outside its registration, a staging slot it
    /// does not have).
    Driver(DriverError),
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Empty => f.write_str("a transfer without runs and without a notification"),
            Rejection::NotificationTooLong { len, max } => write!(
                f,
                "a notification of {len} bytes; at most {max} can be sent to this peer"
            ),
            Rejection::BadRun {
                min_len,
                max_local,
                locals,
            } => write!(
                f,
                "a run of {min_len} bytes, or of local segment {max_local} ({locals} given)"
            ),
            Rejection::MissingKeys {
                keys,
                remotes,
                rails,
            } => write!(
                f,
                "{keys} remote keys for {remotes} remote segments on {rails} rails"
            ),
            Rejection::UnknownLocal { run } => {
                write!(
                    f,
                    "run {run} names a local segment the transfer does not have"
                )
            }
            Rejection::PastRuns { end_run, runs } => write!(
                f,
                "a range up to run {end_run}, past the transfer's {runs} runs"
            ),
            Rejection::RemoteOverflow { addr, len } => write!(
                f,
                "{len} bytes at remote address {addr:#x} overflow the address space"
            ),
            Rejection::Driver(e) => fmt::Display::fmt(e, f),
        }
    }
}

/// An error that is only its text: the errors of the simulated and scripted drivers (a real
/// driver has its own error type, e.g. gdr's).
#[cfg(any(test, feature = "sim"))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextError(pub String);

#[cfg(any(test, feature = "sim"))]
impl fmt::Display for TextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(any(test, feature = "sim"))]
impl std::error::Error for TextError {}

#[cfg(any(test, feature = "sim"))]
impl From<&str> for TextError {
    fn from(s: &str) -> Self {
        TextError(s.to_string())
    }
}

#[cfg(any(test, feature = "sim"))]
impl From<String> for TextError {
    fn from(s: String) -> Self {
        TextError(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn why_a_connection_ended_is_a_value_and_the_links_error_its_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let link = Lost::Link {
            error: DriverError::new(io),
        };
        assert_eq!(link.to_string(), "control connection: reset by peer");
        // The driver's own error, reachable through the standard chain and by its type.
        let source = link.source().expect("the link's error");
        assert_eq!(source.to_string(), "reset by peer");
        match &link {
            Lost::Link { error } => assert_eq!(
                error.downcast_ref::<std::io::Error>().map(|e| e.kind()),
                Some(std::io::ErrorKind::ConnectionReset)
            ),
            other => panic!("{other:?}"),
        }
        let bye = Lost::Message {
            why: crate::TableError::Goodbye {
                reason: "b shut down".into(),
            },
        };
        assert_eq!(bye.to_string(), "the peer said goodbye: b shut down");
        assert!(bye.source().is_none());
        assert_eq!(Lost::Disconnected.to_string(), "disconnected by this agent");
        assert!(Lost::Unlisted.to_string().contains("lease ended"));
        assert_ne!(Lost::Handshake, Lost::EngineFault);
    }
}
