"""What the Python drivers of `cargo xtask compare-peers` share: the workload of
`gdr xfer-bench` (threads x DEPTH batches in flight, BATCH blocks of SIZE bytes per batch,
each thread's batches on disjoint block ranges, remote blocks at scattered positions), a
control connection between target and initiator on loopback, the pattern fill and the data
check, and the result lines the xtask parses:

    result gbit_s=G bytes=N seconds=S batches=B
    digest side=initiator|target value=HEX blocks=N block_size=S

An engine module gives `Target(buf, addr, args)` with `.info()` (what the initiator needs,
JSON-able) and `Initiator(buf, addr, info, args)` with `.prepare(ranges)` (one handle per
block range: lists of (local block, remote block)), `.submit(handle)` and `.wait(token)`.
"""

import argparse
import ctypes
import hashlib
import json
import mmap
import os
import socket
import sys
import threading
import time

import numpy as np


def parse_args(engine):
    p = argparse.ArgumentParser(description=f"{engine}: one side of compare-peers' workload")
    p.add_argument("--mode", choices=["target", "initiator"], required=True)
    p.add_argument("--port", type=int, required=True, help="control port on 127.0.0.1")
    p.add_argument("--device", default="rxe0")
    p.add_argument("--gid-index", type=int, default=1)
    p.add_argument("--op", choices=["write", "read"], default="write")
    p.add_argument("--block-size", type=int, default=65536)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--qps", type=int, default=2)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--buffer-size", type=int, default=0, help="target: bytes (0: what the initiator needs)")
    return p.parse_args()


def blocks_needed(a):
    return a.threads * a.depth * a.batch


def alloc(size):
    """A page-aligned anonymous buffer, its numpy view and address."""
    mm = mmap.mmap(-1, max(size, 4096), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    return mm, np.frombuffer(mm, dtype=np.uint8), addr


def fill(view, seed):
    """Every 8-byte word differs, and differs between seeds."""
    words = view[: len(view) // 8 * 8].view(np.uint64)
    words[:] = np.random.default_rng(seed).integers(0, 2**63, size=len(words), dtype=np.uint64)


def scatter(i, n):
    """gdr xfer-bench's permutation of 0..n (a stride coprime with n)."""
    stride = next((s for s in (7919, 7907, 7901) if n % s != 0), 1)
    return (i * stride + n // 3) % n


def ranges(a):
    """Per thread, DEPTH lists of (local block, remote block), as gdr xfer-bench lays them."""
    out = []
    for t in range(a.threads):
        mine = []
        for d in range(a.depth):
            first = (t * a.depth + d) * a.batch
            mine.append([(first + i, first + scatter(i, a.batch)) for i in range(a.batch)])
        out.append(mine)
    return out


def digest(view, blocks, bs):
    h = hashlib.blake2b(digest_size=8)
    for b in blocks:
        h.update(view[b * bs : (b + 1) * bs])
    return h.hexdigest()


def block_digests(view, blocks, bs):
    return [hashlib.blake2b(view[b * bs : (b + 1) * bs], digest_size=8).hexdigest() for b in blocks]


def explain(view, lb, bs, mine, theirs):
    """Which blocks differ, and what each holds instead: the initiator's own pattern (the
    transfer never reached it, after a READ), zeros, another block's bytes (misplaced)."""
    own = np.empty(len(view), dtype=np.uint8)
    fill(own, 1)
    where = {h: i for i, h in enumerate(theirs)}
    bad = [i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b]
    out = []
    for i in bad[:8]:
        blk = view[lb[i] * bs : (lb[i] + 1) * bs]
        if np.array_equal(blk, own[lb[i] * bs : (lb[i] + 1) * bs]):
            what = "still the initiator's own bytes"
        elif not blk.any():
            what = "zeros"
        elif mine[i] in where:
            what = f"the bytes of hashed block {where[mine[i]]}"
        else:
            what = "other bytes"
        out.append(f"#{i} (local block {lb[i]}): {what}")
    return f"{len(bad)} of {len(mine)} blocks differ; " + "; ".join(out)


def digest_line(side, value, n, bs):
    print(f"digest side={side} value={value} blocks={n} block_size={bs}", flush=True)


def send(sock, obj):
    data = json.dumps(obj).encode()
    sock.sendall(len(data).to_bytes(4, "little") + data)


def recv(sock):
    def exact(n):
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("the other side closed the control connection")
            buf += chunk
        return buf

    return json.loads(exact(int.from_bytes(exact(4), "little")))


def serve(a, make_target):
    """The target: fill, set the engine up, hand its info to the initiator, then answer the
    initiator's data check with the digest of the remote blocks it names."""
    size = a.buffer_size or blocks_needed(a) * a.block_size
    mm, view, addr = alloc(size)
    fill(view, 2)
    target = make_target(view, addr, a)
    ls = socket.create_server(("127.0.0.1", a.port))
    print(f"target: listening on 127.0.0.1:{a.port}, buffer {size} bytes", flush=True)
    conn, _ = ls.accept()
    send(conn, {"addr": addr, "len": size, "info": target.info()})
    check = recv(conn)
    rb = [r for rs in ranges(a) for rg in rs for (_, r) in rg]
    value = digest(view, rb, a.block_size)
    digest_line("target", value, len(rb), a.block_size)
    send(conn, {"digest": value, "blocks": block_digests(view, rb, a.block_size)})
    conn.close()
    del check, target, mm
    sys.stdout.flush()
    os._exit(0)


def initiate(a, make_initiator):
    """The initiator: connect, prepare one handle per block range, warm up, then each thread
    keeps DEPTH batches in flight for SECONDS; then the data check."""
    mm, view, addr = alloc(blocks_needed(a) * a.block_size)
    fill(view, 1)
    deadline = time.time() + 120
    while True:
        try:
            conn = socket.create_connection(("127.0.0.1", a.port))
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    peer = recv(conn)
    eng = make_initiator(view, addr, peer, a)
    per_thread = [[eng.prepare(rg) for rg in rs] for rs in ranges(a)]
    stop = threading.Event()
    start_line = threading.Barrier(a.threads + 1)
    counts = [0] * a.threads
    done_at = [0.0] * a.threads
    errors = []

    def worker(t):
        hs = per_thread[t]
        try:
            eng.wait(eng.submit(hs[0]))  # warm-up, outside the measurement
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        start_line.wait()
        if errors:
            return
        try:
            flight = []
            nxt = 0
            while True:
                while len(flight) < a.depth and not stop.is_set():
                    flight.append(eng.submit(hs[nxt % a.depth]))
                    nxt += 1
                if not flight:
                    break
                eng.wait(flight.pop(0))
                counts[t] += 1
                done_at[t] = time.perf_counter()
        except Exception as e:  # noqa: BLE001
            errors.append(e)
            stop.set()

    ths = [threading.Thread(target=worker, args=(t,)) for t in range(a.threads)]
    for th in ths:
        th.start()
    start_line.wait()
    began = time.perf_counter()
    time.sleep(a.seconds)
    stop.set()
    for th in ths:
        th.join()
    if errors:
        print(f"initiator: {errors[0]!r}", file=sys.stderr, flush=True)
        os._exit(1)
    elapsed = max(max(done_at) - began, 1e-9)
    batches = sum(counts)
    nbytes = batches * a.batch * a.block_size
    print(
        f"result gbit_s={nbytes * 8 / elapsed / 1e9:.6f} bytes={nbytes} seconds={elapsed:.4f} batches={batches}",
        flush=True,
    )
    lb = [lo for rs in ranges(a) for rg in rs for (lo, _) in rg]
    value = digest(view, lb, a.block_size)
    digest_line("initiator", value, len(lb), a.block_size)
    send(conn, {"check": True})
    answer = recv(conn)
    if answer["digest"] != value:
        why = explain(view, lb, a.block_size, block_digests(view, lb, a.block_size), answer["blocks"])
        print(f"initiator: data check failed: {why}", file=sys.stderr, flush=True)
        os._exit(3)
    del eng, mm
    # NIXL's bundled libnl crashes at interpreter exit; nothing is left to flush.
    os._exit(0)


def main(engine, make_target, make_initiator):
    a = parse_args(engine)
    if a.mode == "target":
        serve(a, make_target)
    else:
        initiate(a, make_initiator)
