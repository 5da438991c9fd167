"""``nixl_agent`` on gdr's engine: NIXL's Python API (``nixl._api``), the names, arguments,
return values and states its connectors call, over :class:`gdr.Agent`.

How NIXL's concepts land on gdr's:

- An agent is a :class:`gdr.Agent` that listens on this host (``GDR_ADVERTISE_HOST``, else the
  RDMA device's IPv4 GID) from the start. Its metadata (``get_agent_metadata``) is its name and
  that address; ``add_remote_agent`` connects to it. Registrations travel over the connection,
  so a peer sees memory registered after the metadata was taken, too.
- A registered descriptor is a segment named by its address (:mod:`gdr._by_address`);
  a prepared descriptor list is a :class:`gdr.LocalList` or :class:`gdr.RemoteList` (ranges
  checked once); a prepared transfer is ``Peer.transfer_indexed`` over them, submitted anew
  by each ``transfer``.
- Rails: ``UCX_NET_DEVICES`` and ``UCX_IB_GID_INDEX`` choose them as they choose UCX's
  (``rxe0:1``; unset: every active port); ``GDR_DEVICE``, ``GDR_GID_INDEX`` and
  ``GDR_QPS_PER_PEER`` override (:func:`gdr._by_address.rails_from_env`).

Where NIXL's contract is unsafe, gdr's rules apply (listed in :mod:`gdr.nixl`).
"""

import itertools
import pickle
import time
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

import gdr

from .. import _by_address as by_address
from . import _errors as err
from ._descs import expand_strided, from_input, mem_type_of, nixlRegDList, nixlXferDList

#: NIXL's default port of the metadata listener (unused: see ``send_local_metadata``).
DEFAULT_COMM_PORT = 8888
#: The name ``prep_xfer_dlist`` takes for this agent's own side of a transfer.
NIXL_INIT_AGENT = "NIXL_INIT_AGENT"
#: Backends that are RDMA networks, all of which gdr's engine stands for.
NETWORK_BACKENDS = ("UCX", "UCX_MO", "LIBFABRIC", "UCCL", "Mooncake", "GDR")
_METADATA_MAGIC = b"gdr.nixl/1 "
#: The memory types a backend reports, by NIXL's names for them.
_MEM_SEGS = ("DRAM_SEG", "VRAM_SEG")


def _name(agent: Union[str, bytes]) -> str:
    """An agent's name as NIXL's calls take it: str or bytes."""
    return agent.decode() if isinstance(agent, (bytes, bytearray)) else str(agent)


def _message(msg: Union[bytes, bytearray, memoryview, str, None]) -> bytes:
    """A notification message as NIXL takes it: bytes, or str (sent as its UTF-8 bytes)."""
    if msg is None:
        return b""
    if isinstance(msg, str):
        return msg.encode()
    try:
        return bytes(msg)
    except TypeError:
        raise err.nixlInvalidParamError(f"a notification message is bytes or str, not {type(msg).__name__}") from None


def _why(e: BaseException) -> str:
    hint = getattr(e, "hint", None)
    return f"{e} (hint: {hint})" if hint and hint not in str(e) else str(e)


def _nixl_error(e: BaseException) -> Exception:
    """The NIXL class for a gdr error, its text and hint kept (raise ``from e``)."""
    if isinstance(e, (gdr.LengthMismatch,)):
        cls: type = err.nixlMismatchError
    elif isinstance(e, (gdr.UnknownSegment, gdr.UnknownPeer)):
        cls = err.nixlNotFoundError
    elif isinstance(e, gdr.PeerLost):
        cls = err.nixlRemoteDisconnectError
    elif isinstance(e, gdr.Cancelled):
        cls = err.nixlCancelledError
    elif isinstance(e, (gdr.InvalidArgument, TypeError, ValueError)):
        cls = err.nixlInvalidParamError
    elif isinstance(e, gdr.Unsupported):
        cls = err.nixlNotSupportedError
    else:
        cls = err.nixlBackendError
    return cls(_why(e))


class nixl_thread_sync_t:
    """NIXL's thread synchronization modes. gdr's agent is thread-safe in every mode."""

    NIXL_THREAD_SYNC_NONE = 0
    NIXL_THREAD_SYNC_STRICT = 1
    NIXL_THREAD_SYNC_RW = 2
    NIXL_THREAD_SYNC_DEFAULT = 3


class nixl_agent_config:
    """NIXL's agent configuration, with its arguments and defaults. ``backends`` must name RDMA
    network backends (``UCX`` and the like: gdr's engine serves them all); ``num_threads``,
    ``enable_prog_thread`` and ``sync_mode`` are accepted and change nothing (gdr's progress
    threads are its own); ``enable_listen_thread``/``listen_port`` name NIXL's metadata
    listener, which the drop-in does not run (``send_local_metadata``)."""

    def __init__(
        self,
        enable_prog_thread: bool = True,
        enable_listen_thread: bool = False,
        listen_port: int = DEFAULT_COMM_PORT,
        capture_telemetry: bool = False,
        num_threads: int = 0,
        backends: List[str] = ["UCX"],  # noqa: B006 - NIXL's signature
        sync_mode: Optional[int] = None,
    ):
        self.backends = list(backends)
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads
        self.sync_mode = sync_mode


class nixl_prepped_dlist_handle:
    """A prepared descriptor list: this agent's side (a :class:`gdr.LocalList`) or a remote
    agent's (a :class:`gdr.RemoteList`). Releasing it while a prepared transfer uses it is
    harmless: the transfer keeps what it needs."""

    __slots__ = ("_handle", "_agent", "_released", "_list", "_peer", "_count", "_segments")

    def __init__(self, agent: "nixl_agent", value: int, lst: Any, peer: Optional[str], count: int, segments: frozenset):
        self._handle = value
        self._agent = agent
        self._released = False
        self._list = lst
        self._peer = peer
        self._count = count
        self._segments = segments

    def __repr__(self) -> str:
        return f"nixl_prepped_dlist_handle(0x{self._handle:x}, released={self._released})"

    def release(self) -> None:
        self._released = True
        self._list = None


class nixl_xfer_handle:
    """A transfer request: what to move, and its latest submission (a :class:`gdr.Transfer`).
    Releasing it while its transfer is in flight cancels the transfer; its memory stays
    registered until the NIC is done with it (gdr's rule)."""

    __slots__ = ("_handle", "_agent", "_released", "_request", "_transfer", "_state", "_error", "_backend")

    def __init__(self, agent: "nixl_agent", value: int, request: Optional[tuple], backend: str):
        self._handle = value
        self._agent = agent
        self._released = False
        self._request = request
        self._transfer: Optional[gdr.Transfer] = None
        self._state = "INIT"
        self._error: Optional[BaseException] = None
        self._backend = backend

    def __repr__(self) -> str:
        return f"nixl_xfer_handle(0x{self._handle:x}, released={self._released})"

    def release(self) -> None:
        if self._released:
            return
        t = self._transfer
        if t is not None and t.status == "pending":
            t.cancel()
        self._released = True
        self._transfer = None
        self._request = None

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - finalizers must not raise
            pass


class nixlXferTelemetry:
    """A transfer's telemetry, NIXL's fields: ``startTime``, ``postDuration``,
    ``xferDuration`` (microseconds), ``totalBytes``, ``descCount``."""

    __slots__ = ("startTime", "postDuration", "xferDuration", "totalBytes", "descCount")

    def __init__(self, start_us: int, post_us: int, xfer_us: int, total: int, count: int):
        self.startTime, self.postDuration, self.xferDuration = start_us, post_us, xfer_us
        self.totalBytes, self.descCount = total, count

    def __repr__(self) -> str:
        return (
            f"nixlXferTelemetry(startTime={self.startTime}, postDuration={self.postDuration}, "
            f"xferDuration={self.xferDuration}, totalBytes={self.totalBytes}, descCount={self.descCount})"
        )


class _Remote:
    """A connected remote agent: its peer, and its segments by address (refreshed when an
    address is not found: registrations arrive over the connection)."""

    def __init__(self, peer: gdr.Peer):
        self.peer = peer
        self.map = by_address.AddressMap()
        self.seen: set = set()

    def refresh(self) -> None:
        by_address.learn_segments(self.map, self.seen, self.peer.segments())

    def find(self, kind: str, dev: int, addr: int, length: int) -> Optional[Tuple[Any, int]]:
        hit = self.map.find(kind, dev, addr, length)
        if hit is None:
            self.refresh()
            hit = self.map.find(kind, dev, addr, length)
        return hit


class nixl_agent:
    """NIXL's agent on gdr's engine: ``nixl_agent(agent_name, nixl_conf=None,
    instantiate_all=False)``."""

    def __init__(self, agent_name: str, nixl_conf: Optional[nixl_agent_config] = None, instantiate_all: bool = False):
        conf = nixl_conf or nixl_agent_config()
        self._check_backends(conf.backends, "nixl_agent_config(backends=...)")
        device, gid, qps = by_address.rails_from_env()
        try:
            self._agent = gdr.Agent(agent_name, device=device, gid_index=gid, qps_per_peer=qps)
            host = by_address.advertise_host(self._agent.device)
            self._addr = self._agent.listen(f"{host}:0")
        except gdr.GdrError as e:
            raise err.nixlBackendError(f"nixl_agent({agent_name!r}): {_why(e)}") from e
        self.name = agent_name
        self.notifs: Dict[str, List[bytes]] = {}
        self.backends: Dict[str, int] = {b: i for i, b in enumerate(conf.backends)}
        self.backend_mems: Dict[str, List[str]] = {b: list(_MEM_SEGS) for b in conf.backends}
        self.backend_options: Dict[str, Dict[str, str]] = {b: {} for b in conf.backends}
        self.plugin_list = list(conf.backends) or ["UCX"]
        self._telemetry = conf.capture_telemetry
        self._local = by_address.AddressMap()
        self._remotes: Dict[str, _Remote] = {}
        self._serial = itertools.count(1)
        self._handles = itertools.count(1)
        self._sent: List[gdr.Transfer] = []
        self._inflight: List[Tuple[gdr.Transfer, frozenset]] = []

    # -- backends and plugins --------------------------------------------------------------

    @staticmethod
    def _check_backends(names: List[str], what: str) -> None:
        for b in names:
            if b not in NETWORK_BACKENDS:
                raise err.nixlNotFoundError(
                    f"{what}: unsupported backend {b!r}: gdr's drop-in moves memory over RDMA networks only "
                    f"({', '.join(NETWORK_BACKENDS)}); storage and other backends are not in gdr"
                )

    def get_plugin_list(self) -> List[str]:
        return list(self.plugin_list)

    def get_plugin_mem_types(self, backend: str) -> List[str]:
        return list(_MEM_SEGS) if backend in NETWORK_BACKENDS else []

    def get_plugin_params(self, backend: str) -> Dict[str, str]:
        return {}

    def get_backend_mem_types(self, backend: str) -> List[str]:
        return list(self.backend_mems.get(backend, []))

    def get_backend_params(self, backend: str) -> Dict[str, str]:
        return dict(self.backend_options.get(backend, {}))

    def create_backend(self, backend: str, initParams: Dict[str, str] = {}) -> None:  # noqa: B006
        self._check_backends([backend], "create_backend")
        self.backends.setdefault(backend, len(self.backends))
        self.backend_mems[backend] = list(_MEM_SEGS)
        self.backend_options[backend] = dict(initParams)
        if backend not in self.plugin_list:
            self.plugin_list.append(backend)

    def _backend(self, backends: List[str], what: str) -> str:
        for b in backends:
            if b not in self.backends:
                raise err.nixlNotFoundError(f"{what}: backend {b!r} was not created on agent {self.name!r}")
        return backends[0] if backends else next(iter(self.backends), "UCX")

    # -- memory ----------------------------------------------------------------------------

    def get_reg_descs(self, descs: Any, mem_type: Optional[str] = None) -> nixlRegDList:
        return from_input(nixlRegDList, descs, mem_type)  # type: ignore[return-value]

    def get_xfer_descs(self, descs: Any, mem_type: Optional[str] = None) -> nixlXferDList:
        return from_input(nixlXferDList, descs, mem_type)  # type: ignore[return-value]

    def register_memory(self, reg_list: Any, mem_type: Optional[str] = None, backends: List[str] = []) -> nixlRegDList:  # noqa: B006
        descs = self.get_reg_descs(reg_list, mem_type)
        self._backend(backends, "register_memory")
        kind = descs.getType()
        done = []
        try:
            for i, (addr, length, dev, _meta) in enumerate(descs):
                if descs._tensors is not None:
                    obj = descs._tensors[i]
                elif kind == "DRAM":
                    obj = by_address.host_range(addr, length)
                else:
                    obj = by_address.DeviceRange(addr, length, dev)
                name = by_address.segment_name(kind, dev, addr, length, next(self._serial))
                done.append((addr, length, dev, self._agent.register(obj, name)))
        except (gdr.GdrError, TypeError, ValueError) as e:
            for _, _, _, seg in done:
                self._agent.deregister(seg)
            raise _nixl_error(e) from e
        for addr, length, dev, seg in done:
            self._local.add(kind, dev, addr, length, seg)
        return descs

    def deregister_memory(self, dereg_list: nixlRegDList, backends: List[str] = []) -> None:  # noqa: B006
        descs = self.get_reg_descs(dereg_list)
        self._backend(backends, "deregister_memory")
        kind = descs.getType()
        missing = [d for d in descs if self._local.find(kind, d[2], d[0], d[1]) is None]
        if missing:
            a, n, dev, _ = missing[0]
            raise err.nixlNotFoundError(f"deregister_memory: {kind} {a:#x} of {n} bytes on device {dev} is not registered")
        segments = []
        for addr, length, dev, _ in descs:
            seg = self._local.remove(kind, dev, addr, length)
            if seg is None:
                raise err.nixlNotFoundError(
                    f"deregister_memory: {kind} {addr:#x} of {length} bytes on device {dev} was not registered as one range"
                )
            segments.append(seg)
        # gdr's rule where NIXL has none: this agent's transfers in flight on the memory are
        # stopped, and the call returns once they are quiet (a cancelled transfer's outcome
        # comes when none of its requests can touch its memory any more).
        ids = {seg.id for seg in segments}
        for t, used in self._inflight:
            if used & ids and t.status == "pending":
                t.cancel()
                try:
                    t.wait()
                except gdr.GdrError:
                    pass
        for seg in segments:
            try:
                self._agent.deregister(seg)
            except gdr.GdrError as e:
                raise _nixl_error(e) from e

    def query_memory(self, reg_list: Any, backend: str, mem_type: Optional[str] = None) -> List[Optional[Dict[str, str]]]:
        raise err.nixlNotSupportedError("query_memory: it asks storage backends about files and objects; gdr has none")

    # -- metadata and remote agents --------------------------------------------------------

    def get_agent_metadata(self) -> bytes:
        """This agent's name and where it listens; ``add_remote_agent`` on another agent
        connects there."""
        return _METADATA_MAGIC + pickle.dumps({"name": self.name, "addr": self._addr}, protocol=4)

    def get_partial_agent_metadata(self, descs: Any, inc_conn_info: bool = False, backends: List[str] = []) -> bytes:  # noqa: B006
        """The whole metadata: gdr's registrations travel over the connection on their own."""
        return self.get_agent_metadata()

    def add_remote_agent(self, metadata: bytes) -> bytes:
        """Connects to the agent the metadata names; returns its name, as bytes (as NIXL's
        does: every call that takes an agent's name takes bytes or str)."""
        if not isinstance(metadata, (bytes, bytearray)) or not bytes(metadata).startswith(_METADATA_MAGIC):
            raise err.nixlMismatchError(
                "add_remote_agent: not the metadata of a gdr.nixl agent (the metadata of NIXL's own agents cannot be "
                "loaded: both sides must use the same engine)"
            )
        try:
            md = pickle.loads(bytes(metadata)[len(_METADATA_MAGIC) :])
            name, addr = str(md["name"]), str(md["addr"])
        except Exception as e:  # noqa: BLE001 - malformed bytes of any kind
            raise err.nixlMismatchError(f"add_remote_agent: malformed metadata ({e})") from None
        if name == self.name:
            raise err.nixlNotSupportedError(
                f"add_remote_agent: {name!r} is this agent: loopback transfers are not supported by gdr's drop-in"
            )
        if name in self._remotes and self._remotes[name].peer.is_connected:
            return name.encode()
        peer = self._agent.peer(name)
        if peer is None:
            try:
                peer = self._agent.connect(addr)
            except gdr.InvalidArgument:
                # It connected to us meanwhile: one connection serves both directions.
                peer = self._agent.wait_peer(name, timeout_s=10)
            except gdr.GdrError as e:
                raise _nixl_error(e) from e
        if peer.name != name:
            raise err.nixlMismatchError(f"add_remote_agent: the agent at {addr} is {peer.name!r}, not {name!r}")
        self._remotes[name] = _Remote(peer)
        return name.encode()

    def remove_remote_agent(self, agent: Union[str, bytes]) -> None:
        agent = _name(agent)
        remote = self._remotes.pop(agent, None)
        if remote is None:
            raise err.nixlNotFoundError(f"remove_remote_agent: no remote agent {agent!r}")
        try:
            self._agent.disconnect(remote.peer)
        except gdr.GdrError as e:
            raise _nixl_error(e) from e

    def make_connection(self, remote_agent: str, backends: List[str] = []) -> None:  # noqa: B006
        """Connected already (``add_remote_agent`` connects)."""
        self._remote(remote_agent, "make_connection")

    def check_remote_metadata(self, agent: Union[str, bytes], descs: Optional[nixlXferDList] = None) -> bool:
        remote = self._remotes.get(_name(agent))
        if remote is None or not remote.peer.is_connected:
            return False
        if descs is None:
            return True
        kind = descs.getType()
        return all(remote.find(kind, dev, a, n) is not None for a, n, dev in descs)

    def _remote(self, name: Union[str, bytes], what: str) -> _Remote:
        name = _name(name)
        remote = self._remotes.get(name)
        if remote is None:
            raise err.nixlNotFoundError(f"{what}: no remote agent {name!r} (add_remote_agent first)")
        if not remote.peer.is_connected:
            raise err.nixlRemoteDisconnectError(f"{what}: remote agent {name!r} is gone: {remote.peer.lost_reason}")
        return remote

    def _no_listener(self, what: str) -> None:
        # NIXL raises nixlInvalidParamError here too when it has no listener or etcd.
        raise err.nixlInvalidParamError(
            f"{what}: gdr's drop-in runs no metadata listener or server; hand get_agent_metadata()'s bytes to "
            "add_remote_agent yourself (or use gdr.Directory for etcd)"
        )

    def send_local_metadata(self, ip_addr: str = "", port: int = DEFAULT_COMM_PORT) -> None:
        self._no_listener("send_local_metadata")

    def send_partial_agent_metadata(self, descs: Any, inc_conn_info: bool = False, backends: List[str] = [], ip_addr: str = "", port: int = DEFAULT_COMM_PORT, label: str = "") -> None:  # noqa: B006,E501
        self._no_listener("send_partial_agent_metadata")

    def fetch_remote_metadata(self, remote_agent: str, ip_addr: str = "", port: int = DEFAULT_COMM_PORT, label: str = "") -> None:
        self._no_listener("fetch_remote_metadata")

    def invalidate_local_metadata(self, ip_addr: str = "", port: int = DEFAULT_COMM_PORT) -> None:
        self._no_listener("invalidate_local_metadata")

    # -- descriptor lists and transfers ----------------------------------------------------

    def prep_xfer_dlist(self, agent_name: str, xfer_list: Any, mem_type: Optional[str] = None, backends: List[str] = []) -> nixl_prepped_dlist_handle:  # noqa: B006,E501
        self._backend(backends, "prep_xfer_dlist")
        if isinstance(xfer_list, np.ndarray) and xfer_list.ndim == 2 and xfer_list.shape[1] == 5:
            descs = nixlXferDList(mem_type_of(mem_type, "prep_xfer_dlist"), expand_strided(xfer_list))
        else:
            descs = self.get_xfer_descs(xfer_list, mem_type)
        kind = descs.getType()
        agent_name = _name(agent_name)
        local = agent_name in (NIXL_INIT_AGENT, "")
        if not local and agent_name == self.name:
            raise err.nixlNotSupportedError("prep_xfer_dlist: loopback (this agent as the remote side) is not supported by gdr's drop-in")
        remote = None if local else self._remote(agent_name, "prep_xfer_dlist")
        ranges = []
        for i, (addr, length, dev) in enumerate(descs):
            hit = self._local.find(kind, dev, addr, length) if remote is None else remote.find(kind, dev, addr, length)
            if hit is None:
                whose = "this agent" if remote is None else f"agent {agent_name!r}"
                raise err.nixlNotFoundError(
                    f"prep_xfer_dlist: descriptor {i} ({kind} {addr:#x}, {length} bytes, device {dev}) lies in no memory "
                    f"{whose} registered"
                )
            seg, off = hit
            ranges.append((seg, off, length))
        try:
            lst = gdr.LocalList(ranges) if remote is None else gdr.RemoteList(remote.peer, ranges)
        except gdr.GdrError as e:
            raise _nixl_error(e) from e
        segments = frozenset(seg.id for seg, _, _ in ranges) if local else frozenset()
        return nixl_prepped_dlist_handle(self, next(self._handles), lst, None if local else agent_name, len(ranges), segments)

    def make_prepped_xfer(
        self,
        operation: str,
        local_xfer_side: nixl_prepped_dlist_handle,
        local_indices: Union[List[int], np.ndarray],
        remote_xfer_side: nixl_prepped_dlist_handle,
        remote_indices: Union[List[int], np.ndarray],
        notif_msg: bytes = b"",
        backends: List[str] = [],  # noqa: B006
        skip_desc_merge: bool = False,
    ) -> nixl_xfer_handle:
        backend = self._backend(backends, "make_prepped_xfer")
        op = self._op(operation, "make_prepped_xfer")
        for side, h, want_local in (("local", local_xfer_side, True), ("remote", remote_xfer_side, False)):
            if not isinstance(h, nixl_prepped_dlist_handle) or h._agent is not self:
                raise err.nixlInvalidParamError(f"make_prepped_xfer: the {side} side is not a prepared list of this agent")
            if h._released or h._list is None:
                raise err.nixlInvalidParamError(f"make_prepped_xfer: the {side} side's prepared list was released")
            if (h._peer is None) != want_local:
                raise err.nixlInvalidParamError(
                    f"make_prepped_xfer: the {side} side is a list prepared for "
                    + ("this agent" if h._peer is None else f"remote agent {h._peer!r}")
                )
        li, ri = self._indices(local_indices, "local"), self._indices(remote_indices, "remote")
        if len(li) != len(ri):
            raise err.nixlInvalidParamError(f"make_prepped_xfer: {len(li)} local and {len(ri)} remote indices")
        for side, idx, h in (("local", li, local_xfer_side), ("remote", ri, remote_xfer_side)):
            bad = next((i for i in idx if not 0 <= i < h._count), None)
            if bad is not None:
                raise err.nixlInvalidParamError(f"make_prepped_xfer: {side} index {bad} outside its list of {h._count}")
        remote = self._remote(remote_xfer_side._peer, "make_prepped_xfer")  # type: ignore[arg-type]
        request = (op, remote, local_xfer_side._list, li, remote_xfer_side._list, ri, _message(notif_msg), local_xfer_side._segments)
        return nixl_xfer_handle(self, next(self._handles), request, backend)

    def initialize_xfer(
        self,
        operation: str,
        local_descs: nixlXferDList,
        remote_descs: nixlXferDList,
        remote_agent: str,
        notif_msg: bytes = b"",
        backends: List[str] = [],  # noqa: B006
    ) -> nixl_xfer_handle:
        local = self.get_xfer_descs(local_descs)
        remote = self.get_xfer_descs(remote_descs)
        if len(local) != len(remote):
            raise err.nixlMismatchError(f"initialize_xfer: {len(local)} local and {len(remote)} remote descriptors")
        lh = self.prep_xfer_dlist(NIXL_INIT_AGENT, local, backends=backends)
        rh = self.prep_xfer_dlist(remote_agent, remote, backends=backends)
        idx = list(range(len(local)))
        return self.make_prepped_xfer(operation, lh, idx, rh, idx, notif_msg, backends)

    @staticmethod
    def _op(operation: str, what: str) -> str:
        if operation == "WRITE":
            return gdr.WRITE
        if operation == "READ":
            return gdr.READ
        # NIXL looks the operation up in a dict: a KeyError, as there.
        raise KeyError(f"{what}: operation {operation!r} (WRITE or READ)")

    @staticmethod
    def _indices(idx: Any, side: str) -> List[int]:
        try:
            return [int(i) for i in (idx.tolist() if isinstance(idx, np.ndarray) else idx)]
        except (TypeError, ValueError):
            raise err.nixlInvalidParamError(f"make_prepped_xfer: {side} indices are a list or array of integers") from None

    def _handle(self, handle: Any, what: str) -> nixl_xfer_handle:
        if not isinstance(handle, nixl_xfer_handle) or handle._agent is not self:
            raise err.nixlInvalidParamError(f"{what}: not a transfer handle of this agent")
        if handle._released:
            raise err.nixlInvalidParamError(f"{what}: the transfer handle was released")
        return handle

    def transfer(self, handle: nixl_xfer_handle, notif_msg: bytes = b"") -> str:
        """Submits the prepared transfer (again): ``"PROC"``, or ``"DONE"`` when it finished
        in the call. Raises ``nixlRepostActiveError`` while its last submission is in flight."""
        h = self._handle(handle, "transfer")
        t = h._transfer
        if t is not None and t.status == "pending":
            raise err.nixlRepostActiveError("transfer: the handle's last transfer is still in flight (check_xfer_state until DONE)")
        assert h._request is not None  # a released handle was refused above
        op, remote, local_list, li, remote_list, ri, notif, segments = h._request
        note = _message(notif_msg) or notif
        try:
            h._transfer = remote.peer.transfer_indexed(op, local_list, li, remote_list, ri, notify=note or None)
        except gdr.GdrError as e:
            h._transfer, h._state, h._error = None, "ERR", e
            raise _nixl_error(e) from e
        self._inflight = [(t, s) for t, s in self._inflight if t.status == "pending"]
        self._inflight.append((h._transfer, segments))
        h._state, h._error = "PROC", None
        return self._state_of(h)

    def check_xfer_state(self, handle: nixl_xfer_handle) -> str:
        """``"PROC"`` while in flight, ``"DONE"``, or ``"ERR"`` (the reason:
        ``handle_error(handle)``)."""
        return self._state_of(self._handle(handle, "check_xfer_state"))

    def _state_of(self, h: nixl_xfer_handle) -> str:
        t = h._transfer
        if t is None:
            if h._state == "INIT":
                raise err.nixlNotPostedError("check_xfer_state: the transfer was never posted")
            return h._state
        try:
            done = t.poll()
        except gdr.GdrError as e:
            h._state, h._error = "ERR", e
            return "ERR"
        h._state = "PROC" if done is None else "DONE"
        return h._state

    def handle_error(self, handle: nixl_xfer_handle) -> Optional[BaseException]:
        """gdr's addition: why a transfer ended in ``"ERR"`` (the :class:`gdr.GdrError`)."""
        return self._handle(handle, "handle_error")._error

    def get_xfer_telemetry(self, handle: nixl_xfer_handle) -> nixlXferTelemetry:
        h = self._handle(handle, "get_xfer_telemetry")
        if not self._telemetry:
            raise err.nixlNoTelemetryError("get_xfer_telemetry: the agent was made without capture_telemetry=True")
        t = h._transfer
        stats = t.poll() if t is not None and t.status == "done" else None
        if stats is None:
            raise err.nixlNotPostedError("get_xfer_telemetry: the transfer has not finished")
        us = lambda s: int(round(float(stats.get(s) or 0.0) * 1e6))  # noqa: E731
        return nixlXferTelemetry(int(time.time() * 1e6), us("time_to_post_s"), us("time_to_complete_s"),
                                 int(stats.get("bytes", 0)), int(stats.get("descriptors", 0)))

    def estimate_xfer_cost(self, req_handle: nixl_xfer_handle) -> Tuple[int, int, str]:
        raise err.nixlNotSupportedError("estimate_xfer_cost: gdr's engine makes no cost estimates")

    def query_xfer_backend(self, handle: nixl_xfer_handle) -> str:
        return self._handle(handle, "query_xfer_backend")._backend

    def release_xfer_handle(self, handle: nixl_xfer_handle) -> None:
        handle.release()

    def release_dlist_handle(self, handle: nixl_prepped_dlist_handle) -> None:
        handle.release()

    def prep_mem_view(self, dlist: Any, *, backends: Optional[List[str]] = None) -> int:
        # The class NIXL raises where UCX lacks the GPU device API.
        raise err.nixlBackendError("prep_mem_view: UCX's GPU device API (transfers posted by CUDA kernels) is not in gdr")

    def release_mem_view(self, mvh: int) -> None:
        raise err.nixlBackendError("release_mem_view: UCX's GPU device API is not in gdr")

    def get_remote_descs(self, descs: Any, mem_type: Optional[str] = None) -> Any:
        raise err.nixlNotSupportedError("get_remote_descs: its lists feed prep_mem_view, UCX's GPU device API, which gdr lacks")

    def get_serialized_descs(self, descs: Any) -> bytes:
        return pickle.dumps(descs)

    def deserialize_descs(self, serialized_descs: bytes) -> Any:
        return pickle.loads(serialized_descs)

    # -- notifications ---------------------------------------------------------------------

    def _take_notifs(self, into: Dict[str, List[bytes]]) -> Dict[str, List[bytes]]:
        for n in self._agent.take_notifications():
            into.setdefault(n.peer, []).append(n.data)
        return into

    def get_new_notifs(self, backends: List[str] = []) -> Dict[str, List[bytes]]:  # noqa: B006
        return self._take_notifs({})

    def update_notifs(self, backends: List[str] = []) -> Dict[str, List[bytes]]:  # noqa: B006
        self.notifs = self._take_notifs(self.notifs)
        return self.notifs

    def check_remote_xfer_done(self, remote_agent_name: Union[str, bytes], lookup_tag: bytes, backends: List[str] = [], tag_is_prefix: bool = True) -> bool:  # noqa: B006,E501
        self.notifs = self._take_notifs(self.notifs)
        msgs = self.notifs.get(_name(remote_agent_name), [])
        for i, msg in enumerate(msgs):
            if (tag_is_prefix and msg.startswith(lookup_tag)) or (not tag_is_prefix and lookup_tag in msg):
                del msgs[i]
                return True
        return False

    def send_notif(self, remote_agent_name: str, notif_msg: bytes, backend: Optional[str] = None) -> None:
        remote = self._remote(remote_agent_name, "send_notif")
        data = _message(notif_msg)
        self._sent = [t for t in self._sent if t.status == "pending"]
        try:
            self._sent.append(remote.peer.send_notification(data))
        except gdr.GdrError as e:
            raise _nixl_error(e) from e

    # -- gdr's additions -------------------------------------------------------------------

    @property
    def gdr_agent(self) -> gdr.Agent:
        """The :class:`gdr.Agent` underneath (its statistics, its own API)."""
        return self._agent

    def __del__(self) -> None:
        try:
            self._agent.shutdown(0.0)
        except Exception:  # noqa: BLE001 - finalizers must not raise
            pass
