"""Memory through DLPack (``__dlpack__``), and what gdr sees of an object before registering it.

The host tests need no RDMA device: ``gdr.inspect_memory`` takes an object's memory the way
``Agent.register`` does and gives it back. The device tests (marked ``device``, run in the
Soft-RoCE VM) register host tensors that speak only DLPack, as torch's CPU tensors do, and
move bytes with them. CUDA tensors are the GPU tier's (``gpu_python.py`` on the GPU machine).
"""

import gc
import weakref

import numpy as np
import pytest

import gdr
from gdr import _gdr

from conftest import eventually


class DlpackOnly:
    """A tensor that exports its memory only through DLPack (like a torch CPU tensor): no buffer
    protocol. ``versioned=False`` makes it an exporter older than DLPack 1.0."""

    def __init__(self, array: np.ndarray, versioned: bool = True):
        self.array = array
        self.versioned = versioned
        self.exports = 0

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

    def __dlpack__(self, *, stream=None, max_version=None, **kwargs):
        self.exports += 1
        if not self.versioned:
            if max_version is not None:
                raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
            return self.array.__dlpack__()
        return self.array.__dlpack__(max_version=max_version)


class NotACapsule:
    """Claims DLPack, returns something else."""

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **kwargs):
        return b"not a capsule"


def test_inspect_memory_takes_numpy_through_the_buffer_protocol():
    a = np.arange(4096, dtype=np.uint8)
    info = gdr.inspect_memory(a)
    assert info == {
        "protocol": "buffer",
        "device": "cpu",
        "address": a.ctypes.data,
        "length": 4096,
    }


def test_inspect_memory_takes_a_dlpack_only_tensor_and_gives_it_back():
    a = np.arange(1024, dtype=np.float32).reshape(32, 32)
    for versioned, protocol in ((True, "dlpack 1.0"), (False, "dlpack")):
        t = DlpackOnly(a, versioned)
        info = gdr.inspect_memory(t)
        assert info == {
            "protocol": protocol,
            "device": "cpu",
            "address": a.ctypes.data,
            "length": 4096,
        }, info
        assert t.exports == (1 if versioned else 2)  # the legacy one was asked twice
    # The capsule's deleter ran: nothing holds the array but `a` (numpy's exports hold a
    # reference to the array until their deleter runs).
    weak = weakref.ref(a)
    del a, t
    gc.collect()
    assert weak() is None, "the DLPack export was never deleted"


def test_dlpack_refusals_are_typed_and_release_the_export():
    base = np.zeros((8, 16), np.uint8)
    with pytest.raises(gdr.NotContiguous) as e:
        gdr.inspect_memory(DlpackOnly(base[:, ::2]))
    assert "strides" in str(e.value)
    with pytest.raises(gdr.InvalidArgument, match="empty"):
        gdr.inspect_memory(DlpackOnly(np.zeros((0, 16), np.uint8)))
    ro = np.zeros(64, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(gdr.ReadOnlyBuffer):
        gdr.inspect_memory(DlpackOnly(ro))  # the versioned capsule flags it read-only
    with pytest.raises(BufferError):
        gdr.inspect_memory(DlpackOnly(ro, versioned=False))  # numpy refuses to export it
    with pytest.raises(gdr.InvalidArgument, match="not an unused DLPack capsule"):
        gdr.inspect_memory(NotACapsule())
    with pytest.raises(gdr.NotABuffer):
        gdr.inspect_memory(object())
    # Every refused export was deleted: nothing holds `base` or `ro` but this frame.
    wb, wr = weakref.ref(base), weakref.ref(ro)
    del base, ro
    gc.collect()
    assert wb() is None and wr() is None, "a refused DLPack export was kept"


def test_a_capsule_is_taken_once():
    a = np.zeros(64, np.uint8)
    capsule = a.__dlpack__()

    class Reuses:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kwargs):
            return capsule

    gdr.inspect_memory(Reuses())
    with pytest.raises(gdr.InvalidArgument, match="not an unused DLPack capsule"):
        gdr.inspect_memory(Reuses())  # renamed "used_dltensor" by the first consumer


def test_exporters_that_lie_or_fail_raise_and_hold_nothing():
    a = np.zeros(64, np.uint8)

    class Device:
        def __init__(self, device, dlpack=None):
            self.device, self.dlpack = device, dlpack

        def __dlpack_device__(self):
            if isinstance(self.device, Exception):
                raise self.device
            return self.device

        def __dlpack__(self, **kwargs):
            if self.dlpack is not None:
                raise self.dlpack
            return a.__dlpack__(**kwargs)

    # A device that is not a pair of ints, or that fails: Python's own error, nothing taken.
    for junk in (("a", 0), (1,), None, 2**70):
        with pytest.raises((TypeError, ValueError, OverflowError)):
            gdr.inspect_memory(Device(junk))
    with pytest.raises(KeyError):
        gdr.inspect_memory(Device(KeyError("no device")))
    # __dlpack__ failing in both forms, or failing otherwise: its error, unchanged.
    with pytest.raises(TypeError):
        gdr.inspect_memory(Device((1, 0), TypeError("no max_version, no anything")))
    with pytest.raises(MemoryError):
        gdr.inspect_memory(Device((1, 0), MemoryError("out")))
    weak = weakref.ref(a)
    del a
    gc.collect()
    assert weak() is None, "a failed export kept the array"


def test_doctor_returns_the_report_as_a_dict(tmp_path):
    report = gdr.doctor()
    for key in ("gpudirect_usable", "gpus", "nics", "pairs", "findings", "nccl", "rails"):
        assert key in report, key
    assert isinstance(report["gpudirect_usable"], bool)
    for f in report["findings"]:
        assert f["id"] and f["severity"]
    with pytest.raises(OSError, match="snapshot"):
        gdr.doctor(snapshot=str(tmp_path / "missing.json"))


@pytest.mark.device
def test_a_dlpack_only_tensor_is_registered_moved_and_released_after_the_nic(pair):
    a, b, pb, pa = pair
    n = 1 << 20
    src = np.random.default_rng(5).integers(0, 256, n, dtype=np.uint8)
    dst = np.zeros(n, np.uint8)
    expected = src.copy()
    tensor = DlpackOnly(src)
    released = []
    weakref.finalize(src, lambda: released.append(True))
    before = _gdr._release_stats()
    seg = a.register(tensor, "dl-src")
    assert (seg.length, seg.location, seg.path) == (n, "cpu", "host")
    b.register(DlpackOnly(dst, versioned=False), "dl-dst")
    remote = pb.wait_segment("dl-dst", timeout_s=10)
    t = pb.write(seg, 0, remote, 0, n, timeout_s=60)
    # Drop every reference the application has while the transfer may still run.
    a.deregister(seg)
    del seg, tensor, src
    gc.collect()
    t.wait(60)
    assert np.array_equal(dst, expected), "every byte landed through the DLPack registrations"
    assert eventually(lambda: released), "the DLPack export was never given back"
    after = _gdr._release_stats()
    assert after["exported"] - before["exported"] == 2
    assert after["released"] - before["released"] >= 1


def test_the_capsules_device_decides_not_the_objects_claim():
    # An object claiming a CUDA GPU whose capsule says CPU (numpy made it): gdr reads the
    # device from the capsule it will hold, so this is host memory, taken through DLPack.
    class ClaimsCuda(DlpackOnly):
        def __dlpack_device__(self):
            return (2, 0)

    a = np.zeros(4096, np.uint8)
    info = gdr.inspect_memory(ClaimsCuda(a))
    assert (info["protocol"], info["device"], info["address"]) == ("dlpack 1.0", "cpu", a.ctypes.data)
