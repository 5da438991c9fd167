"""gdr: a GPUDirect RDMA transfer engine (Rust's gdr-xfer) for Python.

One :class:`Agent` per process owns its rails (RDMA ports), its registered :class:`Segment` s
and its :class:`Peer` s. Transfers are one-sided RDMA READs and WRITEs of byte ranges or of
block tables (the paged form of a KV cache), with an optional notification that reaches the
target only after every byte landed there.

Memory registered from Python (``Agent.register(tensor, name)``) is held by its segment: the
segment keeps a reference to the object and its export (buffer protocol, or DLPack for torch,
cupy and jax tensors, CUDA ones included) until it is deregistered, its handle is gone and no
request in flight uses it. ``del tensor`` during a transfer is harmless.
:func:`inspect_memory` tells what gdr would register for an object and how the NIC would
reach it; :func:`doctor` is ``gdr doctor``'s report as a dict.

The target (decode side)::

    import numpy as np, gdr

    agent = gdr.Agent("decode-0", device="mlx5_0")
    pool = np.zeros((1024, 65536), dtype=np.uint8)
    agent.register(pool, "kv-pool")
    agent.listen("0.0.0.0:7100")
    note = agent.wait_notification(timeout_s=30)   # after the data: blocks are in pool

The initiator (prefill side), in another process::

    agent = gdr.Agent("prefill-0", device="mlx5_0")
    kv = np.random.randint(0, 256, (128, 65536), dtype=np.uint8)
    local = agent.register(kv, "kv-cache")
    peer = agent.connect("10.0.0.1:7100")
    pool = peer.wait_segment("kv-pool", timeout_s=5)
    t = peer.transfer_blocks("write", local, range(128), pool, range(512, 640), 65536,
                             notify=b"req-42", timeout_s=5)
    stats = t.wait()          # {"bytes": 8388608, "slices": ..., ...}

With asyncio, ``await t`` (or ``await t.wait_async()``), ``async for note in
agent.notifications()``, ``await agent.connect_async(addr)``, ``await
agent.wait_peer_async(name)`` and ``await peer.wait_segment_async(name)`` wait without blocking
the event loop.

Peers can find each other by name through etcd: one :class:`Directory` per process, shared by
its agents; the target publishes itself, the initiator connects by name::

    directory = gdr.Directory("127.0.0.1:2379")          # etcd's client address
    agent.publish(directory, "10.0.0.1:7100")            # on the target, after listen()
    peer = agent.connect_named(directory, "decode-0")    # on the initiator
    peer = await agent.connect_named_async(directory, "decode-0")   # or, with asyncio

Every blocking call releases the GIL. Errors are the classes of :mod:`gdr._errors`, one per
variant of the engine's error, all derived from :class:`GdrError`.
"""

import atexit as _atexit

from ._errors import (
    AgentClosed,
    BlockOutOfSegment,
    Cancelled,
    DeviceNotFound,
    DirectoryError,
    NameTaken,
    ForeignObject,
    ForeignSegment,
    GdrError,
    IndexOutOfRange,
    InvalidArgument,
    IoError,
    LengthMismatch,
    NoRail,
    NotABuffer,
    NotContiguous,
    NotPlainData,
    OutOfSegment,
    PeerLost,
    ProtocolError,
    RdmaError,
    ReadOnlyBuffer,
    Rejected,
    SliceFailed,
    StagingFailed,
    Timeout,
    TooLarge,
    UnknownPeer,
    UnknownSegment,
    Unsupported,
    NotGpuMemory,
)
from ._gdr import (
    DEFAULT_PREFIX,
    READ,
    WRITE,
    Agent,
    Directory,
    LocalList,
    Notification,
    NotificationStream,
    Peer,
    RemoteList,
    RemoteSegment,
    Segment,
    Transfer,
    __version__,
    doctor,
    inspect_memory,
)
from . import _gdr

# Before the interpreter finalizes: buffers whose registrations ended are given back, and the
# release thread stops asking for the GIL (see gdr-py/src/release.rs).
_atexit.register(_gdr._at_exit)

__all__ = [
    "Agent",
    "Directory",
    "DEFAULT_PREFIX",
    "Peer",
    "Segment",
    "RemoteSegment",
    "LocalList",
    "RemoteList",
    "Transfer",
    "Notification",
    "NotificationStream",
    "READ",
    "WRITE",
    "__version__",
    "doctor",
    "inspect_memory",
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
