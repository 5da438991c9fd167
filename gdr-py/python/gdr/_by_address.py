"""Memory named by address, as NIXL's and Mooncake's APIs name it: what the drop-ins
(:mod:`gdr.nixl`, :mod:`gdr.mooncake`) share.

Both APIs name memory by its virtual address, on both sides: a caller registers
``(address, length)`` and later transfers between local and remote addresses. gdr names memory
by segment and offset. The drop-ins keep, per agent, the segments registered through them in
an :class:`AddressMap` (local) and read the peers' from the names of their segments
(:func:`segment_name`, :func:`parse_segment_name`): a segment registered by a drop-in is
published under a name that carries its memory kind, device and base address, so the
initiator turns a remote address into ``(RemoteSegment, offset)`` without any other exchange.

An integer address is the caller's promise, as it is in NIXL and Mooncake (and as with
``ctypes``): gdr registers the range (:func:`host_range`) but cannot keep memory it was given
only an address of alive. Registering the object itself (a numpy array, a torch tensor) gets
gdr's own rule: the segment holds the object until the NIC is done with it.
"""

import bisect
import ctypes
import os
import socket
from typing import Any, Dict, Iterable, List, Optional, Tuple

#: The prefix of the names of segments a drop-in registers.
PREFIX = "addr"


def segment_name(kind: str, device_id: int, address: int, length: int, serial: int) -> str:
    """The name a drop-in registers a range under: ``addr:KIND:DEV:0xADDR:0xLEN:SERIAL``
    (``serial`` keeps two registrations of one range apart)."""
    return f"{PREFIX}:{kind}:{device_id}:{address:#x}:{length:#x}:{serial}"


def parse_segment_name(name: str) -> Optional[Tuple[str, int, int, int]]:
    """``(kind, device_id, address, length)`` of a drop-in's segment name; ``None`` for any
    other name (segments registered through gdr's own API)."""
    parts = name.split(":")
    if len(parts) != 6 or parts[0] != PREFIX:
        return None
    try:
        return parts[1], int(parts[2]), int(parts[3], 16), int(parts[4], 16)
    except ValueError:
        return None


def learn_segments(amap: "AddressMap", seen: set, segments: Iterable[Any]) -> None:
    """Adds to ``amap`` a peer's segments that a drop-in registered and ``seen`` (their ids)
    does not hold yet: at the address their name carries, for no more than the segment's
    real length. A peer's names cannot widen what a transfer may touch (gdr checks every
    range against the segment's real bounds as well); a lying peer only misdirects transfers
    into its own memory."""
    for seg in segments:
        if seg.id in seen:
            continue
        parsed = parse_segment_name(seg.name)
        if parsed is None:
            continue
        seen.add(seg.id)
        kind, dev, address, length = parsed
        amap.add(kind, dev, address, min(length, seg.length), seg)


def host_range(address: int, length: int) -> Any:
    """A writable buffer over ``length`` bytes of host memory at ``address``, for
    ``Agent.register``: the caller's promise that the range is its memory and stays allocated
    while registered (gdr cannot check it, as ``ctypes`` cannot)."""
    if not isinstance(address, int) or not isinstance(length, int):
        raise TypeError(f"an address and a length are integers, not {type(address).__name__} and {type(length).__name__}")
    if address <= 0 or length <= 0 or address + length > 1 << 64:
        raise ValueError(f"no host memory at {address:#x} of {length} bytes (address and length must be > 0)")
    return (ctypes.c_char * length).from_address(address)


class AddressMap:
    """Registered ranges by ``(kind, device_id)`` and base address: which one holds a range."""

    def __init__(self) -> None:
        self._by_place: Dict[Tuple[str, int], List[Tuple[int, int, Any]]] = {}

    def add(self, kind: str, device_id: int, address: int, length: int, value: Any) -> None:
        rows = self._by_place.setdefault((kind, device_id), [])
        bisect.insort(rows, (address, length, value), key=lambda r: (r[0], r[1]))

    def remove(self, kind: str, device_id: int, address: int, length: int) -> Optional[Any]:
        """Takes out the most recent registration of exactly this range; ``None`` if none."""
        rows = self._by_place.get((kind, device_id), [])
        for i in range(len(rows) - 1, -1, -1):
            if rows[i][0] == address and rows[i][1] == length:
                return rows.pop(i)[2]
        return None

    def find(self, kind: str, device_id: int, address: int, length: int) -> Optional[Tuple[Any, int]]:
        """The value of a registered range holding ``address .. address + length`` and the
        offset of ``address`` in it; ``None`` when none holds all of it."""
        rows = self._by_place.get((kind, device_id))
        if not rows or length < 0:
            return None
        i = bisect.bisect_right(rows, address, key=lambda r: r[0])
        # Ranges may overlap: look back from the last one starting at or before the address.
        for base, size, value in reversed(rows[:i]):
            if address + length <= base + size:
                return value, address - base
        return None

    def find_any(self, address: int, length: int) -> Optional[Tuple[Any, int]]:
        """As :meth:`find`, in registrations of any kind and device (Mooncake's addresses
        carry neither)."""
        for kind, dev in self._by_place:
            hit = self.find(kind, dev, address, length)
            if hit is not None:
                return hit
        return None

    def starting_at(self, address: int) -> Optional[Tuple[str, int, int, Any]]:
        """``(kind, device_id, length, value)`` of the most recent registration that starts at
        ``address``; ``None`` if none."""
        for (kind, dev), rows in self._by_place.items():
            for base, size, value in reversed(rows):
                if base == address:
                    return kind, dev, size, value
        return None

    def values(self) -> Iterable[Any]:
        for rows in self._by_place.values():
            for _, _, value in rows:
                yield value

    def __len__(self) -> int:
        return sum(len(r) for r in self._by_place.values())


def advertise_host(device: Optional[str]) -> str:
    """The IPv4 address peers reach this host on: ``GDR_ADVERTISE_HOST`` when set, else the
    first IPv4 address among the RoCE GIDs of ``device`` (or of any RDMA device), else the
    address the host name resolves to."""
    env = os.environ.get("GDR_ADVERTISE_HOST")
    if env:
        return env
    root = "/sys/class/infiniband"
    try:
        devices = [device] if device else sorted(os.listdir(root))
    except OSError:
        devices = []
    for dev in devices:
        ports = os.path.join(root, dev, "ports")
        try:
            port_names = sorted(os.listdir(ports))
        except OSError:
            continue
        for port in port_names:
            gids = os.path.join(ports, port, "gids")
            try:
                names = sorted(os.listdir(gids), key=lambda n: int(n) if n.isdigit() else 0)
            except OSError:
                continue
            for n in names:
                try:
                    with open(os.path.join(gids, n)) as f:
                        gid = f.read().strip()
                except OSError:
                    continue
                ip = _ipv4_of_gid(gid)
                if ip:
                    return ip
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _ipv4_of_gid(gid: str) -> Optional[str]:
    """The IPv4 address of an IPv4-mapped GID (``0000:...:ffff:0a00:020f``), else ``None``."""
    hexes = gid.replace(":", "")
    if len(hexes) != 32 or hexes[:20] != "0" * 20 or hexes[20:24] != "ffff":
        return None
    try:
        return socket.inet_ntoa(bytes.fromhex(hexes[24:]))
    except (ValueError, OSError):
        return None


def rails_from_env() -> Tuple[Optional[str], Optional[int], Optional[int]]:
    """The rails, GID index and queue pairs per peer the drop-ins' agents use:
    ``GDR_DEVICE`` (gdr's list form, ``mlx5_0:1,mlx5_1:1``), else ``UCX_NET_DEVICES`` (the same
    form, as UCX reads it; ``all`` or unset: every active port); ``GDR_GID_INDEX``, else
    ``UCX_IB_GID_INDEX``; ``GDR_QPS_PER_PEER`` (gdr's default when unset)."""
    dev = os.environ.get("GDR_DEVICE", "").strip()
    if not dev:
        ucx = os.environ.get("UCX_NET_DEVICES", "").strip()
        # UCX lists network interfaces too (eth0): keep the RDMA devices.
        names = [] if ucx.lower() == "all" else [d for d in ucx.split(",") if d]
        dev = ",".join(d for d in names if os.path.isdir(f"/sys/class/infiniband/{d.split(':')[0]}"))

    def number(*names: str) -> Optional[int]:
        for n in names:
            v = os.environ.get(n, "").strip()
            if v.isdigit():
                return int(v)
        return None

    return (dev or None), number("GDR_GID_INDEX", "UCX_IB_GID_INDEX"), number("GDR_QPS_PER_PEER")


class _DLDevice(ctypes.Structure):
    device_type: int
    device_id: int
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    code: int
    bits: int
    lanes: int
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    data: Any
    device: _DLDevice
    ndim: int
    dtype: _DLDataType
    shape: Any
    strides: Any
    byte_offset: int
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    dl_tensor: _DLTensor
    manager_ctx: Any
    deleter: Any


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

# The DLPack structs handed out and not yet given back, by address: the consumer (gdr) calls
# the deleter exactly once, which lets the struct and its shape go.
_EXPORTED: Dict[int, Tuple[Any, Any]] = {}


@_DELETER
def _delete(p: Any) -> None:
    _EXPORTED.pop(ctypes.addressof(p.contents), None)


_KDL_CUDA = 2
_KDL_UINT = 1
_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DeviceRange:
    """``length`` bytes of CUDA device memory at ``address`` on GPU ``device_id``, as a DLPack
    exporter (a 1-D uint8 tensor) for ``Agent.register``: gdr's pointer checks
    (``cuPointerGetAttributes``: device memory, inside one allocation) run on it as on any
    tensor. The range is the caller's promise, as :func:`host_range`'s."""

    def __init__(self, address: int, length: int, device_id: int) -> None:
        if not all(isinstance(v, int) for v in (address, length, device_id)):
            raise TypeError("an address, a length and a device id are integers")
        if address <= 0 or length <= 0 or device_id < 0 or address + length > 1 << 64:
            raise ValueError(f"no device memory at {address:#x} of {length} bytes on GPU {device_id}")
        self.address, self.length, self.device_id = address, length, device_id

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (_KDL_CUDA, self.device_id)

    def __dlpack__(self, stream: Any = None) -> Any:
        # DLPack before 1.0: no max_version, a "dltensor" capsule of a DLManagedTensor.
        shape = (ctypes.c_int64 * 1)(self.length)
        m = _DLManagedTensor()
        m.dl_tensor.data = self.address
        m.dl_tensor.device = _DLDevice(_KDL_CUDA, self.device_id)
        m.dl_tensor.ndim = 1
        m.dl_tensor.dtype = _DLDataType(_KDL_UINT, 8, 1)
        m.dl_tensor.shape = shape
        m.dl_tensor.strides = None
        m.dl_tensor.byte_offset = 0
        m.deleter = _delete
        _EXPORTED[ctypes.addressof(m)] = (m, shape)
        return _PyCapsule_New(ctypes.addressof(m), b"dltensor", None)
