"""CUDA tensors through an agent, end to end: for a host with both a CUDA GPU (torch) and an
RDMA device (``GDR_TEST_DEVICE``). Marked ``hw``: no tier of this repository has such a host
(the VM has no GPU, the GPU machine no RDMA device), so ``cargo xtask test`` deselects them; on
real hardware run ``pytest -m hw gdr-py/tests`` with ``GDR_TEST_DEVICE`` set. Like the device
tests, they fail, never skip, without what they need.
"""

import gc
import weakref

import numpy as np
import pytest

import gdr
from gdr import _gdr

from conftest import agent, eventually

pytestmark = pytest.mark.hw

WAIT = 60.0


def _torch():
    try:
        import torch
    except ImportError as e:
        raise AssertionError(f"the hw tests need torch with CUDA: {e}") from e
    assert torch.cuda.is_available(), "torch sees no CUDA GPU"
    return torch


def test_a_cuda_tensor_is_written_and_read_back_through_its_registration():
    torch = _torch()
    a, b = agent("hw-a"), agent("hw-b")
    try:
        peer = a.connect(b.listen("127.0.0.1:0"))
        n = 8 << 20
        src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
        back = torch.zeros(n, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        want = src.cpu().numpy().tobytes()
        s = a.register(src, "gpu-src")
        k = a.register(back, "gpu-back")
        print(f"CUDA tensor segments: {s!r} ({s.path})")
        assert s.location == "cuda:0"
        assert s.path.startswith(("gpudirect-", "staged: ")), s.path
        dst = np.zeros(n, np.uint8)  # host memory on the target: every path can reach it
        b.register(dst, "host-dst")
        remote = peer.wait_segment("host-dst", timeout_s=10)
        before = _gdr._release_stats()
        weak = weakref.ref(src)
        t = peer.write(s, 0, remote, 0, n, timeout_s=WAIT)
        # The application lets go of everything while the write may still run.
        a.deregister(s)
        del s, src
        gc.collect()
        t.wait(WAIT)
        assert dst.tobytes() == want, "every byte of the CUDA tensor landed"
        peer.read(k, 0, remote, 0, n, timeout_s=WAIT).wait(WAIT)
        torch.cuda.synchronize()
        assert back.cpu().numpy().tobytes() == want, "every byte came back into the tensor"
        assert eventually(lambda: weak() is None), "the tensor was never given back"
        assert _gdr._release_stats()["released"] > before["released"]
    finally:
        a.shutdown(1.0)
        b.shutdown(1.0)


def test_managed_memory_is_refused_by_register():
    _torch()
    import cupy

    managed = cupy.ndarray((1 << 20,), dtype=cupy.uint8, memptr=cupy.cuda.malloc_managed(1 << 20))
    a = agent("hw-managed")
    try:
        with pytest.raises(gdr.Unsupported, match="managed"):
            a.register(managed, "managed")
        assert a.segments() == []
    finally:
        a.shutdown(1.0)
