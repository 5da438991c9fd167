"""Tests of the drivers' shared workload (bench_common), on the host: an engine that moves the
bytes itself, in one process, and a target answering on a socket pair. Run by the xtask's
`cargo test` (`the_peer_drivers_pass_their_tests`); needs python3 and numpy (`cargo xtask
setup` installs both)."""

import contextlib
import io
import socket
import sys
import threading
import time
import types
import unittest

import bench_common as bc


class CopyingEngine:
    """An engine whose `submit` copies the blocks of a range itself and takes `delay` seconds
    doing it, as NIXL's `transfer()` of a 32 MiB batch takes over a second under TCG. `lose`
    is a local block the engine never moves."""

    def __init__(self, initiator, target, delay, lose=None):
        self.initiator, self.target = initiator, target
        self.delay, self.lose = delay, lose
        self.submitted = 0

    def prepare(self, blocks, c):
        return (c.op, c.block_size, list(blocks))

    def submit(self, h):
        op, bs, blocks = h
        time.sleep(self.delay)
        for lo, r in blocks:
            if lo == self.lose:
                continue
            mine = self.initiator[lo * bs : (lo + 1) * bs]
            theirs = self.target[r * bs : (r + 1) * bs]
            if op == "write":
                theirs[:] = mine
            else:
                mine[:] = theirs
        self.submitted += 1
        return self.submitted

    def wait(self, token):
        pass

    def release(self, h):
        pass


def run(spec, seconds, delay, depth=2, lose=None):
    """Runs one case with the copying engine; returns (ok, stdout, stderr, engine)."""
    c = bc.Case(spec)
    a = types.SimpleNamespace(
        engine="copying", round=1, device="none", depth=depth, seconds=seconds, cases=[c]
    )
    size = bc.bytes_needed(a)
    _, ini, _ = bc.alloc(size)
    _, tgt, _ = bc.alloc(size)
    eng = CopyingEngine(ini, tgt, delay, lose)
    mine, theirs = socket.socketpair()
    target = threading.Thread(target=bc.answer, args=(a, tgt, theirs))
    target.start()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        ok = bc.run_case(a, 0, c, eng, ini, mine)
    bc.send(mine, {"bye": True})
    target.join()
    mine.close()
    theirs.close()
    return ok, out.getvalue(), err.getvalue(), eng


class WarmUp(unittest.TestCase):
    def test_a_run_shorter_than_one_submission_still_moves_every_range(self):
        # Each submission takes 6 times the timed part: the measured loop posts the first
        # range once and stops. Before the warm-up covered every range, the second range never
        # moved and the data check failed (NIXL's WRITE 1 MiB x 32 with --seconds 1).
        for op in ("write", "read"):
            with self.subTest(op=op):
                ok, out, err, eng = run(f"{op}:4096:8:1:1", seconds=0.05, delay=0.3)
                self.assertTrue(ok, err)
                self.assertIn("### end rc=0", out)
                self.assertGreaterEqual(eng.submitted, 3, "two warm-up submissions, then the loop")
                digests = [
                    w for ln in out.splitlines() if "digest side=" in ln for w in ln.split() if w.startswith("value=")
                ]
                self.assertEqual(len(digests), 2, out)
                self.assertEqual(digests[0], digests[1], out)

    def test_every_threads_ranges_are_warmed_up(self):
        ok, out, err, eng = run("write:1024:4:1:2", seconds=0.05, delay=0.2, depth=3)
        self.assertTrue(ok, err)
        self.assertGreaterEqual(eng.submitted, 2 * 3, "each thread's 3 ranges in the warm-up")

    def test_a_block_that_never_moved_fails_the_check_and_is_named(self):
        for op in ("write", "read"):
            with self.subTest(op=op):
                ok, out, err, _ = run(f"{op}:4096:8:1:1", seconds=0.05, delay=0.0, lose=9)
                self.assertFalse(ok)
                self.assertNotIn("### end rc=0", out)
                self.assertIn("data check failed: 1 of 16 blocks differ", err)
                self.assertIn("(local block 9)", err)
                if op == "read":
                    self.assertIn("still the initiator's own bytes", err)

    def test_the_lines_the_xtask_parses(self):
        ok, out, err, _ = run("read:1024:2:1:1", seconds=0.05, delay=0.0)
        self.assertTrue(ok, err)
        lines = out.splitlines()
        self.assertEqual(lines[0], "### case op=read size=1024 batch=2 qps=1 threads=1")
        self.assertEqual(lines[1], "### copying round=1")
        self.assertRegex(out, r"\nresult gbit_s=[0-9.]+ bytes=[0-9]+ seconds=[0-9.]+ batches=[0-9]+\n")
        self.assertRegex(out, r"\n### pkts sent=0\n")
        self.assertRegex(out, r"\n### cpu busy=[0-9]+(,[0-9]+)* softirq=[0-9]+(,[0-9]+)*\n")


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False, verbosity=2).result.wasSuccessful() else 1)
