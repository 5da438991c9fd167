"""Two Python processes hand KV blocks over through numpy arrays (the device under test, the
target in a subprocess: _kv_target.py): the initiator READs the target's pool and WRITEs its
blocks into it with a notification; both sides check every byte."""

import hashlib
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import _kv_target as target
from conftest import agent, device_under_test

pytestmark = pytest.mark.device


def readline(proc, timeout):
    """The target's next line of output, or fail after `timeout` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            return line.strip()
    proc.kill()
    out, err = proc.communicate(timeout=10)
    pytest.fail(f"the target said nothing in {timeout} s; stdout {out!r} stderr {err!r}")


def test_two_processes_hand_blocks_over_byte_for_byte():
    device_under_test()
    host = os.environ.get("GDR_TEST_ADDR", "127.0.0.1")
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("_kv_target.py")), host],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = readline(proc, 120)
        assert line.startswith("LISTEN "), line
        addr = line.split()[1]

        me = agent("kv-initiator")
        kv = target.pattern(200, (target.SENT_BLOCKS, target.BLOCK))
        local = me.register(kv, "kv-cache")
        peer = me.connect(addr)
        assert peer.name == "kv-target"
        pool = peer.wait_segment("kv-pool", timeout_s=30)
        assert pool.length == target.POOL_BLOCKS * target.BLOCK

        # READ the whole pool into a numpy array of this process: the target's bytes.
        copy = np.zeros((target.POOL_BLOCKS, target.BLOCK), np.uint8)
        mine = me.register(copy, "pool-copy")
        read = peer.transfer_blocks("read", mine, range(target.POOL_BLOCKS), pool,
                                    range(target.POOL_BLOCKS), target.BLOCK, timeout_s=60)
        read_stats = read.wait(60)
        assert np.array_equal(copy, target.pattern(100, copy.shape)), "READ byte for byte"

        # WRITE the KV blocks, scattered, with the notification after the data.
        t = peer.transfer_blocks("write", local, target.local_blocks(), pool,
                                 target.remote_blocks(), target.BLOCK, notify=b"req-1",
                                 timeout_s=60)
        stats = t.wait(60)
        assert stats["bytes"] == target.SENT_BLOCKS * target.BLOCK
        line = readline(proc, 120)
        assert line.startswith("VERIFIED"), line

        # This side's view of the result (READ again) is the same, to the digest.
        peer.transfer_blocks("read", mine, range(target.POOL_BLOCKS), pool,
                             range(target.POOL_BLOCKS), target.BLOCK).wait(60)
        assert hashlib.sha256(copy.tobytes()).hexdigest() == line.split()[-1]

        peer.send_notification(b"bye").wait(30)
        assert proc.wait(timeout=60) == 0
        print(f"two processes: READ {read_stats['bytes']} bytes, WRITE {stats['bytes']} bytes "
              f"in {stats['descriptors']} blocks ({stats['runs']} runs, {stats['slices']} "
              f"slices), verified on both sides: {line}")
        me.shutdown(1.0)
    finally:
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate(timeout=10)
        if proc.returncode not in (0, None):
            print(f"target exited {proc.returncode}: stdout {out!r} stderr {err!r}")
