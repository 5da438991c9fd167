"""``TransferEngine`` on gdr's engine: Mooncake's Python API (``mooncake.engine``), the calls
SGLang's and vLLM's Mooncake connectors make, with Mooncake's return codes, over
:class:`gdr.Agent`.

How Mooncake's concepts land on gdr's:

- ``initialize(local_hostname, metadata_server, protocol, device_name)`` opens an agent on
  ``device_name``'s rails (``""``: every active port; ``MC_GID_INDEX`` picks the GID,
  ``MC_NUM_QP_PER_EP`` the QPs per peer) that listens on ``local_hostname``. With
  ``P2PHANDSHAKE`` its session name is ``host:port``, the port its ``get_rpc_port``; with an
  etcd address (``etcd://host:2379`` or ``host:2379``) it publishes itself in etcd under
  ``local_hostname`` (gdr's :class:`gdr.Directory`), and peers name it by that.
- A registered buffer is a segment named by its address (:mod:`gdr._by_address`); a batch is
  one transfer (``Peer.transfer_indexed`` over lists of the batch's ranges).
- Every call returns Mooncake's codes: 0, or -1 with the reason logged (logger
  ``gdr.mooncake``) and kept in ``last_error`` (the :class:`gdr.GdrError`, where there is one).

Where Mooncake is unsafe or silent, the drop-in is not: a missing device fails ``initialize``
(Mooncake falls back to TCP), ``protocol="tcp"`` is refused, a batch id that was already
waited for, or never given, is -1 (Mooncake reads freed memory and crashes), and
``write_bytes_to_buffer`` / ``read_bytes_from_buffer`` touch only memory registered through
this engine. An address is the caller's promise, as in Mooncake; a buffer from
``allocate_managed_buffer`` is held by its segment (gdr's rule).
"""

import ctypes
import enum
import itertools
import json
import logging
import mmap
import os
import socket
from typing import Any, Dict, List, Literal, Optional, Tuple

import gdr

from .. import _by_address as by_address

log = logging.getLogger("gdr.mooncake")


class TransferOpcode(enum.IntEnum):
    """Mooncake's transfer opcodes."""

    Read = 0
    Write = 1


Read = TransferOpcode.Read
Write = TransferOpcode.Write


class TransferNotify:
    """A notification sent with a batch (``batch_transfer_sync(..., notify=...)``) or taken
    by ``get_notifies``: a name and a message."""

    __slots__ = ("name", "msg")

    def __init__(self, name: str = "", msg: str = ""):
        self.name, self.msg = name, msg

    def encode(self) -> bytes:
        return json.dumps([self.name, self.msg]).encode()

    @classmethod
    def decode(cls, data: bytes) -> "TransferNotify":
        try:
            name, msg = json.loads(data)
            return cls(str(name), str(msg))
        except (ValueError, TypeError):
            return cls("", data.decode(errors="replace"))

    def __repr__(self) -> str:
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"


class _Failed(Exception):
    """A call's failure: logged, kept in ``last_error``, answered with ``code``."""

    def __init__(self, text: str, code: int = -1):
        super().__init__(text)
        self.code = code


#: Mooncake's code for an address that no registration starts at.
ERR_ADDRESS_NOT_REGISTERED = -3


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _env_int(name: str) -> Optional[int]:
    v = os.environ.get(name, "").strip()
    return int(v) if v.isdigit() else None


class TransferEngine:
    """Mooncake's ``TransferEngine`` on gdr's engine."""

    def __init__(self) -> None:
        self._agent: Optional[gdr.Agent] = None
        self._directory: Optional[gdr.Directory] = None
        self._rpc_port = 0
        self._local = by_address.AddressMap()
        self._remotes: Dict[str, Tuple[gdr.Peer, by_address.AddressMap, set]] = {}
        self._batches: Dict[int, gdr.Transfer] = {}
        self._ids = itertools.count(1)
        self._serial = itertools.count(1)
        self._managed: Dict[int, Tuple[mmap.mmap, int]] = {}
        #: Why the last call that returned -1 failed (gdr's addition): a GdrError or text.
        self.last_error: Any = None

    # -- the answers ---------------------------------------------------------------------

    def _fail(self, call: str, why: Any, code: int = -1) -> int:
        self.last_error = why
        hint = getattr(why, "hint", None)
        text = str(why)
        more = f" (hint: {hint})" if hint and hint not in text else ""
        log.error("%s%s%s", "" if text.startswith(call) else f"{call}: ", text, more)
        return code

    def _run(self, call: str, fn: Any, *args: Any) -> int:
        try:
            fn(*args)
            return 0
        except gdr.GdrError as e:
            return self._fail(call, e)
        except _Failed as e:
            return self._fail(call, str(e), e.code)
        except (TypeError, ValueError, OverflowError) as e:
            return self._fail(call, str(e))

    def _ready(self, call: str) -> gdr.Agent:
        if self._agent is None:
            raise _Failed(f"{call}: the engine is not initialized (initialize first)")
        return self._agent

    # -- setup ---------------------------------------------------------------------------

    def initialize(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str) -> int:
        return self.initialize_ext(local_hostname, metadata_server, protocol, device_name, "")

    def initialize_ext(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str, nic_priority_matrix: str = "") -> int:
        return self._run("initialize", self._initialize, local_hostname, metadata_server, protocol, device_name)

    def _initialize(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str) -> None:
        if self._agent is not None:
            raise _Failed("initialize: the engine is initialized already")
        if protocol != "rdma":
            raise _Failed(f"initialize: protocol {protocol!r}: gdr moves memory over RDMA only (rdma); it never falls back to TCP")
        host, _, port_s = local_hostname.rpartition(":") if ":" in local_hostname else (local_hostname, "", "")
        port = int(port_s) if port_s.isdigit() else 0
        env_device, env_gid, env_qps = by_address.rails_from_env()
        device = device_name or env_device
        gid = _env_int("MC_GID_INDEX") if _env_int("MC_GID_INDEX") is not None else env_gid
        qps = _env_int("MC_NUM_QP_PER_EP") or env_qps
        if metadata_server == "P2PHANDSHAKE":
            port = port or _free_port(host)
            agent = gdr.Agent(f"{host}:{port}", device=device, gid_index=gid, qps_per_peer=qps)
            bound = agent.listen(f"{host}:{port}")
        elif metadata_server.startswith(("http://", "https://", "redis://")):
            raise _Failed(f"initialize: metadata server {metadata_server!r}: gdr's drop-in speaks P2PHANDSHAKE and etcd only")
        else:
            # The name peers use is local_hostname (a segment name to Mooncake: an address or
            # any name); the agent listens there when it is this host's, else on the address
            # peers reach the device's host on, and publishes where it listens.
            endpoints = metadata_server.removeprefix("etcd://").split(",")
            agent = gdr.Agent(local_hostname, device=device, gid_index=gid, qps_per_peer=qps)
            try:
                ip = socket.gethostbyname(host) if host else ""
            except OSError:
                ip = ""
            ip = ip if ip and ip != "0.0.0.0" else by_address.advertise_host(agent.device)
            bound = agent.listen(f"{ip}:{port}")
            directory = gdr.Directory(endpoints)
            agent.publish(directory, f"{ip}:{bound.rsplit(':', 1)[1]}")
            self._directory = directory
        self._agent = agent
        self._rpc_port = int(bound.rsplit(":", 1)[1])

    def get_rpc_port(self) -> int:
        return self._rpc_port

    def get_local_topology(self, device_name: Optional[str] = None) -> str:
        """The rails as Mooncake's topology JSON shape (``{"cpu:0": {"preferred_hca": [...],
        "avail_hca": []}}``)."""
        rails = sorted({d for d, _ in self._agent.rails}) if self._agent else []
        return json.dumps({"cpu:0": {"preferred_hca": rails, "avail_hca": []}})

    # -- memory --------------------------------------------------------------------------

    @staticmethod
    def _place(location: str) -> Tuple[str, int]:
        if location.startswith("cuda:"):
            return "VRAM", int(location.split(":", 1)[1])
        return "DRAM", 0

    def _register(self, addr: int, length: int, location: str) -> None:
        agent = self._ready("register_memory")
        kind, dev = self._place(location)
        obj = by_address.host_range(addr, length) if kind == "DRAM" else by_address.DeviceRange(addr, length, dev)
        seg = agent.register(obj, by_address.segment_name(kind, dev, addr, length, next(self._serial)))
        self._local.add(kind, dev, addr, length, seg)

    def _unregister(self, addr: int) -> None:
        agent = self._ready("unregister_memory")
        hit = self._local.starting_at(addr)
        if hit is None:
            raise _Failed(f"unregister_memory: no buffer registered at {addr:#x}", ERR_ADDRESS_NOT_REGISTERED)
        kind, dev, length, seg = hit
        self._local.remove(kind, dev, addr, length)
        agent.deregister(seg)

    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        return self._run("register_memory", self._register, buffer_addr, capacity, location)

    def unregister_memory(self, buffer_addr: int) -> int:
        return self._run("unregister_memory", self._unregister, buffer_addr)

    def batch_register_memory(self, buffer_addresses: List[int], capacities: List[int], location: str = "*") -> int:
        def each() -> None:
            if len(buffer_addresses) != len(capacities):
                raise _Failed(f"batch_register_memory: {len(buffer_addresses)} addresses and {len(capacities)} capacities")
            done = []
            try:
                for a, c in zip(buffer_addresses, capacities):
                    self._register(a, c, location)
                    done.append(a)
            except BaseException:
                for a in done:
                    self._unregister(a)
                raise

        return self._run("batch_register_memory", each)

    def batch_unregister_memory(self, buffer_addresses: List[int]) -> int:
        def each() -> None:
            missing = [a for a in buffer_addresses if self._local.starting_at(a) is None]
            for a in buffer_addresses:
                if a not in missing:
                    self._unregister(a)
            if missing:
                raise _Failed(f"batch_unregister_memory: no buffer registered at {missing[0]:#x}", ERR_ADDRESS_NOT_REGISTERED)

        return self._run("batch_unregister_memory", each)

    def allocate_managed_buffer(self, length: int) -> int:
        """Page-aligned host memory, registered and held by its segment: its address, 0 on
        failure."""
        try:
            agent = self._ready("allocate_managed_buffer")
            mm = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
            seg = agent.register(mm, by_address.segment_name("DRAM", 0, addr, length, next(self._serial)))
        except (gdr.GdrError, _Failed, ValueError, OSError, OverflowError) as e:
            self._fail("allocate_managed_buffer", e)
            return 0
        self._local.add("DRAM", 0, addr, length, seg)
        self._managed[addr] = (mm, length)
        return addr

    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        def free() -> None:
            if buffer_addr not in self._managed:
                raise _Failed(f"free_managed_buffer: {buffer_addr:#x} is no buffer of allocate_managed_buffer")
            self._unregister(buffer_addr)
            # The segment holds the mmap until the NIC is done with it; then it is freed.
            del self._managed[buffer_addr]

        return self._run("free_managed_buffer", free)

    def _own(self, call: str, addr: int, length: int) -> None:
        if length < 0 or self._local.find_any(addr, length) is None:
            raise _Failed(f"{call}: {addr:#x} of {length} bytes is not memory registered through this engine")

    def write_bytes_to_buffer(self, buffer_addr: int, src: bytes, length: int) -> int:
        def write() -> None:
            data = bytes(src)[:length]
            self._own("write_bytes_to_buffer", buffer_addr, len(data))
            ctypes.memmove(buffer_addr, data, len(data))

        return self._run("write_bytes_to_buffer", write)

    def read_bytes_from_buffer(self, buffer_addr: int, length: int) -> bytes:
        try:
            self._own("read_bytes_from_buffer", buffer_addr, length)
        except _Failed as e:
            self._fail("read_bytes_from_buffer", str(e))
            return b""
        return ctypes.string_at(buffer_addr, length)

    # -- peers ---------------------------------------------------------------------------

    def _remote(self, target: str) -> Tuple[gdr.Peer, by_address.AddressMap, set]:
        agent = self._ready("transfer")
        known = self._remotes.get(target)
        if known is not None and known[0].is_connected:
            return known
        if self._directory is not None:
            peer = agent.peer(target) or agent.connect_named(self._directory, target)
        else:
            peer = agent.peer(target) or agent.connect(target)
        entry: Tuple[gdr.Peer, by_address.AddressMap, set] = (peer, by_address.AddressMap(), set())
        self._remotes[target] = entry
        return entry

    @staticmethod
    def _refresh(entry: Tuple[gdr.Peer, by_address.AddressMap, set]) -> None:
        peer, amap, seen = entry
        by_address.learn_segments(amap, seen, peer.segments())

    def _remote_range(self, entry: Any, target: str, addr: int, length: int) -> Tuple[Any, int]:
        hit = entry[1].find_any(addr, length)
        if hit is None:
            self._refresh(entry)
            hit = entry[1].find_any(addr, length)
        if hit is None:
            raise _Failed(f"transfer: {target} registered no buffer holding {addr:#x} of {length} bytes")
        return hit

    def get_first_buffer_address(self, segment_name: str) -> int:
        try:
            entry = self._remote(segment_name)
            self._refresh(entry)
        except (gdr.GdrError, _Failed) as e:
            self._fail("get_first_buffer_address", e)
            return 0
        firsts = sorted((seg.id, by_address.parse_segment_name(seg.name)) for seg in entry[0].segments())
        for _, parsed in firsts:
            if parsed is not None:
                return parsed[2]
        return 0

    def send_probe(self, peer_server_name: str) -> int:
        return self._run("send_probe", self._remote, peer_server_name)

    # -- transfers -----------------------------------------------------------------------

    def _submit(self, target: str, op: Literal["write", "read"], buffers: List[int], peers: List[int], lengths: List[int], notify: Optional[TransferNotify] = None) -> gdr.Transfer:
        if not (len(buffers) == len(peers) == len(lengths)):
            raise _Failed(f"transfer: buffers, peer_buffer_addresses and lengths differ in size ({len(buffers)}, {len(peers)}, {len(lengths)})")
        if not buffers:
            raise _Failed("transfer: an empty batch")
        entry = self._remote(target)
        local, remote = [], []
        for b, p, n in zip(buffers, peers, lengths):
            hit = self._local.find_any(b, n)
            if hit is None:
                raise _Failed(f"transfer: {b:#x} of {n} bytes is not memory registered through this engine")
            local.append((hit[0], hit[1], n))
            rseg, roff = self._remote_range(entry, target, p, n)
            remote.append((rseg, roff, n))
        note = notify.encode() if notify is not None else None
        peer = entry[0]
        if len(local) == 1:
            (seg, off, n), (rseg, roff, _) = local[0], remote[0]
            move = peer.write if op == gdr.WRITE else peer.read
            return move(seg, off, rseg, roff, n, notify=note)
        idx = range(len(local))
        return peer.transfer_indexed(op, gdr.LocalList(local), idx, gdr.RemoteList(peer, remote), idx, notify=note)

    def _sync(self, call: str, target: str, op: Literal["write", "read"], buffers: List[int], peers: List[int], lengths: List[int], notify: Optional[TransferNotify] = None) -> int:
        return self._run(call, lambda: self._submit(target, op, buffers, peers, lengths, notify).wait())

    @staticmethod
    def _op(opcode: Any) -> Literal["write", "read"]:
        return gdr.READ if int(opcode) == TransferOpcode.Read else gdr.WRITE

    def transfer_sync_write(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = "") -> int:
        return self._sync("transfer_sync_write", target_hostname, gdr.WRITE, [buffer], [peer_buffer_address], [length])

    def transfer_sync_read(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = "") -> int:
        return self._sync("transfer_sync_read", target_hostname, gdr.READ, [buffer], [peer_buffer_address], [length])

    def transfer_sync(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, opcode: TransferOpcode, notify: Optional[TransferNotify] = None, transport_hint: str = "") -> int:  # noqa: E501
        return self._sync("transfer_sync", target_hostname, self._op(opcode), [buffer], [peer_buffer_address], [length], notify)

    def batch_transfer_sync_write(self, target_hostname: str, buffers: List[int], peer_buffer_addresses: List[int], lengths: List[int], transport_hint: str = "") -> int:  # noqa: E501
        return self._sync("batch_transfer_sync_write", target_hostname, gdr.WRITE, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_sync_read(self, target_hostname: str, buffers: List[int], peer_buffer_addresses: List[int], lengths: List[int], transport_hint: str = "") -> int:  # noqa: E501
        return self._sync("batch_transfer_sync_read", target_hostname, gdr.READ, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_sync(self, target_hostname: str, buffers: List[int], peer_buffer_addresses: List[int], lengths: List[int], opcode: TransferOpcode, notify: Optional[TransferNotify] = None, transport_hint: str = "") -> int:  # noqa: E501
        return self._sync("batch_transfer_sync", target_hostname, self._op(opcode), buffers, peer_buffer_addresses, lengths, notify)

    def _async(self, call: str, target: str, op: Literal["write", "read"], buffers: List[int], peers: List[int], lengths: List[int]) -> int:
        """A batch id (>= 1), or 0 when the batch was refused."""
        try:
            t = self._submit(target, op, buffers, peers, lengths)
        except gdr.GdrError as e:
            self._fail(call, e)
            return 0
        except (_Failed, TypeError, ValueError, OverflowError) as e:
            self._fail(call, str(e))
            return 0
        bid = next(self._ids)
        self._batches[bid] = t
        return bid

    def batch_transfer_async_write(self, target_hostname: str, buffers: List[int], peer_buffer_addresses: List[int], lengths: List[int], transport_hint: str = "") -> int:  # noqa: E501
        return self._async("batch_transfer_async_write", target_hostname, gdr.WRITE, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_async_read(self, target_hostname: str, buffers: List[int], peer_buffer_addresses: List[int], lengths: List[int], transport_hint: str = "") -> int:  # noqa: E501
        return self._async("batch_transfer_async_read", target_hostname, gdr.READ, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_async(self, target_hostname: str, buffers: List[int], peer_buffer_addresses: List[int], lengths: List[int], opcode: TransferOpcode, transport_hint: str = "") -> int:  # noqa: E501
        return self._async("batch_transfer_async", target_hostname, self._op(opcode), buffers, peer_buffer_addresses, lengths)

    def transfer_submit_write(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = "") -> int:  # noqa: E501
        return self._async("transfer_submit_write", target_hostname, gdr.WRITE, [buffer], [peer_buffer_address], [length])

    def get_batch_transfer_status(self, batch_ids: List[int]) -> int:
        """Waits for every batch: 0 when all succeeded, else -1. Each id is then forgotten
        (asking again is -1, where Mooncake reads the freed batch)."""
        failed: Any = None
        for bid in batch_ids:
            t = self._batches.pop(bid, None)
            if t is None:
                failed = failed or f"get_batch_transfer_status: batch {bid} is unknown (never given, or already waited for)"
                continue
            try:
                t.wait()
            except gdr.GdrError as e:
                failed = failed or e
        return 0 if failed is None else self._fail("get_batch_transfer_status", failed)

    def transfer_check_status(self, batch_id: int) -> int:
        """1 once the transfer succeeded, 0 while it is in flight, -1 when it failed or the
        id is unknown (then the id is forgotten)."""
        t = self._batches.get(batch_id)
        if t is None:
            return self._fail("transfer_check_status", f"batch {batch_id} is unknown (never given, or already done)")
        try:
            done = t.poll()
        except gdr.GdrError as e:
            del self._batches[batch_id]
            return self._fail("transfer_check_status", e)
        if done is None:
            return 0
        del self._batches[batch_id]
        return 1

    # -- notifications -------------------------------------------------------------------

    def get_notifies(self) -> List[TransferNotify]:
        if self._agent is None:
            return []
        return [TransferNotify.decode(n.data) for n in self._agent.take_notifications()]

    # -- not in gdr ----------------------------------------------------------------------

    def warmup_efa_segment(self, segment_name: str) -> int:
        """0: there is no EFA segment to warm up (as Mooncake answers off EFA)."""
        return 0

    def get_engine(self) -> Any:
        raise NotImplementedError("get_engine: Mooncake's C++ engine object; gdr's is .gdr_agent")

    def get_engine_ptr(self) -> int:
        raise NotImplementedError("get_engine_ptr: a pointer to Mooncake's C++ engine; gdr has none to give")

    @property
    def gdr_agent(self) -> Optional[gdr.Agent]:
        """The :class:`gdr.Agent` underneath, once initialized (gdr's addition)."""
        return self._agent

    def __del__(self) -> None:
        try:
            if self._agent is not None:
                self._agent.shutdown(0.0)
        except Exception:  # noqa: BLE001 - finalizers must not raise
            pass
