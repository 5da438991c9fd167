"""Type stubs of the native module ``gdr._gdr`` (re-exported by ``gdr``)."""

import asyncio
from typing import Any, Coroutine, Dict, Generator, Iterable, List, Literal, Optional, Tuple, Union, final

__all__ = [
    "Agent",
    "DEFAULT_PREFIX",
    "Directory",
    "LocalList",
    "Notification",
    "NotificationStream",
    "Peer",
    "READ",
    "RemoteList",
    "RemoteSegment",
    "Segment",
    "Transfer",
    "WRITE",
    "__version__",
    "doctor",
    "inspect_memory",
    "_at_exit",
    "_error_for_test",
    "_release_stats",
    "_staged_read_for_test",
    "_staged_write_for_test",
]


__version__: str
WRITE: Literal["write"]
READ: Literal["read"]
DEFAULT_PREFIX: str

_Op = Literal["write", "read"]
_BlockIndices = Iterable[int]
_BytesLike = Union[bytes, bytearray, memoryview, str]

@final
class Notification:
    """A notification a peer sent (after a transfer's data, or alone)."""

    @property
    def peer(self) -> str:
        """The sending agent's name."""
    @property
    def data(self) -> bytes:
        """The bytes it carries."""

@final
class RemoteSegment:
    """A segment a peer announced."""

    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def length(self) -> int: ...
    @property
    def location(self) -> str:
        """``"cpu"``, ``"cpu:N"`` or ``"cuda:N"``."""
    def __len__(self) -> int: ...

@final
class Segment:
    """A registered segment of this agent's memory."""

    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def length(self) -> int: ...
    @property
    def location(self) -> str: ...
    @property
    def path(self) -> str:
        """``"host"``, ``"gpudirect-dmabuf"``, ``"gpudirect-peermem"`` or ``"staged: why"``."""
    def read(self, offset: int, length: int) -> bytes:
        """Copies ``length`` bytes at ``offset`` out of the segment (``OutOfSegment``)."""
    def write(self, offset: int, data: _BytesLike) -> None:
        """Copies ``data`` into the segment at ``offset`` (``OutOfSegment``)."""
    def __len__(self) -> int: ...

_TransferStats = Dict[str, Union[int, float]]

@final
class Transfer:
    """A submitted transfer. Its outcome comes only once its memory is quiet."""

    def wait(self, timeout_s: Optional[float] = None) -> _TransferStats:
        """Blocks (GIL released) until it finishes; returns ``bytes``, ``descriptors``,
        ``runs``, ``slices``, ``qps_used``, ``rails_used``, ``retried_slices``,
        ``time_to_post_s``, ``time_to_complete_s``, ``plan_time_s``, ``submit_time_s``.
        Raises its failure, or ``Timeout`` when ``timeout_s`` passes first."""
    def poll(self) -> Optional[_TransferStats]:
        """Its statistics if it finished, ``None`` while pending; raises its failure."""
    def cancel(self) -> None:
        """Stops it; ``wait`` then raises ``Cancelled`` (or succeeds if all had landed)."""
    def wait_async(self) -> "asyncio.Future[_TransferStats]":
        """A future of the running loop with ``wait``'s outcome, completed by gdr's asyncio
        thread (the loop never blocks). Cancelling it cancels the transfer."""
    def __await__(self) -> Generator[Any, None, _TransferStats]:
        """``await transfer``: as ``await transfer.wait_async()``."""
    @property
    def status(self) -> Literal["pending", "done", "failed"]: ...
    @property
    def done(self) -> bool: ...
    @property
    def bytes(self) -> int: ...
    @property
    def op(self) -> _Op: ...
    @property
    def peer(self) -> str: ...
    @property
    def timeout_s(self) -> float: ...

_RailStats = Dict[str, Any]

@final
class NotificationStream:
    """``Agent.notifications()``: ``async for note in agent.notifications():``."""

    def __aiter__(self) -> "NotificationStream": ...
    def __anext__(self) -> Coroutine[Any, Any, Notification]:
        """The next notification, taken by the awaiting task itself once one is queued (a
        task cancelled while it waits takes nothing); ``StopAsyncIteration`` once the agent is
        shut down and every notification was taken."""

@final
class Peer:
    """A connected peer agent."""

    @property
    def name(self) -> str: ...
    @property
    def is_connected(self) -> bool: ...
    @property
    def lost_reason(self) -> Optional[str]: ...
    def rail_stats(self) -> List[_RailStats]:
        """Per rail: ``rail``, ``device``, ``port``, ``state``, ``bytes``, ``slices``,
        ``errors``, ``retries``, ``renewals``, ``readmissions``, ``fences``,
        ``inflight_bytes``, ``throughput``, ``last_error``, ``last_failover_s``."""
    def segments(self) -> List[RemoteSegment]: ...
    def segment(self, name: str) -> Optional[RemoteSegment]: ...
    def wait_segment(self, name: str, timeout_s: Optional[float] = 5.0) -> RemoteSegment:
        """Waits (GIL released) until the peer announced ``name`` (``Timeout``, ``PeerLost``)."""
    def wait_segment_async(self, name: str) -> "asyncio.Future[RemoteSegment]":
        """``wait_segment`` as a future of the running loop (no timeout of its own: use
        ``asyncio.wait_for``); ``PeerLost``. Cancelling it only stops the wait."""
    def write(
        self,
        local_segment: Segment,
        local_offset: int,
        remote_segment: Union[RemoteSegment, int],
        remote_offset: int,
        length: int,
        *,
        notify: Optional[_BytesLike] = None,
        timeout_s: Optional[float] = None,
    ) -> Transfer:
        """One range from ``local_segment`` into the peer's segment."""
    def read(
        self,
        local_segment: Segment,
        local_offset: int,
        remote_segment: Union[RemoteSegment, int],
        remote_offset: int,
        length: int,
        *,
        notify: Optional[_BytesLike] = None,
        timeout_s: Optional[float] = None,
    ) -> Transfer:
        """One range from the peer's segment into ``local_segment``."""
    def transfer_blocks(
        self,
        op: _Op,
        local_segment: Segment,
        local_blocks: _BlockIndices,
        remote_segment: Union[RemoteSegment, int],
        remote_blocks: _BlockIndices,
        block_len: int,
        notify: Optional[_BytesLike] = None,
        timeout_s: Optional[float] = None,
        *,
        local_base: Optional[int] = None,
        remote_base: Optional[int] = None,
    ) -> Transfer:
        """Block ``local_blocks[i]`` to or from block ``remote_blocks[i]`` of the peer's
        segment, blocks of ``block_len`` bytes from ``local_base`` / ``remote_base``."""
    def transfer_pools(
        self,
        op: _Op,
        pools: Iterable[Tuple[Segment, int, Union[RemoteSegment, int], int]],
        local_blocks: _BlockIndices,
        remote_blocks: _BlockIndices,
        block_len: int,
        notify: Optional[_BytesLike] = None,
        timeout_s: Optional[float] = None,
        *,
        local_stride: Optional[int] = None,
        remote_stride: Optional[int] = None,
    ) -> Transfer:
        """The same blocks in every pool of a layered KV cache, one transfer: block
        ``local_blocks[i]`` of each ``(local_segment, local_base, remote_segment,
        remote_base)`` pool to or from block ``remote_blocks[i]`` of the peer's; block ``b``
        of a pool at its base plus ``b`` times the side's stride (``block_len`` by default)."""
    def transfer_indexed(
        self,
        op: _Op,
        local: LocalList,
        local_indices: _BlockIndices,
        remote: RemoteList,
        remote_indices: _BlockIndices,
        notify: Optional[_BytesLike] = None,
        timeout_s: Optional[float] = None,
    ) -> Transfer:
        """Entry ``local_indices[i]`` of a prepared local list to or from entry
        ``remote_indices[i]`` of this peer's prepared list (``IndexOutOfRange``,
        ``LengthMismatch``; ``ForeignObject`` for a list prepared on another connection)."""
    def send_notification(self, data: _BytesLike, *, timeout_s: Optional[float] = None) -> Transfer:
        """A message without a transfer; the peer takes it with ``wait_notification``."""

@final
class LocalList:
    """Ranges of this agent's segments checked once, named by index in
    ``Peer.transfer_indexed``."""

    def __new__(cls, ranges: Iterable[Tuple[Segment, int, int]]) -> "LocalList": ...
    def __len__(self) -> int: ...

@final
class RemoteList:
    """Ranges of one peer's segments checked once, named by index in its
    ``transfer_indexed``."""

    def __new__(
        cls, peer: Peer, ranges: Iterable[Tuple[Union[RemoteSegment, int], int, int]]
    ) -> "RemoteList": ...
    @property
    def peer(self) -> str:
        """The name of the peer it was prepared for."""
    def __len__(self) -> int: ...

@final
class Directory:
    """An etcd directory (one lease) agents publish themselves in and find peers through."""

    def __new__(
        cls,
        endpoints: Union[str, Iterable[str]],
        prefix: str = "/gdr-xfer/agents/",
        ttl_s: float = 10.0,
        timeout_s: float = 5.0,
    ) -> "Directory": ...
    @property
    def endpoints(self) -> List[str]: ...
    @property
    def prefix(self) -> str: ...
    @property
    def ttl_s(self) -> float:
        """The lease's TTL as etcd granted it."""
    @property
    def lease_id(self) -> int: ...
    @property
    def lease_lost(self) -> Optional[str]:
        """Why the lease was lost, or ``None`` while it holds."""
    @property
    def closed(self) -> bool: ...
    def close(self) -> None:
        """Lets the directory go; the lease is revoked once no published agent uses it."""
    def __enter__(self) -> "Directory": ...
    def __exit__(self, *args: Any) -> bool: ...

@final
class Agent:
    """A transfer agent: its rails, segments, peers and notifications."""

    def __new__(
        cls,
        name: str,
        device: Optional[str] = None,
        gid_index: Optional[int] = None,
        *,
        qps_per_peer: Optional[int] = None,
        connect_timeout_s: Optional[float] = None,
        default_timeout_s: Optional[float] = None,
    ) -> "Agent": ...
    @property
    def name(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def rails(self) -> List[Tuple[str, int]]: ...
    @property
    def pending_notifications(self) -> int: ...
    def listen(self, addr: str) -> str:
        """Accepts peers on ``addr`` (``"host:port"``); returns the address bound."""
    def connect(self, addr: str) -> Peer:
        """Connects (GIL released) to the agent listening at ``addr``."""
    def connect_async(self, addr: str) -> "asyncio.Future[Peer]":
        """``connect`` as a future of the running loop. Cancelling it loses nothing: a peer
        connected meanwhile stays connected."""
    def publish(self, directory: Directory, advertise_addr: str) -> None:
        """Publishes this agent (``advertise_addr``: ``"ip:port"``) and its segments in
        ``directory``; the name stays this agent's until it shuts down (``NameTaken`` for a
        name a live agent holds)."""
    def connect_named(self, directory: Directory, name: str, timeout_s: float = 10.0) -> Peer:
        """Finds ``name`` in ``directory`` and connects to it (``UnknownPeer`` after
        ``timeout_s``)."""
    def connect_named_async(
        self, directory: Directory, name: str, timeout_s: float = 10.0
    ) -> "asyncio.Future[Peer]":
        """``connect_named`` as a future of the running loop. Cancelling it loses nothing."""
    def wait_peer(self, name: str, timeout_s: Optional[float] = 10.0) -> Peer: ...
    def wait_peer_async(self, name: str) -> "asyncio.Future[Peer]":
        """``wait_peer`` as a future of the running loop (no timeout of its own: use
        ``asyncio.wait_for``); ``AgentClosed``. Cancelling it only stops the wait."""
    def peer(self, name: str) -> Optional[Peer]: ...
    def peers(self) -> List[Peer]: ...
    def disconnect(self, peer: Peer) -> None:
        """Closes the connection to ``peer``: transfers in flight stop, each ending
        ``PeerLost`` (or success, if all its bytes had landed) once neither side's memory can be
        touched by it, then the peer is told goodbye; ``ForeignObject`` for another agent's
        peer, whose connection is left as it is."""
    def register(self, obj: Any, name: str = "") -> Segment:
        """Registers a writable, C-contiguous tensor or buffer: CUDA tensors through DLPack
        (GPUDirect, else staged: ``Segment.path`` says), host memory through the buffer
        protocol (numpy, bytearray, mmap) or DLPack (torch CPU tensors); the segment keeps
        ``obj`` and its export until no request uses it (``NotABuffer``, ``ReadOnlyBuffer``,
        ``NotContiguous``, ``NotPlainData`` (Python objects, pointers), ``TooLarge``,
        ``Unsupported`` for managed memory,
        ``NotGpuMemory``)."""
    def alloc(self, length: int, name: str = "") -> Segment:
        """Allocates and registers ``length`` zeroed bytes."""
    def deregister(self, segment: Segment) -> None:
        """Removes ``segment`` from the peers' tables and this agent's transfers;
        ``ForeignObject`` for another agent's segment, ``UnknownSegment`` once deregistered."""
    def segments(self) -> List[Segment]: ...
    def wait_notification(self, timeout_s: Optional[float] = None) -> Optional[Notification]:
        """The next notification (GIL released); ``None`` when ``timeout_s`` passes first."""
    def take_notifications(self) -> List[Notification]: ...
    def notifications(self) -> NotificationStream:
        """The notifications as an async iterator (ends once the agent is shut down)."""
    def staging_stats(self) -> Dict[str, Any]:
        """``gpus``, ``buffers``, ``active_transfers``, ``transfers``, ``chunks``, ``bytes``,
        ``waited_for_nic``, ``waiting_now``, ``chunks_in_use``."""
    def cache_stats(self) -> Dict[str, int]:
        """``hits``, ``registrations``, ``merged``."""
    def shutdown(self, grace_s: float = 0.0) -> Dict[str, int]:
        """Ends the agent; returns ``{"pending": n, "failed": m}``."""
    def __enter__(self) -> "Agent": ...
    def __exit__(self, *args: Any) -> bool: ...

def _error_for_test(cls: str) -> Optional[BaseException]: ...
def _at_exit() -> None: ...
def _release_stats() -> Dict[str, int]: ...
def _staged_read_for_test(obj: Any) -> Tuple[bytes, bytes]:
    """A CUDA tensor's bytes through gdr's staging pipeline and its synchronous copy."""
def _staged_write_for_test(obj: Any, data: _BytesLike) -> None:
    """Writes ``data`` into a CUDA tensor through gdr's staging pipeline."""

def inspect_memory(obj: Any) -> Dict[str, Any]:
    """What gdr would register for ``obj`` (no agent needed): ``protocol``, ``device``,
    ``address``, ``length``; for CUDA memory gdr's pointer checks, the GPU, ``dma_buf``,
    ``dma_buf_export``, ``peer_memory``, ``path`` and ``why``. Raises ``Unsupported`` for
    managed memory, ``NotGpuMemory``, and what ``Agent.register`` raises for the object."""

def doctor(snapshot: Optional[str] = None) -> Dict[str, Any]:
    """The report of ``gdr doctor --json`` for this machine (or a saved snapshot) as a dict."""
