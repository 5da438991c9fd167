"""The workload of ``cargo xtask py-cost`` (not a pytest module): two agents of this process on
the device under test (``GDR_TEST_DEVICE``, the Soft-RoCE VM), and ``CALLS`` submissions of
``Peer.transfer_blocks`` with ``BLOCKS`` blocks of 4 KiB each, the block indices given as a
``list`` or a numpy array (``KIND``). Each transfer is waited for before the next, outside the
submission. Run under callgrind with collection toggled on inside the binding's method, the
inclusive costs of the binding's method and of the Rust API it calls
(``gdr_xfer::peer::Peer::transfer_blocks``) give the binding's own instructions per call.

    python _binding_cost.py BLOCKS CALLS KIND
"""

import os
import sys

import numpy as np

import gdr


def main() -> None:
    blocks, calls, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dev = os.environ["GDR_TEST_DEVICE"]
    gid = os.environ.get("GDR_TEST_GID_INDEX")
    gid_index = int(gid) if gid else None
    a = gdr.Agent("cost-a", device=dev, gid_index=gid_index)
    b = gdr.Agent("cost-b", device=dev, gid_index=gid_index)
    block = 4096
    src = np.zeros(blocks * block, np.uint8)
    dst = np.zeros(2 * blocks * block, np.uint8)
    local = a.register(src, "src")
    b.register(dst, "dst")
    peer = a.connect(b.listen("127.0.0.1:0"))
    remote = peer.wait_segment("dst", timeout_s=30)
    # Every other block on the target: nothing merges, one request per block.
    local_idx = list(range(blocks))
    remote_idx = list(range(0, 2 * blocks, 2))
    if kind == "numpy":
        local_idx = np.array(local_idx, dtype=np.int64)
        remote_idx = np.array(remote_idx, dtype=np.int64)
    elif kind != "list":
        raise SystemExit(f"KIND is list or numpy, not {kind!r}")
    for _ in range(calls):
        t = peer.transfer_blocks("write", local, local_idx, remote, remote_idx, block)
        t.wait(120)
    print(f"binding-cost-run blocks={blocks} calls={calls} kind={kind}")
    a.shutdown(1.0)
    b.shutdown(1.0)


if __name__ == "__main__":
    main()
