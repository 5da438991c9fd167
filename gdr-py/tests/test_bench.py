"""The binding's cost per call against the engine's own times, and ``python -m gdr.bench`` as two
processes (device tests: the Soft-RoCE VM). The host tests at the end need no device."""

import csv
import io
import math
import os
import select
import statistics
import subprocess
import sys
import time

import numpy as np
import pytest

from gdr import bench

from conftest import device_under_test

BLOCK = 4096
MANY = 10_000


def _measure(pb, local, remote, local_blocks, remote_blocks, calls):
    """``calls`` WRITEs of the block table, each submitted and waited for from Python: per call
    the Python times (submit; submit+wait) and the engine's (plan, submit, complete), in us."""
    pb.transfer_blocks("write", local, local_blocks, remote, remote_blocks, BLOCK,
                       timeout_s=60).wait(60)  # warm-up
    rows = []
    for _ in range(calls):
        t0 = time.perf_counter()
        t = pb.transfer_blocks("write", local, local_blocks, remote, remote_blocks, BLOCK,
                               timeout_s=60)
        t1 = time.perf_counter()
        s = t.wait(60)
        t2 = time.perf_counter()
        rows.append(((t1 - t0) * 1e6, (t2 - t0) * 1e6, s["plan_time_s"] * 1e6,
                     s["submit_time_s"] * 1e6, s["time_to_complete_s"] * 1e6))
    cols = list(zip(*rows))
    med = [statistics.median(c) for c in cols]
    for v in med:
        assert math.isfinite(v) and v > 0, med
    return dict(zip(("py_submit", "py_total", "plan", "submit", "complete"), med))


@pytest.mark.device
def test_binding_overhead_per_transfer_and_per_block(pair):
    """Same agents, same table shape, WRITE of 4 KiB blocks: 1,000 transfers of 1 block and 10
    transfers of 10,000 blocks. The Python side's time per call (transfer_blocks, and
    transfer_blocks + wait) next to the engine's TransferStats for the same transfer: what is
    left is the binding (argument conversion, block lists, GIL hand-offs, the stats dict).
    Reported, not asserted (only finite and positive)."""
    a, b, pb, pa = pair
    src = np.random.default_rng(5).integers(0, 256, (MANY, BLOCK), dtype=np.uint8)
    dst = np.zeros((MANY, BLOCK), np.uint8)
    local = a.register(src, "ovh-src")
    b.register(dst, "ovh-dst")
    remote = pb.wait_segment("ovh-dst", timeout_s=10)

    one = _measure(pb, local, remote, np.array([7], np.uint32), np.array([9], np.uint32), 1000)
    perm = bench.scatter(MANY).astype(np.uint32)  # scattered: nothing merges
    ids = np.arange(MANY, dtype=np.uint32)
    many_np = _measure(pb, local, remote, ids, perm, 10)
    many_list = _measure(pb, local, remote, ids.tolist(), perm.tolist(), 10)
    assert np.array_equal(dst[perm], src), "the 10,000 blocks landed where they belong"

    def line(label, m, blocks):
        sub = m["py_submit"] - m["submit"]
        tot = m["py_total"] - m["complete"]
        print(f"binding overhead: {label}: {blocks} block(s)/call, median per call: Python "
              f"submit {m['py_submit']:.1f} us vs engine submit_time {m['submit']:.1f} us "
              f"(plan_time {m['plan']:.1f} us) -> +{sub:.1f} us; Python submit+wait "
              f"{m['py_total']:.1f} us vs engine time_to_complete {m['complete']:.1f} us "
              f"-> +{tot:.1f} us")
        return sub, tot

    sub1, tot1 = line("1,000 x 1 block (numpy indices)", one, 1)
    subn, totn = line("10 x 10,000 blocks (numpy uint32 indices)", many_np, MANY)
    subl, totl = line("10 x 10,000 blocks (list indices)", many_list, MANY)
    per_block_np = (subn - sub1) / (MANY - 1) * 1e3
    per_block_list = (subl - sub1) / (MANY - 1) * 1e3
    print(f"binding overhead: per transfer {sub1:.1f} us at submission "
          f"(+{tot1 - sub1:.1f} us more on the wait side: wake-up, stats dict)")
    print(f"binding overhead: per block {per_block_np:.1f} ns (numpy uint32 array), "
          f"{per_block_list:.1f} ns (list of int), engine plan_time per block "
          f"{many_np['plan'] / MANY * 1e3:.1f} ns")
    for v in (sub1, tot1, subn, subl, per_block_np, per_block_list):
        assert math.isfinite(v)


def _readline(proc, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            line = proc.stdout.readline()
            if line:
                return line.strip()
            break
    proc.kill()
    out, err = proc.communicate(timeout=10)
    pytest.fail(f"the bench target said nothing in {timeout} s; stdout {out!r} stderr {err!r}")


@pytest.mark.device
def test_python_bench_target_and_initiator_as_two_processes(tmp_path):
    dev = device_under_test()
    host = os.environ.get("GDR_TEST_ADDR", "127.0.0.1")
    gid = os.environ.get("GDR_TEST_GID_INDEX")
    common = ["-d", dev] + (["--gid-index", gid] if gid else [])
    target = subprocess.Popen(
        [sys.executable, "-m", "gdr.bench", "--target", "--listen", f"{host}:0",
         "--buffer-size", str(16 << 20)] + common,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )
    try:
        line = _readline(target, 120)
        assert line.startswith("xfer-bench target: listening on "), line
        addr = line.split()[4]
        init = subprocess.run(
            [sys.executable, "-m", "gdr.bench", addr, "--block-size", "65536", "--batch", "16",
             "--duration", "1", "--op", "write", "--depth", "2", "--csv"] + common,
            capture_output=True, text=True, cwd=tmp_path, timeout=120,
        )
        assert init.returncode == 0, init.stdout + init.stderr
        rows = list(csv.DictReader(io.StringIO(init.stdout)))
        assert len(rows) == 1, init.stdout
        row = rows[0]
        assert ",".join(row) == bench.CSV_COLUMNS
        assert int(row["block_size"]) == 65536 and int(row["batch_size"]) == 16
        assert int(row["batches"]) > 0
        gb_s = float(row["gb_s"])
        assert math.isfinite(gb_s) and gb_s > 0, row
        assert float(row["avg_tx_us"]) > 0 and float(row["slices_per_batch"]) >= 1
        print(f"python -m gdr.bench CSV:\n{init.stdout.strip()}")
        assert target.wait(timeout=30) == 0, "the target exits 0 after the initiator's done"
    finally:
        if target.poll() is None:
            target.kill()
        out, err = target.communicate(timeout=10)
        if target.returncode != 0:
            print(f"bench target exited {target.returncode}: stdout {out!r} stderr {err!r}")


def test_bench_command_line_and_csv_format():
    with pytest.raises(SystemExit):
        bench.main(["--target", "1.2.3.4:5"])  # both roles
    args = bench.parser().parse_args(["h:1", "--block-size", "4096,65536", "--depth", "2",
                                      "--csv"])
    assert args.block_size == [4096, 65536] and args.depth == 2 and args.csv
    row = {"block_size": 4096, "batch_size": 128, "batches": 3, "gb_s": 1.5, "gbit_s": 12.0,
           "avg_lat_us": 10.0, "avg_prep_us": 1.0, "p99_prep_us": 2.0, "avg_post_us": 3.0,
           "p99_post_us": 4.0, "avg_tx_us": 10.0, "p99_tx_us": 11.0, "slices_per_batch": 128.0,
           "rails": [{"bytes": 1572864}]}
    report = {"params": {"depth": 2, "op": "write", "layout": "scattered"}, "device": "d:1",
              "rows": [row]}
    text = bench.csv(report)
    assert text.splitlines() == [
        bench.CSV_COLUMNS,
        "4096,128,3,1.500000,12.000000,10.000,1.000,2.000,3.000,4.000,10.000,11.000,128.0,"
        "1572864",
    ]
    assert "4096" in bench.table(report)
    assert sorted(bench.scatter(128).tolist()) == list(range(128))
    assert bench.percentile([1.0, 2.0, 3.0], 0.99) == 3.0
