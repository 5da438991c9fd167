"""compare-peers' NVIDIA NIXL driver (nixl-cu12, its UCX backend): the target registers its
buffer and hands its agent metadata over; the initiator prepares one descriptor list per
side (one descriptor per block), makes one prepared transfer per block range once, and
reposts it (`transfer`) for every batch, NIXL's fast path; `check_xfer_state` is polled until
DONE. UCX settings (rc_verbs over the device, its GID index) come from the environment that
compare-peers.sh sets; torch is not needed (NIXL imports it only for tensors)."""

import sys

import bench_common


def _agent(name):
    from nixl_cu12._api import nixl_agent, nixl_agent_config

    return nixl_agent(name, nixl_agent_config(backends=["UCX"]))


class Target:
    def __init__(self, view, addr, a):
        self.agent = _agent("compare-peers-target")
        self.reg = self.agent.register_memory([(addr, len(view), 0, "")], "DRAM")

    def info(self):
        return {"metadata": self.agent.get_agent_metadata().hex()}


class Initiator:
    def __init__(self, view, addr, peer, a):
        self.agent = _agent("compare-peers-initiator")
        self.reg = self.agent.register_memory([(addr, len(view), 0, "")], "DRAM")
        self.remote_name = self.agent.add_remote_agent(bytes.fromhex(peer["info"]["metadata"]))
        self.local, self.remote = addr, peer["addr"]

    def prepare(self, blocks, c):
        bs = c.block_size
        op = "WRITE" if c.op == "write" else "READ"
        lh = self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", [(self.local + lo * bs, bs, 0) for lo, _ in blocks], "DRAM")
        rh = self.agent.prep_xfer_dlist(self.remote_name, [(self.remote + r * bs, bs, 0) for _, r in blocks], "DRAM")
        idx = list(range(len(blocks)))
        # Metadata of the remote agent may arrive asynchronously: retry until it is known.
        for _ in range(600):
            try:
                return self._prepped(op, lh, idx, rh)
            except Exception:  # noqa: BLE001 - nixlNotFoundError until the remote is loaded
                import time

                time.sleep(0.05)
        return self._prepped(op, lh, idx, rh)

    def _prepped(self, op, lh, idx, rh):
        return (self.agent.make_prepped_xfer(op, lh, idx, rh, idx), lh, rh)

    def submit(self, h):
        state = self.agent.transfer(h[0])
        if state == "ERR":
            raise RuntimeError("nixl: transfer returned ERR")
        return h[0]

    def wait(self, h):
        check = self.agent.check_xfer_state
        while True:
            state = check(h)
            if state == "DONE":
                return
            if state == "ERR":
                raise RuntimeError("nixl: transfer ended in ERR")

    def release(self, h):
        """The prepared transfer, then its two descriptor lists (the transfer is done)."""
        self.agent.release_xfer_handle(h[0])
        self.agent.release_dlist_handle(h[1])
        self.agent.release_dlist_handle(h[2])


if __name__ == "__main__":
    bench_common.main("nixl", Target, Initiator)
