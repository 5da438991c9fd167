"""The GPU tier of the Python binding: CUDA tensors of torch (and cupy, where installed) through
DLPack, on a machine with a CUDA GPU and torch (the GPU machine: ``cargo xtask gpu-bundle``
builds the wheel into the bundle, ``gpu-bundle/run.sh`` runs this file there with pytest or,
without pytest, with the small runner at the bottom). Marked ``gpu``: deselected on the host
and in the VM, and failing, never skipping, where torch or the GPU is missing.

What it shows: the path gdr chooses for a CUDA tensor and why (``gdr.inspect_memory``: gdr's
pointer checks, the GPU's dma-buf support, an actual dma-buf export of the tensor's range,
peer memory), a managed-memory tensor refused with ``gdr.Unsupported``, strided and host
tensors refused or taken the way ``Agent.register`` takes them, the staging copies a staged
segment uses moving a torch tensor's bytes both ways, and every DLPack export given back. The machine has no RDMA device, so no agent registers here: what only a NIC can decide
(its own dma-buf import) is left to the VM's and real clusters' tiers.
"""

import gc
import sys

try:
    import pytest

    pytestmark = pytest.mark.gpu
except ImportError:  # the standalone runner below
    pytest = None

import gdr


def _torch():
    try:
        import torch
    except ImportError as e:
        raise AssertionError(f"the GPU tier needs torch with CUDA: {e}") from e
    assert torch.cuda.is_available(), "torch sees no CUDA GPU"
    return torch


def _raises(cls, f, *args):
    try:
        f(*args)
    except cls as e:
        return e
    raise AssertionError(f"{f.__name__}{args!r} did not raise {cls.__name__}")


def test_a_torch_cuda_tensor_goes_through_dlpack_and_gdrs_pointer_checks():
    torch = _torch()
    t = torch.zeros((64, 65536), dtype=torch.uint8, device="cuda")
    refs = sys.getrefcount(t)
    info = gdr.inspect_memory(t)
    print(f"torch {torch.__version__} CUDA tensor, 4 MiB: {info}")
    assert info["protocol"] in ("dlpack 1.0", "dlpack")
    assert info["device"] == "cuda:0"
    assert info["address"] == t.data_ptr() and info["length"] == t.numel()
    assert info["pointer_kind"] == "device"
    assert info["ordinal"] == 0
    assert info["allocation_base"] <= t.data_ptr()
    assert info["gpudirect_rdma_supported"] is True
    # The H200 machine: the open kernel module, a dma-buf capable GPU and driver, no peer
    # memory module. gdr exports the tensor's range as a dma-buf and would register it so.
    assert info["dma_buf"] == "ready", info["dma_buf"]
    assert info["dma_buf_export"].startswith("ok:"), info["dma_buf_export"]
    assert info["path"] == "gpudirect-dmabuf", info["why"]
    print(f"path: {info['path']}: {info['why']}")
    # The DLPack export was deleted: the tensor is referenced as before.
    gc.collect()
    assert sys.getrefcount(t) == refs, "the DLPack export of the tensor was kept"


def test_a_sub_tensor_at_an_offset_is_checked_inside_its_allocation():
    torch = _torch()
    pool = torch.zeros((256, 4096), dtype=torch.uint8, device="cuda")
    block = pool[100:108]  # a contiguous view 400 KiB into the allocation
    info = gdr.inspect_memory(block)
    assert info["address"] == pool.data_ptr() + 100 * 4096
    assert info["length"] == 8 * 4096
    assert info["allocation_base"] <= pool.data_ptr()
    assert info["path"] == "gpudirect-dmabuf"


def test_a_strided_cuda_tensor_is_refused_as_not_contiguous():
    torch = _torch()
    t = torch.zeros((64, 128), dtype=torch.float16, device="cuda")
    e = _raises(gdr.NotContiguous, gdr.inspect_memory, t[:, ::2])
    print(f"strided CUDA view: {type(e).__name__}: {e}")


def test_a_managed_memory_tensor_is_refused_with_unsupported():
    torch = _torch()
    managed = None
    how = ""
    try:
        import cupy

        mem = cupy.cuda.malloc_managed(1 << 20)
        managed = cupy.ndarray((1 << 20,), dtype=cupy.uint8, memptr=mem)
        how = f"cupy {cupy.__version__} ndarray on cupy.cuda.malloc_managed"
    except ImportError as err:
        # torch's own allocator makes no managed memory; the GPU machine has cupy.
        raise AssertionError(f"the managed-memory test needs cupy: {err}") from err
    e = _raises(gdr.Unsupported, gdr.inspect_memory, managed)
    print(f"{how}: {type(e).__name__}: {e} (hint: {e.hint})")
    assert "managed" in str(e)
    # The same memory seen through torch (DLPack from cupy to torch, then to gdr), where torch
    # takes managed memory at all.
    try:
        t = torch.from_dlpack(managed)
    except Exception as err:  # torch's refusal, not gdr's
        print(f"torch.from_dlpack of managed memory: torch refuses it ({err})")
        return
    e = _raises(gdr.Unsupported, gdr.inspect_memory, t)
    print(f"torch.from_dlpack of it: {type(e).__name__}: {e}")


def test_a_cupy_array_takes_the_same_path_as_torch():
    _torch()
    import cupy

    a = cupy.zeros(1 << 20, dtype=cupy.uint8)
    info = gdr.inspect_memory(a)
    assert info["device"] == "cuda:0" and info["address"] == a.data.ptr
    assert info["path"] == "gpudirect-dmabuf", info["why"]


def test_host_tensors_are_host_memory():
    torch = _torch()
    cpu = torch.arange(4096, dtype=torch.int32)  # no buffer protocol: DLPack
    info = gdr.inspect_memory(cpu)
    assert info == {
        "protocol": info["protocol"],
        "device": "cpu",
        "address": cpu.data_ptr(),
        "length": 4 * 4096,
    }
    assert info["protocol"].startswith("dlpack")
    pinned = torch.zeros(1 << 16, dtype=torch.uint8).pin_memory()
    info = gdr.inspect_memory(pinned)
    assert info["address"] == pinned.data_ptr() and "pointer_kind" not in info
    print(f"torch CPU tensor: {info['protocol']}, pinned: device {info['device']}")


def test_gdrs_staging_copies_move_a_cuda_tensors_bytes_both_ways():
    # The copies a staged segment uses (no direct path): gdr's Stager through pinned bounce
    # buffers, and the synchronous copy of Segment.read, on a torch tensor taken through DLPack.
    torch = _torch()
    from gdr import _gdr

    n = (16 << 20) + 4096 + 3  # not a multiple of the bounce buffers' chunks
    t = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    want = t.cpu().numpy().tobytes()
    piped, sync = _gdr._staged_read_for_test(t)
    assert piped == want, "the staged device-to-host copy differs from torch's"
    assert sync == want, "the synchronous copy differs from torch's"
    data = bytes(reversed(want))
    _gdr._staged_write_for_test(t, data)
    torch.cuda.synchronize()
    assert t.cpu().numpy().tobytes() == data, "the staged host-to-device copy differs"
    # A sub-tensor at an offset inside its allocation: only its own bytes move.
    pool = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    view = pool[4096:8192]
    _gdr._staged_write_for_test(view, b"\x5a" * 4096)
    torch.cuda.synchronize()
    host = pool.cpu()
    assert int(host[4096:8192].eq(0x5A).sum()) == 4096
    assert int(host[:4096].count_nonzero()) == 0 and int(host[8192:].count_nonzero()) == 0
    e = _raises(gdr.InvalidArgument, _gdr._staged_write_for_test, view, b"short")
    print(f"{n} bytes staged both ways, byte for byte; a short write: {e}")
    # Host memory is not for these copies.
    _raises(gdr.InvalidArgument, _gdr._staged_read_for_test, torch.zeros(8))


def test_a_cuda_address_alone_is_checked_as_its_tensor_would_be():
    # The drop-ins' VRAM by address (NIXL's (address, length, device) tuples, Mooncake's
    # location "cuda:N"): a DLPack exporter over the range (gdr._by_address.DeviceRange),
    # through the same pointer checks as a tensor.
    torch = _torch()
    import ctypes

    from gdr import _by_address

    t = torch.zeros(4 << 20, dtype=torch.uint8, device="cuda")
    r = _by_address.DeviceRange(t.data_ptr() + 65536, 1 << 20, 0)
    info = gdr.inspect_memory(r)
    print(f"a CUDA address alone, 1 MiB at offset 64 KiB: {info['pointer_kind']}, {info['path']}")
    assert info["pointer_kind"] == "device" and info["ordinal"] == 0
    assert (info["address"], info["length"]) == (t.data_ptr() + 65536, 1 << 20)
    assert info["allocation_base"] <= t.data_ptr()
    assert info["path"] == "gpudirect-dmabuf", info["why"]
    # A range running past its allocation, and host memory named as CUDA memory, are refused.
    e = _raises(gdr.GdrError, gdr.inspect_memory, _by_address.DeviceRange(t.data_ptr(), 1 << 40, 0))
    print(f"past its allocation: {type(e).__name__}: {e}")
    host = bytearray(65536)
    addr = ctypes.addressof((ctypes.c_char * len(host)).from_buffer(host))
    e = _raises(gdr.GdrError, gdr.inspect_memory, _by_address.DeviceRange(addr, len(host), 0))
    print(f"host memory as CUDA memory: {type(e).__name__}: {e}")
    gc.collect()
    assert not _by_address._EXPORTED, "a DLPack struct was never given back"


def test_no_rdma_device_here_is_a_typed_error():
    e = _raises(gdr.RdmaError, gdr.Agent, "gpu-tier")
    print(f"Agent() on a machine without RDMA devices: {type(e).__name__}: {e}")


def test_the_doctor_report_names_the_gpu():
    torch = _torch()
    report = gdr.doctor()
    names = [g.get("name", "") for g in report["gpus"]]
    print(f"doctor: gpudirect_usable={report['gpudirect_usable']}, gpus={names}, "
          f"nics={len(report['nics'])}, findings={[f['id'] for f in report['findings']]}")
    assert any(torch.cuda.get_device_name(0) in n or n in torch.cuda.get_device_name(0)
               for n in names), names


if __name__ == "__main__":
    # Without pytest: run every test, report each, exit non-zero on any failure.
    import traceback

    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    failed = 0
    for name, f in tests:
        try:
            f()
            print(f"PASSED {name}")
        except Exception:
            failed += 1
            traceback.print_exc()
            print(f"FAILED {name}")
    print(f"{len(tests) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
