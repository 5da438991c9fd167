"""What the Python drivers of `cargo xtask compare-peers` share: the workload of
`gdr xfer-bench` (threads x DEPTH batches in flight, BATCH blocks of SIZE bytes per batch,
each thread's batches on disjoint block ranges, remote blocks at scattered positions), a
control connection between target and initiator on loopback, the pattern fill and the data
check, and the lines the xtask parses.

One target and one initiator process run every case of a round in order (`--cases`), with
one engine each: an interpreter's and an engine's start cost seconds under TCG, and paying
them once per case made a round of the default cases take half an hour under icount. Each
case starts from fresh bytes on both sides. The initiator prints each case's section:

    ### case op=OP size=S batch=B qps=Q threads=T
    ### ENGINE round=R
    result gbit_s=G bytes=N seconds=S batches=B
    digest side=initiator value=HEX blocks=N block_size=S
    target: digest side=target value=HEX blocks=N block_size=S   (the target's, sent back)
    ### pkts sent=N
    ### cpu busy=B0,B1 softirq=S0,S1   (each vCPU's share of the timed part, in percent)
    ### end rc=0 server_rc=0

A case that fails leaves its section open and ends the process; compare-peers.sh closes it
with the exit codes.

An engine module gives `Target(buf, addr, args)` with `.info()` (what the initiator needs,
JSON-able) and `Initiator(buf, addr, info, args)` with `.prepare(blocks, case)` (one handle
per block range: a list of (local block, remote block)), `.submit(handle)`, `.wait(token)`
and `.release(handle)`.
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
    p.add_argument(
        "--cases",
        required=True,
        help="comma-separated OP:SIZE:BATCH:QPS:THREADS, run in this order (one QPS for all)",
    )
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--round", type=int, default=1, help="the round the initiator reports")
    a = p.parse_args()
    a.cases = [Case(c) for c in a.cases.split(",") if c]
    if not a.cases or len({c.qps for c in a.cases}) != 1:
        p.error("--cases: at least one case, all with the same QPS (an engine's QPs are fixed)")
    a.qps = a.cases[0].qps
    return a


class Case:
    """One case of the workload: OP:SIZE:BATCH:QPS:THREADS, with the run's depth."""

    def __init__(self, spec):
        op, size, batch, qps, threads = spec.split(":")
        if op not in ("write", "read"):
            raise ValueError(f"case {spec}: the operation is write or read")
        self.op, self.block_size, self.batch = op, int(size), int(batch)
        self.qps, self.threads = int(qps), int(threads)

    def marker(self):
        """The line that opens this case's section of the output, as the xtask writes it."""
        return (
            f"### case op={self.op} size={self.block_size} batch={self.batch} "
            f"qps={self.qps} threads={self.threads}"
        )

    def spec(self):
        return f"{self.op}:{self.block_size}:{self.batch}:{self.qps}:{self.threads}"


def blocks_needed(c, depth):
    return c.threads * depth * c.batch


def bytes_needed(a):
    """The buffer each side registers once: the largest case's blocks."""
    return max(blocks_needed(c, a.depth) * c.block_size for c in a.cases)


def alloc(size):
    """A page-aligned anonymous buffer, its numpy view and address."""
    mm = mmap.mmap(-1, max(size, 4096), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    return mm, np.frombuffer(mm, dtype=np.uint8), addr


def fill(view, seed):
    """Every 8-byte word differs, and differs between seeds."""
    words = view[: len(view) // 8 * 8].view(np.uint64)
    words[:] = np.random.default_rng(seed).integers(0, 2**63, size=len(words), dtype=np.uint64)


def seeds(k):
    """The initiator's and the target's fill seeds for the k-th case: fresh bytes on both
    sides, so that a case's check cannot pass on what an earlier case left behind."""
    return (1 + 2 * k, 2 + 2 * k)


def scatter(i, n):
    """gdr xfer-bench's permutation of 0..n (a stride coprime with n)."""
    stride = next((s for s in (7919, 7907, 7901) if n % s != 0), 1)
    return (i * stride + n // 3) % n


def ranges(c, depth):
    """Per thread, DEPTH lists of (local block, remote block), as gdr xfer-bench lays them."""
    out = []
    for t in range(c.threads):
        mine = []
        for d in range(depth):
            first = (t * depth + d) * c.batch
            mine.append([(first + i, first + scatter(i, c.batch)) for i in range(c.batch)])
        out.append(mine)
    return out


def digest(view, blocks, bs):
    h = hashlib.blake2b(digest_size=8)
    for b in blocks:
        h.update(view[b * bs : (b + 1) * bs])
    return h.hexdigest()


def block_digests(view, blocks, bs):
    return [hashlib.blake2b(view[b * bs : (b + 1) * bs], digest_size=8).hexdigest() for b in blocks]


def explain(view, lb, bs, mine, theirs, own_seed, used):
    """Which blocks differ, and what each holds instead: the initiator's own pattern (the
    transfer never reached it, after a READ), zeros, another block's bytes (misplaced)."""
    own = np.empty(used, dtype=np.uint8)
    fill(own, own_seed)
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


def digest_line(side, value, n, bs, prefix=""):
    print(f"{prefix}digest side={side} value={value} blocks={n} block_size={bs}", flush=True)


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
    """The target: one buffer and one engine for every case. It hands its info to the
    initiator, then answers its messages (`answer`)."""
    size = bytes_needed(a)
    mm, view, addr = alloc(size)
    target = make_target(view, addr, a)
    ls = socket.create_server(("127.0.0.1", a.port))
    print(f"target: listening on 127.0.0.1:{a.port}, buffer {size} bytes", flush=True)
    conn, _ = ls.accept()
    send(conn, {"addr": addr, "len": size, "info": target.info()})
    answer(a, view, conn)
    conn.close()
    del target, mm
    sys.stdout.flush()
    os._exit(0)


def answer(a, view, conn):
    """The target's side of the control connection, until `bye`: `case` fills the case's
    blocks with fresh bytes, `check` answers the digests of its remote blocks."""
    while True:
        msg = recv(conn)
        if "bye" in msg:
            return
        c = Case(msg["case"])
        used = blocks_needed(c, a.depth) * c.block_size
        if msg.get("check"):
            rb = [r for rs in ranges(c, a.depth) for rg in rs for (_, r) in rg]
            value = digest(view, rb, c.block_size)
            send(conn, {"digest": value, "blocks": block_digests(view, rb, c.block_size)})
        else:
            fill(view[:used], seeds(msg["k"])[1])
            send(conn, {"filled": used})


def run_case(a, k, c, eng, view, conn):
    """One case: fresh bytes on both sides, one handle per block range, a warm-up, then each
    thread keeps DEPTH batches in flight for SECONDS; then the data check against the
    target's digests. Prints the case's section; returns False when the case failed."""
    print(c.marker(), flush=True)
    print(f"### {a.engine} round={a.round}", flush=True)
    before = counters(a.device)
    used = blocks_needed(c, a.depth) * c.block_size
    own_seed = seeds(k)[0]
    fill(view[:used], own_seed)
    send(conn, {"case": c.spec(), "k": k})
    recv(conn)
    per_thread = [[eng.prepare(rg, c) for rg in rs] for rs in ranges(c, a.depth)]
    stop = threading.Event()
    start_line = threading.Barrier(c.threads + 1)
    counts = [0] * c.threads
    done_at = [0.0] * c.threads
    errors = []

    def worker(t):
        hs = per_thread[t]
        try:
            # Warm-up, outside the measurement: every block range once, all in flight together,
            # so that the data check covers only ranges that moved (a short run can stop before
            # the loop below posts them all: NIXL's `transfer` of 32 MiB takes over a second).
            for token in [eng.submit(h) for h in hs]:
                eng.wait(token)
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

    ths = [threading.Thread(target=worker, args=(t,)) for t in range(c.threads)]
    for th in ths:
        th.start()
    start_line.wait()
    began = time.perf_counter()
    cpu_before = cpu_stat()
    time.sleep(a.seconds)
    cpu_after = cpu_stat()
    stop.set()
    for th in ths:
        th.join()
    if errors:
        print(f"initiator: {errors[0]!r}", file=sys.stderr, flush=True)
        return False
    elapsed = max(max(done_at) - began, 1e-9)
    batches = sum(counts)
    nbytes = batches * c.batch * c.block_size
    print(
        f"result gbit_s={nbytes * 8 / elapsed / 1e9:.6f} bytes={nbytes} seconds={elapsed:.4f} batches={batches}",
        flush=True,
    )
    lb = [lo for rs in ranges(c, a.depth) for rg in rs for (lo, _) in rg]
    value = digest(view, lb, c.block_size)
    digest_line("initiator", value, len(lb), c.block_size)
    send(conn, {"case": c.spec(), "check": True})
    answer = recv(conn)
    # The target's digest, computed in the target process and sent back over the control
    # connection, on the line the xtask reads as the target's.
    digest_line("target", answer["digest"], len(lb), c.block_size, prefix="target: ")
    for h in (h for hs in per_thread for h in hs):
        eng.release(h)
    print(pkts_line(before, counters(a.device)), flush=True)
    print(cpu_line(cpu_before, cpu_after), flush=True)
    if answer["digest"] != value:
        why = explain(view, lb, c.block_size, block_digests(view, lb, c.block_size), answer["blocks"], own_seed, used)
        print(f"initiator: data check failed: {why}", file=sys.stderr, flush=True)
        return False
    print("### end rc=0 server_rc=0", flush=True)
    return True


def counters(device):
    """The device's counters (rxe's hw_counters: sent_pkts, retries, sequence errors, ...) by
    name; none where it has none."""
    folder = f"/sys/class/infiniband/{device}/ports/1/hw_counters"
    out = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(folder, name)) as f:
                out[name] = int(f.read())
        except (OSError, ValueError):
            pass
    return out


def pkts_line(before, after):
    """The line that closes a run's counters: the packets it sent, then every other counter
    that moved (`### pkts sent=N name=delta ...`)."""
    moved = {k: v - before.get(k, 0) for k, v in after.items()}
    others = " ".join(f"{k}={d}" for k, d in sorted(moved.items()) if d and k != "sent_pkts")
    return f"### pkts sent={moved.get('sent_pkts', 0)}" + (f" {others}" if others else "")


def cpu_stat():
    """The per-CPU lines of /proc/stat: for each vCPU in order, its first eight counters
    (user nice system idle iowait irq softirq steal)."""
    with open("/proc/stat") as f:
        rows = [line.split() for line in f if line.startswith("cpu") and line[3].isdigit()]
    return [[int(v) for v in row[1:9]] for row in rows]


def cpu_line(before, after):
    """The line of the timed part's CPU use, as compare-peers.sh prints it: each vCPU's busy
    share (all but idle and iowait) and softirq share, in percent
    (`### cpu busy=B0,B1 softirq=S0,S1`)."""
    busy, sirq = [], []
    for b, e in zip(before, after):
        d = [y - x for x, y in zip(b, e)]
        total = max(sum(d), 1)
        busy.append(round(100 * (total - d[3] - d[4]) / total))
        sirq.append(round(100 * d[6] / total))
    return f"### cpu busy={','.join(map(str, busy))} softirq={','.join(map(str, sirq))}"


def initiate(a, make_initiator):
    """The initiator: connect, make the engine once, then run every case in order. A failed
    case ends the process (nonzero) with its section open: the script closes it."""
    mm, view, addr = alloc(bytes_needed(a))
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
    for k, c in enumerate(a.cases):
        if not run_case(a, k, c, eng, view, conn):
            os._exit(3)
    send(conn, {"bye": True})
    del eng, mm
    # NIXL's bundled libnl crashes at interpreter exit; nothing is left to flush.
    os._exit(0)


def main(engine, make_target, make_initiator):
    a = parse_args(engine)
    # The tool's name in the sections: the driver's engine, or another where the same driver
    # runs on another engine (compare-peers' nixl-on-gdr: NIXL's driver on gdr's drop-in).
    a.engine = os.environ.get("COMPARE_PEERS_TOOL", engine)
    if a.mode == "target":
        serve(a, make_target)
    else:
        initiate(a, make_initiator)
