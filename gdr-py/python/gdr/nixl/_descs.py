"""NIXL's descriptor lists: ``nixlRegDList`` (what to register: address, length, device id,
meta info) and ``nixlXferDList`` (what to transfer: address, length, device id), each of one
memory type, built from the inputs NIXL takes (lists of tuples, Nx3 numpy arrays, torch
tensors, lists of tensors).

A list built from tensors keeps the tensors: registering it registers the tensors themselves,
so their segments hold them (gdr's rule), where a list of addresses is the caller's promise.
"""

import sys
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Type

import numpy as np

from ._errors import nixlInvalidParamError, nixlNotFoundError

#: NIXL's memory types, with its deprecated aliases; the ones gdr moves.
MEM_TYPES = {"DRAM": "DRAM", "VRAM": "VRAM", "cpu": "DRAM", "cuda": "VRAM"}
#: NIXL's storage memory types: no storage backend in gdr.
STORAGE_TYPES = ("FILE", "BLOCK", "OBJ")


def mem_type_of(name: Optional[str], what: str) -> str:
    if name is None:
        raise nixlInvalidParamError(f"{what}: a memory type (DRAM or VRAM) is needed for descriptors that are not tensors")
    if name in STORAGE_TYPES:
        raise nixlNotFoundError(f"{what}: memory type {name}: no backend for it (gdr has no storage backend; it moves DRAM and VRAM)")
    try:
        return MEM_TYPES[name]
    except (KeyError, TypeError):
        raise nixlInvalidParamError(f"{what}: unknown memory type {name!r} (DRAM or VRAM)") from None


class _DList:
    """A descriptor list of one memory type: tuples, in order."""

    __slots__ = ("_type", "_descs", "_tensors")

    def __init__(self, mem_type: str, descs: Sequence[tuple] = (), tensors: Optional[List[Any]] = None):
        self._type = mem_type_of(mem_type, type(self).__name__)
        self._descs = [self._row(d) for d in descs]
        self._tensors = tensors

    def _row(self, d: Any) -> tuple:
        raise NotImplementedError

    def getType(self) -> str:
        """The memory type: ``"DRAM"`` or ``"VRAM"``."""
        return self._type

    def descCount(self) -> int:
        return len(self._descs)

    def isEmpty(self) -> bool:
        return not self._descs

    def __len__(self) -> int:
        return len(self._descs)

    def __getitem__(self, i: int) -> tuple:
        return self._descs[i]

    def __iter__(self) -> Iterator[tuple]:
        return iter(self._descs)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and (self._type, self._descs) == (other._type, other._descs)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._type}, {self._descs!r})"

    def __getstate__(self) -> tuple:
        # Pickled (get_serialized_descs) as addresses only: tensors stay in their process.
        return (self._type, self._descs)

    def __setstate__(self, state: tuple) -> None:
        self._type, self._descs = state
        self._tensors = None


def _int(v: Any, what: str) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        raise nixlInvalidParamError(f"{what} {v!r} is not an integer") from None


class nixlRegDList(_DList):
    """Registration descriptors: ``(address, length, device id, meta info)``."""

    __slots__ = ()

    def _row(self, d: Any) -> tuple:
        if len(d) == 3:
            d = (*d, "")
        if len(d) != 4:
            raise nixlInvalidParamError(f"nixlRegDList: a descriptor is (address, length, device id, meta info), not {d!r}")
        return (_int(d[0], "address"), _int(d[1], "length"), _int(d[2], "device id"), str(d[3]))


class nixlXferDList(_DList):
    """Transfer descriptors: ``(address, length, device id)``."""

    __slots__ = ()

    def _row(self, d: Any) -> tuple:
        if len(d) != 3:
            raise nixlInvalidParamError(f"nixlXferDList: a descriptor is (address, length, device id), not {d!r}")
        return (_int(d[0], "address"), _int(d[1], "length"), _int(d[2], "device id"))


def is_torch_tensor(obj: Any) -> bool:
    """A torch tensor, without importing torch (only an imported torch can have made one)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _tensor_row(t: Any) -> Tuple[str, Tuple[int, int, int]]:
    if not t.is_contiguous():
        raise nixlInvalidParamError("a tensor to register or transfer must be contiguous")
    dev = t.get_device()
    return ("DRAM" if dev == -1 else "VRAM"), (t.data_ptr(), t.numel() * t.element_size(), max(dev, 0))


def from_input(cls: Type[_DList], descs: Any, mem_type: Optional[str]) -> _DList:
    """NIXL's ``get_reg_descs`` / ``get_xfer_descs``: a list of the class from any input it
    takes (raises ``nixlInvalidParamError`` for any other, where NIXL logs and returns None)."""
    what = "get_reg_descs" if cls is nixlRegDList else "get_xfer_descs"
    if isinstance(descs, cls):
        return descs
    if isinstance(descs, _DList):
        raise nixlInvalidParamError(f"{what}: a {type(descs).__name__} where a {cls.__name__} is needed")
    if isinstance(descs, np.ndarray):
        if descs.ndim != 2 or descs.shape[1] != 3:
            raise nixlInvalidParamError(f"{what}: a numpy array of descriptors is Nx3 (address, length, device id), not {descs.shape}")
        return cls(mem_type_of(mem_type, what), [tuple(int(v) for v in row) for row in descs])
    if is_torch_tensor(descs):
        kind, row = _tensor_row(descs)
        return cls(kind, [row], [descs])
    if isinstance(descs, (list, tuple)) and descs and is_torch_tensor(descs[0]):
        rows, kinds = [], set()
        for t in descs:
            if not is_torch_tensor(t):
                raise nixlInvalidParamError(f"{what}: a list of tensors holds a {type(t).__name__}")
            kind, row = _tensor_row(t)
            kinds.add((kind, t.device))
            rows.append(row)
        if len(kinds) != 1:
            raise nixlInvalidParamError(f"{what}: the tensors of one list must be on one device")
        return cls(kinds.pop()[0], rows, list(descs))
    if isinstance(descs, (list, tuple)):
        if not descs:
            return cls(mem_type_of(mem_type, what) if mem_type else "DRAM", [])
        if all(isinstance(d, tuple) for d in descs):
            return cls(mem_type_of(mem_type, what), descs)
    raise nixlInvalidParamError(
        f"{what}: descriptors are a list of tuples, an Nx3 numpy array, a torch tensor or a list of tensors, not {type(descs).__name__}"
    )


def expand_strided(rows: np.ndarray) -> List[Tuple[int, int, int]]:
    """NIXL's compressed Nx5 form ``(address, length, device id, stride, count)``: ``count``
    blocks of ``length`` bytes, ``stride`` bytes apart."""
    out: List[Tuple[int, int, int]] = []
    for addr, length, dev, stride, count in (tuple(int(v) for v in r) for r in rows):
        if count < 0 or stride < 0:
            raise nixlInvalidParamError(f"prep_xfer_dlist: a strided row has stride {stride} and count {count}")
        out.extend((addr + i * stride, length, dev) for i in range(count))
    return out
