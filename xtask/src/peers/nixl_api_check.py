"""The differential test of gdr's NIXL drop-in: one program, written against NIXL's Python API,
run once on NIXL (`nixl_cu12._api`) and once on `gdr.nixl` (`--impl`), two processes (a target
and an initiator, on a loopback control socket). Each call it makes prints one line:

    step NAME: ok TYPE [VALUE]        (VALUE where it is deterministic: states, names, counts)
    step NAME: raises CLASS

`cargo xtask dropins` runs both and compares the lines; the bytes are checked on both sides
(a digest of the blocks each transfer moved), and the target checks that a transfer's
notification came after its bytes.
"""

import os
import socket
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common  # noqa: E402 - the control socket's messages and the fill
from api_check import BLOCK, BLOCKS, dial, digest, goodbye, main, region, step  # noqa: E402


def load(impl):
    if impl == "nixl":
        from nixl_cu12 import _api
    else:
        from gdr.nixl import _api
    return _api


def target(api, a):
    cfg = step("nixl_agent_config", api.nixl_agent_config, backends=["UCX"], show=False)
    agent = step("nixl_agent", api.nixl_agent, "check-target", cfg, show=False)
    mm, view, addr = region(2 * BLOCKS * BLOCK)
    bench_common.fill(view, 7)
    reg = step("register_memory", agent.register_memory, [(addr, len(view), 0, "")], "DRAM", show=False)
    step("get_reg_descs", agent.get_reg_descs, [(addr, len(view), 0, "")], "DRAM", show=False)
    md = step("get_agent_metadata", agent.get_agent_metadata, show=False)
    step("get_plugin_list has UCX", lambda: "UCX" in agent.get_plugin_list())
    step("get_backend_mem_types(UCX)", lambda: repr(agent.get_backend_mem_types("UCX")))
    step("get_plugin_params(UCX) is a dict", lambda: isinstance(agent.get_plugin_params("UCX"), dict))
    step("get_backend_params(UCX) is a dict", lambda: isinstance(agent.get_backend_params("UCX"), dict))
    step("get_partial_agent_metadata", agent.get_partial_agent_metadata, reg, True, show=False)
    step("query_memory", agent.query_memory, reg, "UCX", "DRAM", show=False)
    step("send_local_metadata", agent.send_local_metadata)
    step("invalidate_local_metadata", agent.invalidate_local_metadata)
    step("get_plugin_mem_types(UCX)", lambda: repr(agent.get_plugin_mem_types("UCX")))
    ls = socket.create_server(("127.0.0.1", a.port))
    conn, _ = ls.accept()
    bench_common.send(conn, {"md": md.hex(), "addr": addr, "len": len(view)})
    while True:
        msg = bench_common.recv(conn)
        if "bye" in msg:
            break
        if "digest" in msg:
            bench_common.send(conn, {"digest": digest(view, msg["digest"])})
        elif "notif" in msg:
            # Wait for the tagged notification, then check that the bytes came first.
            tag = msg["notif"].encode()
            deadline = time.time() + 30
            found = False
            while time.time() < deadline and not found:
                found = agent.check_remote_xfer_done("check-initiator", tag)
                if not found:
                    time.sleep(0.01)
            print(f"step check_remote_xfer_done({msg['notif']}): ok bool {found!r}", flush=True)
            bench_common.send(conn, {"found": found, "digest": digest(view, msg["blocks"])})
        elif "plain" in msg:
            deadline = time.time() + 30
            got = {}
            while time.time() < deadline and not got:
                got = agent.get_new_notifs()
                if not got:
                    time.sleep(0.01)
            print(f"step get_new_notifs: ok {type(got).__name__} {sorted((k, v) for k, v in got.items())!r}", flush=True)
            step("update_notifs", agent.update_notifs)
            bench_common.send(conn, {"ok": True})
    step("deregister_memory", agent.deregister_memory, reg)
    step("deregister_memory again", agent.deregister_memory, reg)
    conn.close()
    sys.stdout.flush()
    os._exit(0)


def initiator(api, a):
    agent = step("nixl_agent", api.nixl_agent, "check-initiator", api.nixl_agent_config(backends=["UCX"]), show=False)
    step("nixl_agent(backends=[GDS])", api.nixl_agent, "check-gds", api.nixl_agent_config(backends=["GDS"]), show=False)
    mm, view, addr = region(2 * BLOCKS * BLOCK)
    bench_common.fill(view, 8)
    step("register_memory", agent.register_memory, [(addr, len(view), 0, "")], "DRAM", show=False)
    step("register_memory(FILE)", agent.register_memory, [(0, 4096, 3, "f")], "FILE", show=False)
    conn = dial(a.port)
    peer = bench_common.recv(conn)
    md, raddr = bytes.fromhex(peer["md"]), peer["addr"]
    name = step("add_remote_agent", agent.add_remote_agent, md)
    step("add_remote_agent again", agent.add_remote_agent, md)
    step("add_remote_agent(garbage)", agent.add_remote_agent, b"not metadata", show=False)
    step("check_remote_metadata", agent.check_remote_metadata, name)
    step("check_remote_metadata(nobody)", agent.check_remote_metadata, "nobody")
    step("make_connection", agent.make_connection, name)
    step("fetch_remote_metadata(nobody)", agent.fetch_remote_metadata, "nobody")

    local = [(addr + i * BLOCK, BLOCK, 0) for i in range(BLOCKS)]
    remote = [(raddr + bench_common.scatter(i, BLOCKS) * BLOCK, BLOCK, 0) for i in range(BLOCKS)]
    lh = step("prep_xfer_dlist(NIXL_INIT_AGENT)", agent.prep_xfer_dlist, "NIXL_INIT_AGENT", local, "DRAM", show=False)
    rh = None
    for _ in range(600):  # the remote's registrations may arrive after its metadata
        try:
            rh = agent.prep_xfer_dlist(name, remote, "DRAM")
            break
        except Exception:  # noqa: BLE001
            time.sleep(0.05)
    print(f"step prep_xfer_dlist(remote): ok {type(rh).__name__}", flush=True)
    step("prep_xfer_dlist(nobody)", agent.prep_xfer_dlist, "nobody", remote, "DRAM", show=False)
    step("prep_xfer_dlist(outside)", agent.prep_xfer_dlist, name, [(raddr + 64 * BLOCKS * BLOCK, BLOCK, 0)], "DRAM", show=False)
    idx = list(range(BLOCKS))
    xh = step("make_prepped_xfer(WRITE)", agent.make_prepped_xfer, "WRITE", lh, idx, rh, idx, b"", show=False)
    step("make_prepped_xfer(BAD)", agent.make_prepped_xfer, "BAD", lh, idx, rh, idx, show=False)
    step("make_prepped_xfer(counts differ)", agent.make_prepped_xfer, "WRITE", lh, idx, rh, idx[:-1], show=False)
    step("make_prepped_xfer(index out of range)", agent.make_prepped_xfer, "WRITE", lh, [BLOCKS], rh, [0], show=False)
    step("check_xfer_state(never posted)", agent.check_xfer_state, xh)
    state = agent.transfer(xh)
    # "DONE" when the transfer finished inside the call (small ones may), else "PROC".
    print(f"step transfer(WRITE): ok str {state in ('PROC', 'DONE')!r}", flush=True)
    deadline = time.time() + 30
    while state == "PROC" and time.time() < deadline:
        state = agent.check_xfer_state(xh)
    print(f"step check_xfer_state until done: ok str {state!r}", flush=True)
    bench_common.send(conn, {"digest": [bench_common.scatter(i, BLOCKS) for i in idx]})
    theirs = bench_common.recv(conn)["digest"]
    print(f"step WRITE bytes: ok bool {theirs == digest(view, idx)!r}", flush=True)
    step("query_xfer_backend", agent.query_xfer_backend, xh)
    step("estimate_xfer_cost", agent.estimate_xfer_cost, xh, show=False)
    step("get_xfer_telemetry(no capture)", agent.get_xfer_telemetry, xh, show=False)
    step("transfer(WRITE, again)", lambda: agent.transfer(xh) in ("PROC", "DONE"))
    while agent.check_xfer_state(xh) == "PROC":
        pass

    # A WRITE with a notification: the target checks its bytes once the tag arrived.
    def notified(kind, h, tag):
        step(f"transfer({kind})", lambda: agent.transfer(h) in ("PROC", "DONE"))
        bench_common.send(conn, {"notif": tag, "blocks": [bench_common.scatter(i, BLOCKS) for i in idx]})
        got = bench_common.recv(conn)
        while agent.check_xfer_state(h) == "PROC":
            pass
        return got["found"] and got["digest"] == digest(view, idx)

    bench_common.fill(view[: BLOCKS * BLOCK], 9)
    xn = agent.make_prepped_xfer("WRITE", lh, idx, rh, idx, b"tag-1")
    ok = notified("WRITE, notif", xn, "tag")
    print(f"step notification after the bytes: ok bool {ok!r}", flush=True)
    # The message as str ("will work with str too", NIXL's docs say).
    xs = step("make_prepped_xfer(str notif)", agent.make_prepped_xfer, "WRITE", lh, idx, rh, idx, "tag-2", show=False)
    ok = notified("str notif", xs, "tag-2")
    print(f"step str notification after the bytes: ok bool {ok!r}", flush=True)

    # A READ back into the second half, prepared in one call (initialize_xfer).
    back = [(addr + (BLOCKS + i) * BLOCK, BLOCK, 0) for i in range(BLOCKS)]
    ld = step("get_xfer_descs", agent.get_xfer_descs, back, "DRAM", show=False)
    rd = agent.get_xfer_descs(remote, "DRAM")
    step("get_xfer_descs descCount", ld.descCount)
    nx3 = np.array(back, dtype=np.uint64)
    step("get_xfer_descs(Nx3 array) descCount", lambda: agent.get_xfer_descs(nx3, "DRAM").descCount())
    strided = np.array([[addr + BLOCKS * BLOCK, BLOCK, 0, BLOCK, BLOCKS]], dtype=np.uint64)
    step("prep_xfer_dlist(strided Nx5)", agent.prep_xfer_dlist, "NIXL_INIT_AGENT", strided, "DRAM", show=False)
    step("prep_mem_view", agent.prep_mem_view, ld, show=False)
    xr = step("initialize_xfer(READ)", agent.initialize_xfer, "READ", ld, rd, name, b"", show=False)
    state = step("transfer(READ)", lambda: agent.transfer(xr) in ("PROC", "DONE"))
    while agent.check_xfer_state(xr) == "PROC":
        pass
    same = bytes(view[BLOCKS * BLOCK :]) == bytes(view[: BLOCKS * BLOCK])
    print(f"step READ bytes: ok bool {same!r}", flush=True)

    step("send_notif", agent.send_notif, name, b"hello")
    bench_common.send(conn, {"plain": True})
    bench_common.recv(conn)
    step("send_notif(nobody)", agent.send_notif, "nobody", b"x")
    step("get_serialized_descs round trip", lambda: agent.deserialize_descs(agent.get_serialized_descs(ld)).descCount())
    step("release_xfer_handle", agent.release_xfer_handle, xh)
    step("release_xfer_handle again", agent.release_xfer_handle, xh)
    step("release_xfer_handle(READ)", agent.release_xfer_handle, xr)
    step("release_xfer_handle(notif)", agent.release_xfer_handle, xn)
    step("release_dlist_handle", agent.release_dlist_handle, lh)
    step("release_dlist_handle(remote)", agent.release_dlist_handle, rh)
    step("remove_remote_agent", agent.remove_remote_agent, name)
    step("check_remote_metadata after remove", agent.check_remote_metadata, name)
    step("prep_xfer_dlist after remove", agent.prep_xfer_dlist, name, remote, "DRAM", show=False)
    goodbye(bench_common.send, conn)


if __name__ == "__main__":
    main("NIXL", ["nixl", "gdr"], load, target, initiator)
