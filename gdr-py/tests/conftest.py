"""Shared fixtures of gdr's pytest suite.

Tests marked ``device`` need the RDMA device named by ``GDR_TEST_DEVICE``: they run inside the
Soft-RoCE VM (``cargo xtask py-test``, or ``cargo xtask vm -- <venv>/bin/python -m pytest ...``),
and FAIL, never skip, when it is not set. On a host without one, deselect them explicitly with
``-m "not device and not gpu and not hw"``. Tests marked ``gpu`` need a CUDA GPU and torch:
the GPU tier runs them on the GPU machine (``gpu-bundle/run.sh``). Tests marked ``hw`` need a
GPU and an RDMA device in one host: real hardware only (``pytest -m hw``).
"""

import os
import time
import time

import pytest

import gdr


def device_under_test() -> str:
    """The device under test, or the test fails."""
    dev = os.environ.get("GDR_TEST_DEVICE")
    if not dev:
        pytest.fail(
            "GDR_TEST_DEVICE is not set: device tests run in the Soft-RoCE VM "
            "(cargo xtask py-test); on a host without a device deselect them with -m 'not device and not gpu and not hw'"
        )
    return dev


def eventually(cond, timeout: float = 10.0) -> bool:
    """Whether ``cond()`` becomes true within ``timeout`` seconds (polled every 5 ms)."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


def agent(name: str, **kwargs) -> gdr.Agent:
    """An agent on the device under test (GID index from GDR_TEST_GID_INDEX when set)."""
    gid = os.environ.get("GDR_TEST_GID_INDEX")
    return gdr.Agent(
        name, device=device_under_test(), gid_index=int(gid) if gid else None, **kwargs
    )


def connect_threads() -> int:
    """Threads of this process the engine makes a connection on (``xfer-connect-<agent>``,
    cut to 15 bytes by Linux)."""
    n = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().startswith("xfer-connect"):
                    n += 1
        except OSError:
            pass  # the thread ended meanwhile
    return n


def wait_for(cond, timeout: float, what: str) -> None:
    """Polls ``cond`` until it holds, or fails after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"{what} not within {timeout} s"
        time.sleep(0.05)


def connected_pair(**kwargs):
    """Two agents of this process (``kwargs`` for both), ``a`` connected to ``b``: yields (a,
    b, a's peer b, b's peer a), then shuts both down."""
    a = agent("py-a", **kwargs)
    b = agent("py-b", **kwargs)
    addr = b.listen("127.0.0.1:0")
    pb = a.connect(addr)
    pa = b.wait_peer("py-a", timeout_s=10)
    yield a, b, pb, pa
    a.shutdown(1.0)
    b.shutdown(1.0)


@pytest.fixture
def pair():
    """Two agents of this process, ``a`` connected to ``b``: (a, b, a's peer b, b's peer a)."""
    yield from connected_pair()


@pytest.fixture
def one_qp_pair():
    """As ``pair``, with one queue pair per peer: its send queue holds 256 requests of 256 KiB
    (64 MiB), so a submitting call cannot post a 128 MiB transfer whole."""
    yield from connected_pair(qps_per_peer=1)


@pytest.fixture
def etcd_server():
    """A real etcd server of its own (Debian's etcd binary on loopback, free ports, a temp data
    directory), killed and removed after the test; see _etcd_server.py."""
    import _etcd_server

    server = _etcd_server.start()
    yield server
    server.stop()
