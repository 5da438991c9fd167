"""compare-peers' Mooncake Transfer Engine driver (the Python batch API of
mooncake-transfer-engine-non-cuda): P2P handshake, the rdma protocol on one device, one
`batch_transfer_async_*` call per batch (a list of addresses and lengths, one per block),
`get_batch_transfer_status` to wait for it. MC_GID_INDEX and MC_NUM_QP_PER_EP come from the
options; MC_LOG_LEVEL=WARNING unless set (at INFO it logs every batch)."""

import os
import sys

import bench_common


def _engine(a):
    os.environ.setdefault("MC_GID_INDEX", str(a.gid_index))
    os.environ.setdefault("MC_NUM_QP_PER_EP", str(a.qps))
    os.environ.setdefault("MC_LOG_LEVEL", "WARNING")
    from mooncake.engine import TransferEngine

    te = TransferEngine()
    rc = te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", a.device)
    if rc != 0:
        sys.exit(f"mooncake: initialize(127.0.0.1, P2PHANDSHAKE, rdma, {a.device}) returned {rc}")
    return te


class Target:
    def __init__(self, view, addr, a):
        self.te = _engine(a)
        if self.te.register_memory(addr, len(view)) != 0:
            sys.exit("mooncake: register_memory failed on the target")

    def info(self):
        return {"session": f"127.0.0.1:{self.te.get_rpc_port()}"}


class Initiator:
    def __init__(self, view, addr, peer, a):
        self.te = _engine(a)
        if self.te.register_memory(addr, len(view)) != 0:
            sys.exit("mooncake: register_memory failed on the initiator")
        self.session = peer["info"]["session"]
        self.local, self.remote = addr, peer["addr"]

    def prepare(self, blocks, c):
        bs = c.block_size
        post = self.te.batch_transfer_async_write if c.op == "write" else self.te.batch_transfer_async_read
        return (
            post,
            [self.local + lo * bs for lo, _ in blocks],
            [self.remote + r * bs for _, r in blocks],
            [bs] * len(blocks),
        )

    def submit(self, h):
        bid = h[0](self.session, h[1], h[2], h[3])
        if bid == 0:
            raise RuntimeError("mooncake: batch_transfer_async returned 0 (submission failed)")
        return bid

    def wait(self, bid):
        if self.te.get_batch_transfer_status([bid]) != 0:
            raise RuntimeError(f"mooncake: batch {bid} failed")

    def release(self, h):
        """A handle is plain lists: nothing to release."""


if __name__ == "__main__":
    bench_common.main("mooncake", Target, Initiator)
