"""The target of test_two_processes.py, in its own process: registers a numpy pool of KV blocks,
listens, lets the initiator READ it, waits for the notification that follows its WRITE, checks
the pool byte for byte, reports, and exits 0 when the initiator says goodbye.

With ETCD_ENDPOINT (test_etcd.py) it also publishes itself in etcd under its name, advertising
the address it listens on, so that the initiator finds it by name (``Agent.connect_named``).

Usage: python _kv_target.py LISTEN_HOST [ETCD_ENDPOINT]
"""

import hashlib
import os
import sys

import numpy as np

import gdr

BLOCK = 65536
POOL_BLOCKS = 256
SENT_BLOCKS = 96


def pattern(seed, shape):
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def remote_blocks():
    # Where the initiator writes its blocks: scattered over the pool.
    return [(7 * i + 3) % POOL_BLOCKS for i in range(SENT_BLOCKS)]


def local_blocks():
    return list(range(SENT_BLOCKS))[::-1]


def main():
    host = sys.argv[1]
    etcd = sys.argv[2] if len(sys.argv) > 2 else None
    gid = os.environ.get("GDR_TEST_GID_INDEX")
    agent = gdr.Agent("kv-target", device=os.environ["GDR_TEST_DEVICE"],
                      gid_index=int(gid) if gid else None)
    pool = pattern(100, (POOL_BLOCKS, BLOCK))  # what the initiator READs first
    original = pool.copy()
    agent.register(pool, "kv-pool")
    addr = agent.listen(f"{host}:0")
    print(f"LISTEN {addr}", flush=True)
    if etcd is not None:
        directory = gdr.Directory(etcd, ttl_s=5.0)
        agent.publish(directory, addr)
        print(f"PUBLISHED kv-target at {addr} in {directory.prefix}", flush=True)

    note = agent.wait_notification(timeout_s=120)
    assert note is not None, "no notification"
    assert (note.peer, note.data) == ("kv-initiator", b"req-1"), note
    kv = pattern(200, (SENT_BLOCKS, BLOCK))
    expected = original.copy()
    expected[remote_blocks()] = kv[local_blocks()]
    if not np.array_equal(pool, expected):
        bad = [i for i in range(POOL_BLOCKS) if not np.array_equal(pool[i], expected[i])]
        print(f"MISMATCH blocks {bad[:10]}", flush=True)
        return 1
    digest = hashlib.sha256(pool.tobytes()).hexdigest()
    print(f"VERIFIED {SENT_BLOCKS} blocks sha256 {digest}", flush=True)

    bye = agent.wait_notification(timeout_s=120)
    assert bye is not None and bye.data == b"bye", bye
    agent.shutdown(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
