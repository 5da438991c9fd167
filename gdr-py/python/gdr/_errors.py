"""The exceptions of gdr: one class per variant of the Rust engine's error (``gdr_xfer::Error``).

Every exception gdr raises is a :class:`GdrError`. The native module picks the class by matching
the Rust error's variant (never by reading its text) and sets the variant's fields as attributes
(``hint`` on every one: how to fix it, or ``None``). Where a built-in exception names the same
concept, the class derives from it too, so ``except ValueError`` or ``except TimeoutError`` catch
gdr's errors as well::

    GdrError
    +-- InvalidArgument (ValueError)       bad input; nothing was done
    |   +-- TooLarge                       a name or notification over its bound
    |   +-- OutOfSegment                   a range outside its segment
    |   +-- BlockOutOfSegment              a block outside its segment
    |   +-- LengthMismatch                 a descriptor's sides differ in length
    |   +-- IndexOutOfRange (IndexError)   a block index outside its segment or list
    |   +-- ForeignObject                  another agent's segment or peer, another connection's list
    |   |   +-- ForeignSegment             a transfer's local segment belongs to another agent
    |   +-- NotABuffer (TypeError)         register() of an object without the buffer protocol
    |   +-- ReadOnlyBuffer                 register() of a read-only buffer
    |   +-- NotContiguous                  register() of a buffer that is not C-contiguous
    |   +-- NotPlainData                   register() of Python objects or pointers (dtype=object)
    +-- UnknownSegment (LookupError)       a segment id that names no segment
    +-- UnknownPeer (LookupError)          no peer of that name
    +-- PeerLost (ConnectionError)         the peer is gone; its transfers failed
    +-- Timeout (TimeoutError)             a deadline passed
    +-- Cancelled                          Transfer.cancel()
    +-- Rejected                           the engine refused one of the transfer's requests
    +-- SliceFailed                        a request completed with an error
    +-- NoRail                             every rail to the peer failed
    +-- AgentClosed                        the agent was shut down
    +-- ProtocolError                      a peer sent something malformed
    +-- StagingFailed                      staging GPU memory through bounce buffers failed
    +-- DirectoryError                     the etcd directory failed
    |   +-- NameTaken                      the name is held by another agent (publish)
    +-- IoError (OSError)                  a socket or thread call failed (errno set)
    +-- RdmaError                          gdr (verbs, CUDA) failed; errno set where known
        +-- DeviceNotFound                 no RDMA device matches the selection
        +-- Unsupported                    the device, driver or kernel lacks a capability
        +-- NotGpuMemory (ValueError)      CUDA memory expected, host memory found
"""

from typing import Optional

__all__ = [
    "GdrError",
    "InvalidArgument",
    "TooLarge",
    "OutOfSegment",
    "BlockOutOfSegment",
    "LengthMismatch",
    "IndexOutOfRange",
    "ForeignObject",
    "ForeignSegment",
    "NotABuffer",
    "ReadOnlyBuffer",
    "NotContiguous",
    "NotPlainData",
    "UnknownSegment",
    "UnknownPeer",
    "PeerLost",
    "Timeout",
    "Cancelled",
    "Rejected",
    "SliceFailed",
    "NoRail",
    "AgentClosed",
    "ProtocolError",
    "StagingFailed",
    "DirectoryError",
    "NameTaken",
    "IoError",
    "RdmaError",
    "DeviceNotFound",
    "Unsupported",
    "NotGpuMemory",
]


class GdrError(Exception):
    """Base class of every error gdr raises."""

    #: How to fix it (``None`` when the engine has no advice).
    hint: Optional[str] = None


class InvalidArgument(GdrError, ValueError):
    """An argument is invalid; nothing was done (``gdr_xfer::Error::InvalidArgument``)."""


class TooLarge(InvalidArgument):
    """Something is larger than its bound (a name, a notification); nothing was sent.

    Attributes: ``what``, ``length``, ``max``.
    """


class OutOfSegment(InvalidArgument):
    """A range does not lie inside its segment; nothing was done.

    Attributes: ``index`` (descriptor position or ``None``), ``side`` (``"local"`` or
    ``"remote"``), ``segment``, ``offset``, ``length``, ``segment_len``.
    """


class BlockOutOfSegment(InvalidArgument):
    """A block does not lie inside its segment; nothing was posted.

    Attributes: ``pool``, ``side``, ``block``, ``segment``, ``offset``, ``block_len``,
    ``segment_len``.
    """


class LengthMismatch(InvalidArgument):
    """The two sides of a descriptor differ in length.

    Attributes: ``index``, ``local_len``, ``remote_len``.
    """


class IndexOutOfRange(InvalidArgument, IndexError):
    """A block index or list index is out of range; nothing was posted.

    Attributes: ``list``, ``index``, ``length``.
    """


class ForeignObject(InvalidArgument):
    """A call was given another agent's object (a segment to ``deregister``, a peer to
    ``disconnect``), or a ``RemoteList`` prepared on another connection (another agent's, or an
    earlier connection to a peer of the same name): refused before anything changed; the
    connections of both agents are unaffected.

    Attributes: ``call`` (the engine's call, ``"Agent::deregister"``, ...), ``kind``
    (``"segment"``, ``"peer"`` or ``"remote list"``), ``segment`` (the segment's id, or
    ``None``), ``peer`` (the peer's name, or ``None``).
    """


class ForeignSegment(ForeignObject):
    """A transfer's local segment belongs to another agent; nothing was posted.

    Attributes: ``index``, ``segment``.
    """


class NotABuffer(InvalidArgument, TypeError):
    """``Agent.register`` was given an object that does not export the buffer protocol."""


class ReadOnlyBuffer(InvalidArgument):
    """``Agent.register`` was given a read-only buffer.

    Every segment is published to the agent's peers with remote write access, and is the target
    of local READs: the NIC may write any segment, so only writable memory is registered.
    """


class NotContiguous(InvalidArgument):
    """``Agent.register`` was given a buffer that is not C-contiguous (a strided view)."""


class NotPlainData(InvalidArgument):
    """``register()`` of a buffer whose items are not plain data: Python objects (numpy
    ``dtype=object``, struct format ``O``) or pointers (``P``). A peer may write any byte of a
    segment, so such memory is never registered."""


class UnknownSegment(GdrError, LookupError):
    """A segment id names no segment (never registered, or deregistered since).

    Attributes: ``owner`` (``"local"`` or the peer's name), ``segment``.
    """


class UnknownPeer(GdrError, LookupError):
    """No peer of that name is known. Attributes: ``name``."""


class PeerLost(GdrError, ConnectionError):
    """The peer is gone: every transfer pending to it failed. Attributes: ``peer``, ``reason``
    (in words) and ``why``: ``"disconnected"`` (by this agent), ``"goodbye"`` (the peer said so;
    ``reason`` has its words), ``"protocol"`` (the peer broke the protocol), ``"link"`` (the
    control link failed), ``"handshake"``, ``"unlisted"`` (its directory record is gone) or
    ``"engine_fault"`` (a bug in gdr)."""


class Timeout(GdrError, TimeoutError):
    """A deadline passed. Attributes: ``what``, ``after_s``."""


class Cancelled(GdrError):
    """The transfer was cancelled (``Transfer.cancel``); its memory is quiet. Attributes:
    ``peer``."""


class Rejected(GdrError):
    """The engine refused one of the transfer's requests; only that transfer failed.

    Attributes: ``peer``, ``detail``.
    """


class SliceFailed(GdrError):
    """A request of the transfer completed with an error; only that transfer failed.

    Attributes: ``peer``, ``qp_num``, ``status``, ``vendor_err``.
    """


class NoRail(GdrError):
    """Every rail to the peer failed and none was re-admitted yet. Attributes: ``peer``,
    ``detail``."""


class AgentClosed(GdrError):
    """The agent was shut down (``Agent.shutdown``, or dropped)."""


class ProtocolError(GdrError):
    """A peer sent something malformed or hostile. Attributes: ``peer``, ``detail``."""


class StagingFailed(GdrError):
    """Staging GPU memory through host bounce buffers failed. Attributes: ``peer``,
    ``detail``."""


class DirectoryError(GdrError):
    """The metadata directory (etcd) failed. Attributes: ``op``, ``key``, ``detail``."""


class NameTaken(DirectoryError):
    """A directory name is held by another agent (``Agent.publish`` of a name a live agent
    published): nothing was put, and the holder's records are untouched. The name is free again
    once the holder withdraws (shutdown) or its lease ends. Attributes: ``call``, ``name``,
    ``key`` (the etcd key found held), ``holder_lease`` (its lease id; 0 for none)."""


class IoError(GdrError, OSError):
    """An operating-system call failed (sockets, threads). Attributes: ``what``, ``errno``."""


class RdmaError(GdrError):
    """A gdr call failed (device, registration, queue pair, CUDA). Attributes: ``errno``
    (``None`` unless the operating system gave one)."""


class DeviceNotFound(RdmaError):
    """No RDMA device matches the selection. Attributes: ``wanted``, ``available``."""


class Unsupported(RdmaError):
    """The device, driver or kernel lacks a capability the operation needs. Attributes:
    ``what``."""


class NotGpuMemory(RdmaError, ValueError):
    """gdr's pointer check found host memory where CUDA device memory was expected. Attributes:
    ``address``, ``kind`` (what ``cuPointerGetAttributes`` says it is: ``"host-pinned"``,
    ``"pageable-host"``)."""
