"""No Python input crashes the process: junk arguments to every method raise exceptions (never
a Rust panic, which PyO3 would raise as PanicException, a BaseException), and a process that
exits with agents, segments and a transfer in flight exits cleanly."""

import os
import random
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import gdr

from conftest import device_under_test

pytestmark = pytest.mark.device

JUNK = [None, -1, 2**70, 0.01, float("nan"), "x", b"", bytearray(3), object(), [], [-1], {},
        (1, 2)]
# Waits whose timeout is the last argument: None or 2**70 would wait for ever.
WAITS = ("wait_peer", "wait_segment", "wait_notification")


def test_junk_arguments_raise_exceptions_never_panics(pair):
    a, b, pb, pa = pair
    seg = a.register(np.zeros(4096, np.uint8), "s")
    b.register(np.zeros(4096, np.uint8), "d")
    d = pb.wait_segment("d")
    local = gdr.LocalList([(seg, 0, 4096)])
    remote = gdr.RemoteList(pb, [(d, 0, 4096)])
    rng = random.Random(0)
    # connect and listen are left out (junk addresses would need a name resolver); shutdown
    # and disconnect would end the test's agents.
    methods = [
        (a.register, 2), (a.alloc, 2), (a.wait_peer, 2), (a.peer, 1), (a.deregister, 1),
        (a.wait_notification, 1), (pb.wait_segment, 2), (pb.segment, 1),
        (pb.send_notification, 1), (pb.write, 5), (pb.read, 5), (pb.transfer_blocks, 6),
        (seg.read, 2), (seg.write, 2), (pb.transfer_pools, 5), (gdr.inspect_memory, 1),
        (gdr.LocalList, 1), (lambda ranges: gdr.RemoteList(pb, ranges), 1),
        (lambda li, ri: pb.transfer_indexed("write", local, li, remote, ri), 2),
    ]
    tried = 0
    for method, arity in methods:
        for _ in range(200):
            args = [rng.choice(JUNK) for _ in range(arity)]
            if method.__name__ in WAITS and (args[-1] is None or args[-1] == 2**70):
                args[-1] = 0.01
            tried += 1
            try:
                r = method(*args)
                if isinstance(r, gdr.Transfer):
                    r.wait(10)
            except Exception:
                pass  # any Exception is fine; a PanicException is a BaseException: it fails
    for junk in JUNK:
        with pytest.raises(TypeError):
            a.disconnect(junk)
    assert pb.is_connected
    print(f"{tried} calls with junk arguments: exceptions only, no crash and no panic")


def test_exit_with_a_transfer_in_flight_and_agents_alive_is_clean():
    dev = device_under_test()
    script = textwrap.dedent(f"""
        import numpy as np, gdr
        a = gdr.Agent("exit-a", device={dev!r})
        b = gdr.Agent("exit-b", device={dev!r})
        pb = a.connect(b.listen("127.0.0.1:0"))
        n = 64 << 20
        arr = np.ones(n, np.uint8)
        seg = a.register(arr, "s")
        b.register(np.zeros(n, np.uint8), "d")
        r = pb.wait_segment("d")
        t = pb.write(seg, 0, r, 0, n)
        a.deregister(seg)
        del seg, arr
        small = bytearray(4096)
        s2 = a.register(small, "small")
        a.deregister(s2)
        del s2   # handed back just before exit
        print("exiting with", t.status, flush=True)
    """)
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    took = time.monotonic() - start
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    assert "exiting with" in p.stdout
    assert "Fatal" not in p.stderr and "panick" not in p.stderr, p.stderr
    print(f"exit with a transfer in flight: rc 0 in {took:.1f} s ({p.stdout.strip()})")
