"""``python -m gdr.bench``: gdr's transfer bandwidth and latencies from Python, with the columns of
the Rust ``gdr xfer-bench`` (one row per block size), through the binding only.

The target registers a numpy buffer and waits::

    python -m gdr.bench --target --listen 0.0.0.0:18700 --buffer-size 268435456 -d mlx5_0

The initiator registers a numpy array of its own, connects, and submits batches of ``--batch``
blocks of ``--block-size`` bytes (one ``Peer.transfer_blocks`` block table each, scattered on the
target unless ``--layout contiguous``), keeping ``--depth`` batches in flight, for ``--duration``
seconds per block size::

    python -m gdr.bench 10.0.0.1:18700 -d mlx5_0 --block-size 65536,1048576 --batch 128 \\
        --duration 5 --op write --depth 2 --csv

One Python thread submits (the Rust bench's ``--threads 1``). The prepare, post and transfer
times are the engine's own (``Transfer.wait()``'s ``plan_time_s``, ``time_to_post_s``,
``time_to_complete_s``); bandwidth and latency include the binding's cost per call.
"""

import argparse
import collections
import json
import sys
import time
from typing import Any, Deque, Dict, List, Literal, Optional, Sequence, Tuple

import numpy as np

from ._gdr import Agent, Peer, RemoteSegment, Segment, Transfer

#: Name of the target's buffer segment (the Rust bench's too).
TARGET_SEGMENT = "xfer-bench"

#: The CSV header: ``gdr xfer-bench --csv``'s columns.
CSV_COLUMNS = (
    "block_size,batch_size,batches,gb_s,gbit_s,avg_lat_us,avg_prep_us,p99_prep_us,"
    "avg_post_us,p99_post_us,avg_tx_us,p99_tx_us,slices_per_batch,rail_bytes"
)

LAYOUTS = ("scattered", "contiguous", "repeat")


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """The ``p`` quantile of sorted samples (nearest rank, as the Rust bench)."""
    if not sorted_values:
        return 0.0
    i = int(round((len(sorted_values) - 1) * p))
    return float(sorted_values[min(i, len(sorted_values) - 1)])


def _avg(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def scatter(n: int) -> "np.ndarray[Any, Any]":
    """The remote positions of blocks ``0..n`` of a batch: a permutation (nothing merges)."""
    stride = next((s for s in (7919, 7907, 7901) if n % s != 0), 1)
    return (np.arange(n, dtype=np.int64) * stride + n // 3) % n


def block_range(
    first: int, batch: int, layout: str
) -> Tuple["np.ndarray[Any, Any]", "np.ndarray[Any, Any]"]:
    """The local and remote block indices (uint32 arrays) of a batch starting at ``first``."""
    if layout == "repeat":
        same = np.full(batch, first, dtype=np.uint32)
        return same, same.copy()
    local = np.arange(first, first + batch, dtype=np.uint32)
    if layout == "contiguous":
        return local, local.copy()
    return local, (scatter(batch) + first).astype(np.uint32)


def run_target(
    agent: Agent, listen: str, buffer_size: int, forever: bool = False, out: Any = None
) -> int:
    """Registers a numpy buffer of ``buffer_size`` bytes, listens, and serves until an initiator
    sends the notification ``done`` or goes away (or forever). Returns the exit status."""
    out = out or sys.stdout
    buf = np.zeros(max(buffer_size, 1), dtype=np.uint8)
    agent.register(buf, TARGET_SEGMENT)
    addr = agent.listen(listen)
    print(
        f"xfer-bench target: listening on {addr} ({agent.device}), buffer {buf.nbytes} bytes",
        file=out,
        flush=True,
    )
    served = False
    while True:
        note = agent.wait_notification(timeout_s=0.2)
        if note is not None and note.data == b"done" and not forever:
            return 0
        connected = bool(agent.peers())
        if served and not connected and not forever:
            print("xfer-bench target: the initiator left without saying done", file=out,
                  flush=True)
            return 0
        served |= connected


def run_size(
    peer: Peer,
    local: Segment,
    remote: RemoteSegment,
    op: str,
    bs: int,
    batch: int,
    depth: int,
    duration_s: float,
    layout: str,
) -> Dict[str, Any]:
    """One row: batches of ``batch`` blocks of ``bs`` bytes for ``duration_s`` seconds."""
    direction: Literal["write", "read"] = "read" if op == "read" else "write"
    rails_before = peer.rail_stats()
    sides = [block_range(d * batch, batch, layout) for d in range(depth)]
    # Warm-up batch, outside the measurement.
    peer.transfer_blocks(direction, local, sides[0][0], remote, sides[0][1], bs, timeout_s=60).wait(60)
    samples: List[Tuple[float, float, float, float, int]] = []
    in_flight: Deque[Transfer] = collections.deque()
    nxt = 0
    began = time.monotonic()
    stop_at = began + max(duration_s, 0.01)
    while True:
        while len(in_flight) < depth and time.monotonic() < stop_at:
            lb, rb = sides[nxt % depth]
            in_flight.append(peer.transfer_blocks(direction, local, lb, remote, rb, bs, timeout_s=60))
            nxt += 1
        # Batches still in flight at the stop are waited for and counted.
        if not in_flight:
            break
        s = in_flight.popleft().wait(60)
        samples.append((
            time.monotonic(),
            float(s["plan_time_s"]) * 1e6,
            float(s["time_to_post_s"]) * 1e6,
            float(s["time_to_complete_s"]) * 1e6,
            int(s["slices"]),
        ))
    elapsed = max((max(x[0] for x in samples) - began) if samples else 0.0, 1e-9)
    prep = sorted(x[1] for x in samples)
    post = sorted(x[2] for x in samples)
    tx = sorted(x[3] for x in samples)
    gb_s = len(samples) * batch * bs / elapsed / 1e9
    rails_after = peer.rail_stats()
    rail_bytes = [int(a["bytes"]) - int(b["bytes"]) for a, b in zip(rails_after, rails_before)]
    total = max(sum(rail_bytes), 1)
    rails = [
        {
            "rail": a["rail"],
            "device": f"{a['device']}:{a['port']}",
            "bytes": n,
            "share": n / total,
            "gb_s": n / elapsed / 1e9,
            "errors": int(a["errors"]) - int(b["errors"]),
            "retries": int(a["retries"]) - int(b["retries"]),
            "state": a["state"],
        }
        for a, b, n in zip(rails_after, rails_before, rail_bytes)
    ]
    return {
        "block_size": bs,
        "batch_size": batch,
        "batches": len(samples),
        "gb_s": gb_s,
        "gbit_s": gb_s * 8.0,
        "avg_lat_us": _avg(tx),
        "avg_prep_us": _avg(prep),
        "p99_prep_us": percentile(prep, 0.99),
        "avg_post_us": _avg(post),
        "p99_post_us": percentile(post, 0.99),
        "avg_tx_us": _avg(tx),
        "p99_tx_us": percentile(tx, 0.99),
        "slices_per_batch": _avg([float(x[4]) for x in samples]),
        "rails": rails,
    }


def run_initiator(
    agent: Agent,
    addr: str,
    block_sizes: Sequence[int],
    batch: int = 128,
    duration_s: float = 5.0,
    op: str = "write",
    depth: int = 1,
    layout: str = "scattered",
) -> Dict[str, Any]:
    """Runs every block size against the target at ``addr``; returns the report (``params``,
    ``device``, ``rows``) and tells the target it is done."""
    if op not in ("write", "read"):
        raise ValueError(f"op = {op!r}: use 'write' or 'read'")
    if layout not in LAYOUTS:
        raise ValueError(f"layout = {layout!r}: use one of {LAYOUTS}")
    batch, depth = max(batch, 1), max(depth, 1)
    need = max(max(block_sizes, default=0) * batch * depth, 1)
    local_buf = np.zeros(need, dtype=np.uint8)
    local = agent.register(local_buf, "xfer-bench-local")
    peer = agent.connect(addr)
    remote = peer.wait_segment(TARGET_SEGMENT, timeout_s=10)
    if remote.length < need:
        raise ValueError(
            f"the target's buffer has {remote.length} bytes; {depth} batches in flight x "
            f"{batch} blocks x {max(block_sizes)} bytes need {need}: start the target with a "
            "larger --buffer-size"
        )
    rows = [
        run_size(peer, local, remote, op, bs, batch, depth, duration_s, layout)
        for bs in block_sizes
    ]
    # Tell the target we are done (it exits unless it serves forever).
    peer.write(local, 0, remote, 0, 1, notify=b"done").wait(10)
    return {
        "params": {
            "threads": 1,
            "depth": depth,
            "batch": batch,
            "block_sizes": list(block_sizes),
            "op": op,
            "duration_s": duration_s,
            "layout": layout,
        },
        "device": ",".join(f"{d}:{p}" for d, p in agent.rails),
        "rows": rows,
    }


def csv(report: Dict[str, Any]) -> str:
    """The rows as CSV with a header line (``gdr xfer-bench --csv``'s columns and format)."""
    lines = [CSV_COLUMNS]
    for x in report["rows"]:
        rails = ";".join(str(r["bytes"]) for r in x["rails"])
        lines.append(
            f"{x['block_size']},{x['batch_size']},{x['batches']},{x['gb_s']:.6f},"
            f"{x['gbit_s']:.6f},{x['avg_lat_us']:.3f},{x['avg_prep_us']:.3f},"
            f"{x['p99_prep_us']:.3f},{x['avg_post_us']:.3f},{x['p99_post_us']:.3f},"
            f"{x['avg_tx_us']:.3f},{x['p99_tx_us']:.3f},{x['slices_per_batch']:.1f},{rails}"
        )
    return "\n".join(lines) + "\n"


def table(report: Dict[str, Any]) -> str:
    """The rows as ``gdr xfer-bench``'s table."""
    p = report["params"]
    s = (
        f"gdr.bench (Python): 1 thread, depth {p['depth']}, {p['op']!r} {p['layout']} layout, "
        f"rails {report['device']}\n"
    )
    heads = ("Block Size (B)", "Batch Size", "B/W (GB/s)", "Avg Lat (us)", "Avg Prep",
             "P99 Prep", "Avg Post", "P99 Post", "Avg Tx", "P99 Tx")
    s += f"{heads[0]:>14} {heads[1]:>10} {heads[2]:>10} " + " ".join(
        f"{h:>12}" for h in heads[3:]) + "\n"
    for r in report["rows"]:
        s += f"{r['block_size']:>14} {r['batch_size']:>10} {r['gb_s']:>10.4f} " + " ".join(
            f"{r[k]:>12.1f}" for k in ("avg_lat_us", "avg_prep_us", "p99_prep_us",
                                       "avg_post_us", "p99_post_us", "avg_tx_us", "p99_tx_us")
        ) + "\n"
    return s


def _sizes(text: str) -> List[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ints")
    if not sizes or any(n <= 0 for n in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: block sizes are positive ints")
    return sizes


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m gdr.bench``."""
    ap = argparse.ArgumentParser(
        prog="python -m gdr.bench",
        description="gdr's transfer bandwidth and latencies from Python, with the columns of "
        "`gdr xfer-bench`. Start the target, then the initiator with its address.",
    )
    ap.add_argument("target_addr", nargs="?", metavar="HOST:PORT",
                    help="the target's address (initiator)")
    ap.add_argument("--target", action="store_true", help="run as the target")
    ap.add_argument("--listen", default="0.0.0.0:18700", help="target: address to listen on")
    ap.add_argument("--buffer-size", type=int, default=256 << 20,
                    help="target: bytes of its buffer (>= depth x batch x largest block)")
    ap.add_argument("--forever", action="store_true",
                    help="target: keep serving after an initiator finished")
    ap.add_argument("-d", "--device", default=None, help="RDMA device (name[:port] or a list)")
    ap.add_argument("-x", "--gid-index", type=int, default=None, help="GID index")
    ap.add_argument("-q", "--qps", type=int, default=None, help="queue pairs per peer")
    ap.add_argument("--block-size", type=_sizes, default=[65536],
                    help="block sizes in bytes, comma-separated (one row each)")
    ap.add_argument("--batch", type=int, default=128, help="blocks per batch")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per block size")
    ap.add_argument("--op", choices=("write", "read"), default="write")
    ap.add_argument("--depth", type=int, default=1, help="batches in flight")
    ap.add_argument("--layout", choices=LAYOUTS, default="scattered",
                    help="where blocks land on the target")
    ap.add_argument("--name", default=None, help="the agent's name")
    fmt = ap.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="print CSV instead of the table")
    fmt.add_argument("--json", action="store_true", help="print one JSON document")
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m gdr.bench``; returns the exit status."""
    args = parser().parse_args(argv)
    if args.target == bool(args.target_addr):
        parser().error("give either --target or the target's HOST:PORT")
    if args.batch < 1 or args.depth < 1:
        parser().error("--batch and --depth are at least 1")
    name = args.name or ("xfer-bench-target" if args.target else "xfer-bench-initiator")
    agent = Agent(name, device=args.device, gid_index=args.gid_index, qps_per_peer=args.qps)
    try:
        if args.target:
            return run_target(agent, args.listen, args.buffer_size, args.forever)
        report = run_initiator(agent, args.target_addr, args.block_size, args.batch,
                               args.duration, args.op, args.depth, args.layout)
    finally:
        agent.shutdown(1.0)
    if args.json:
        print(json.dumps(report, indent=2))
    elif args.csv:
        sys.stdout.write(csv(report))
    else:
        sys.stdout.write(table(report))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
