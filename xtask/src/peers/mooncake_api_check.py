"""The differential test of gdr's Mooncake drop-in: one program, written against Mooncake's
`TransferEngine` (the Python API SGLang calls), run once on `mooncake.engine` and once on
`gdr.mooncake` (`--impl`), two processes (a target and an initiator, on a loopback control
socket). Each call prints one line, as in nixl_api_check.py:

    step NAME: ok TYPE [VALUE]
    step NAME: raises CLASS

Mooncake answers with integers (0, or a negative code); the values are printed. The bytes are
checked on both sides.
"""

import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common  # noqa: E402 - the control socket's messages and the fill
from api_check import BLOCK, BLOCKS, dial, digest, forked, goodbye, main, region, step  # noqa: E402


def load(impl):
    """The engine module: TransferEngine, TransferOpcode, TransferNotify."""
    if impl == "mooncake":
        import mooncake.engine as mc
    else:
        import gdr.mooncake.engine as mc
    return mc


def engine(mc, device):
    te = step("TransferEngine", mc.TransferEngine, show=False)
    step("initialize", te.initialize, "127.0.0.1", "P2PHANDSHAKE", "rdma", device)
    return te


def target(mc, a):
    te = engine(mc, a.device)
    port = step("get_rpc_port", te.get_rpc_port, show=False)
    print(f"step get_rpc_port > 0: ok bool {bool(port and port > 0)!r}", flush=True)
    mm, view, addr = region(2 * BLOCKS * BLOCK)
    bench_common.fill(view, 7)
    step("register_memory", te.register_memory, addr, len(view))
    mm2, view2, addr2 = region(BLOCKS * BLOCK)
    step("batch_register_memory", te.batch_register_memory, [addr2], [len(view2)])
    ls = socket.create_server(("127.0.0.1", a.port))
    conn, _ = ls.accept()
    bench_common.send(conn, {"session": f"127.0.0.1:{port}", "addr": addr, "addr2": addr2})
    while True:
        msg = bench_common.recv(conn)
        if "bye" in msg:
            break
        if "notifies" in msg:
            got = []
            deadline = time.time() + 30
            while not got and time.time() < deadline:
                got = te.get_notifies()
            print(f"step get_notifies: ok list {sorted((n.name, n.msg) for n in got)!r}", flush=True)
            bench_common.send(conn, {"ok": True})
            continue
        bench_common.send(conn, {"digest": digest(view, msg["digest"])})
    step("batch_unregister_memory", te.batch_unregister_memory, [addr2])
    step("unregister_memory", te.unregister_memory, addr)
    step("unregister_memory again", te.unregister_memory, addr)
    conn.close()
    sys.stdout.flush()
    os._exit(0)


def initiator(mc, a):
    bad = step("TransferEngine (for a missing device)", mc.TransferEngine, show=False)
    step("initialize(no such device)", bad.initialize, "127.0.0.1", "P2PHANDSHAKE", "rdma", "nosuchdev0")
    te = engine(mc, a.device)
    ext = step("TransferEngine (initialize_ext)", mc.TransferEngine, show=False)
    step("initialize_ext", ext.initialize_ext, "127.0.0.1", "P2PHANDSHAKE", "rdma", a.device, "")
    step("get_local_topology", te.get_local_topology, a.device, show=False)
    mm, view, addr = region(2 * BLOCKS * BLOCK)
    bench_common.fill(view, 8)
    step("register_memory", te.register_memory, addr, len(view))
    conn = dial(a.port)
    peer = bench_common.recv(conn)
    session, raddr = peer["session"], peer["addr"]
    first = step("get_first_buffer_address", te.get_first_buffer_address, session, show=False)
    print(f"step get_first_buffer_address is the first: ok bool {first == raddr!r}", flush=True)

    def check(name, blocks_remote, blocks_local):
        bench_common.send(conn, {"digest": blocks_remote})
        theirs = bench_common.recv(conn)["digest"]
        print(f"step {name} bytes: ok bool {theirs == digest(view, blocks_local)!r}", flush=True)

    step("transfer_sync_write", te.transfer_sync_write, session, addr, raddr + 3 * BLOCK, BLOCK)
    check("transfer_sync_write", [3], [0])
    idx = list(range(BLOCKS))
    sc = [bench_common.scatter(i, BLOCKS) for i in idx]
    lb = [addr + i * BLOCK for i in idx]
    rb = [raddr + s * BLOCK for s in sc]
    step("batch_transfer_sync_write", te.batch_transfer_sync_write, session, lb, rb, [BLOCK] * BLOCKS)
    check("batch_transfer_sync_write", sc, idx)
    bench_common.fill(view[: BLOCKS * BLOCK], 9)
    bid = step("batch_transfer_async_write", te.batch_transfer_async_write, session, lb, rb, [BLOCK] * BLOCKS, show=False)
    print(f"step batch id > 0: ok bool {bool(bid and bid > 0)!r}", flush=True)
    step("get_batch_transfer_status", te.get_batch_transfer_status, [bid])
    check("batch_transfer_async_write", sc, idx)
    forked("get_batch_transfer_status(same id again)", te.get_batch_transfer_status, [bid])
    back = [addr + (BLOCKS + i) * BLOCK for i in idx]
    bid = te.batch_transfer_async_read(session, back, rb, [BLOCK] * BLOCKS)
    step("get_batch_transfer_status(read)", te.get_batch_transfer_status, [bid])
    same = bytes(view[BLOCKS * BLOCK :]) == bytes(view[: BLOCKS * BLOCK])
    print(f"step batch_transfer_async_read bytes: ok bool {same!r}", flush=True)
    step("transfer_sync_read", te.transfer_sync_read, session, addr + BLOCKS * BLOCK, raddr, BLOCK)
    step("batch_transfer_sync_read", te.batch_transfer_sync_read, session, back, rb, [BLOCK] * BLOCKS)
    bid = step("batch_transfer_async(Write)", te.batch_transfer_async, session, lb, rb, [BLOCK] * BLOCKS, mc.TransferOpcode.Write, show=False)
    step("get_batch_transfer_status(batch_transfer_async)", te.get_batch_transfer_status, [bid])
    step("transfer_sync(Read)", te.transfer_sync, session, addr + BLOCKS * BLOCK, raddr, BLOCK, mc.TransferOpcode.Read)
    note = mc.TransferNotify("check-initiator", "batch 7 done")
    step("batch_transfer_sync(Write, notify)", te.batch_transfer_sync, session, lb, rb, [BLOCK] * BLOCKS, mc.TransferOpcode.Write, note)
    bench_common.send(conn, {"notifies": True})
    bench_common.recv(conn)
    step("send_probe", te.send_probe, session)
    sid = step("transfer_submit_write", te.transfer_submit_write, session, addr, raddr, BLOCK, show=False)
    st = 0
    deadline = time.time() + 30
    while st == 0 and time.time() < deadline:
        st = te.transfer_check_status(sid)
    print(f"step transfer_check_status until done: ok int {st!r}", flush=True)
    # Refusals: a remote range outside every registration, lengths that differ, an unknown
    # session, a local range not registered.
    step("transfer_sync_write(outside)", te.transfer_sync_write, session, addr, raddr + 64 * BLOCKS * BLOCK, BLOCK)
    step("batch_transfer_sync_write(lists differ)", te.batch_transfer_sync_write, session, lb, rb[:-1], [BLOCK] * BLOCKS)
    step("transfer_sync_write(unregistered local)", te.transfer_sync_write, session, addr + 4 * BLOCKS * BLOCK, raddr, BLOCK)
    forked("get_batch_transfer_status(unknown)", te.get_batch_transfer_status, [123456789])
    buf = step("allocate_managed_buffer", te.allocate_managed_buffer, 1 << 20, show=False)
    print(f"step allocate_managed_buffer > 0: ok bool {bool(buf and buf > 0)!r}", flush=True)
    if buf:  # 0: it failed (writing there would crash)
        step("write_bytes_to_buffer", te.write_bytes_to_buffer, buf, b"hello", 5)
        step("read_bytes_from_buffer", te.read_bytes_from_buffer, buf, 5)
        step("transfer_sync_write(managed)", te.transfer_sync_write, session, buf, raddr + 5 * BLOCK, 5)
        step("free_managed_buffer", te.free_managed_buffer, buf, 1 << 20)
    step("warmup_efa_segment", te.warmup_efa_segment, session)
    step("get_engine_ptr", te.get_engine_ptr, show=False)
    step("unregister_memory", te.unregister_memory, addr)
    step("unregister_memory(never registered)", te.unregister_memory, addr + 4096)
    goodbye(bench_common.send, conn)


if __name__ == "__main__":
    main("Mooncake", ["mooncake", "gdr"], load, target, initiator)
