"""asyncio, rail telemetry and layer-aware pools in one process (device tests: the Soft-RoCE
VM). Plain ``asyncio.run`` inside each test; no pytest plugin needed. A ticker task counts the
loop's turns while gdr waits: a blocked loop would not turn."""

import asyncio
import gc
import os
import threading
import time

import numpy as np
import pytest

import gdr

pytestmark = pytest.mark.device

WAIT = 30.0


def pattern(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


async def ticking(flag: list) -> None:
    """Counts the loop's turns (every millisecond) until cancelled."""
    while True:
        await asyncio.sleep(0.001)
        flag[0] += 1


def test_two_transfers_awaited_concurrently_with_gather(pair):
    a, b, pb, pa = pair
    n = 16 << 20
    src1, src2 = pattern(21, n), pattern(22, n)
    dst = np.zeros(2 * n, np.uint8)
    s1, s2 = a.register(src1, "s1"), a.register(src2, "s2")
    b.register(dst, "dst")
    remote = pb.wait_segment("dst", timeout_s=10)

    async def main():
        ticks = [0]
        ticker = asyncio.create_task(ticking(ticks))
        t1 = pb.write(s1, 0, remote, 0, n, timeout_s=WAIT)
        t2 = pb.write(s2, 0, remote, n, n, notify=b"both", timeout_s=WAIT)
        start = time.monotonic()
        # `await t` and `await t.wait_async()`, together.
        r1, r2 = await asyncio.wait_for(asyncio.gather(t1, t2.wait_async()), WAIT)
        took = time.monotonic() - start
        ticker.cancel()
        # Awaiting a finished transfer gives its outcome again at once.
        again = await t1
        return r1, r2, again, ticks[0], took

    r1, r2, again, ticks, took = asyncio.run(main())
    assert r1["bytes"] == n and r2["bytes"] == n and again["bytes"] == n
    assert np.array_equal(dst[:n], src1) and np.array_equal(dst[n:], src2)
    note = b.wait_notification(timeout_s=10)
    assert note is not None and note.data == b"both"
    # The loop kept turning while both transfers were awaited.
    assert ticks >= 1
    print(f"2 x {n >> 20} MiB awaited with gather in {took:.3f} s; the loop turned {ticks} times")


def test_a_failed_transfer_raises_its_exception_when_awaited(pair):
    a, b, pb, pa = pair
    n = 32 << 20
    dst = np.zeros(n, np.uint8)
    b.register(dst, "dst")
    remote = pb.wait_segment("dst", timeout_s=10)
    seg = a.register(np.zeros(n, np.uint8), "src")

    async def main():
        t = pb.write(seg, 0, remote, 0, n, timeout_s=WAIT)
        t.cancel()
        try:
            return await t
        except gdr.Cancelled as e:
            return e

    out = asyncio.run(main())
    assert isinstance(out, (gdr.Cancelled, dict)), out


def test_notifications_consumed_by_async_for_and_the_stream_ends_at_shutdown(pair):
    a, b, pb, pa = pair

    async def main():
        got = []

        async def consume():
            async for note in b.notifications():
                got.append((note.peer, note.data))
            return "ended"

        consumer = asyncio.create_task(consume())
        await asyncio.sleep(0.05)  # the consumer waits first
        for i in range(5):
            await pb.send_notification(f"m{i}", timeout_s=WAIT)
        end = time.monotonic() + 10
        while len(got) < 5 and time.monotonic() < end:
            await asyncio.sleep(0.01)
        five = list(got)
        b.shutdown(0.0)  # ends the stream
        ended = await asyncio.wait_for(consumer, 10)
        return five, ended

    five, ended = asyncio.run(main())
    assert five == [("py-a", f"m{i}".encode()) for i in range(5)]
    assert ended == "ended"


def test_a_task_cancelled_while_awaiting_a_transfer(pair):
    a, b, pb, pa = pair
    n = 64 << 20
    dst = np.zeros(n, np.uint8)
    b.register(dst, "dst")
    remote = pb.wait_segment("dst", timeout_s=10)
    seg = a.register(pattern(23, n), "src")

    async def main():
        t = pb.write(seg, 0, remote, 0, n, timeout_s=WAIT)

        async def waiter():
            return await t

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0)  # the task awaits
        pending = t.status == "pending"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Cancelling the awaiting task cancelled the transfer: it ends with Cancelled once its
        # memory is quiet (before, it went on and completed), and awaiting it again gives that.
        try:
            outcome = await asyncio.wait_for(t.wait_async(), WAIT)
        except gdr.Cancelled as e:
            outcome = e
        # The hub still serves other transfers afterwards.
        small = await pb.write(seg, 0, remote, 0, 4096, timeout_s=WAIT)
        return pending, outcome, t.status, small

    pending, outcome, status, small = asyncio.run(main())
    assert pending, "the transfer ended before the cancel: make it larger"
    assert status in ("done", "failed")
    assert isinstance(outcome, gdr.Cancelled), outcome
    assert status == "failed"
    assert small["bytes"] == 4096
    print(f"task cancelled while awaiting a {n >> 20} MiB write: {outcome!r}")


def test_a_cancelled_notification_wait_loses_nothing(pair):
    a, b, pb, pa = pair

    async def main():
        stream = b.notifications()
        step = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.05)
        step.cancel()
        await asyncio.sleep(0)
        await pb.send_notification(b"after-cancel", timeout_s=WAIT)
        # The next step gets it, whether the cancelled one's watch took it or not.
        note = await asyncio.wait_for(stream.__anext__(), 10)
        return note.data

    assert asyncio.run(main()) == b"after-cancel"
    assert b.pending_notifications == 0
    gc.collect()


def test_wait_async_needs_a_running_loop(pair):
    a, b, pb, pa = pair
    t = pb.send_notification(b"x", timeout_s=WAIT)
    with pytest.raises(RuntimeError):
        t.wait_async()
    t.wait(WAIT)
    # A notification step is a coroutine: it needs its loop only to wait (here it takes the
    # notification already queued without waiting).
    step = b.notifications().__anext__()
    assert asyncio.iscoroutine(step)
    assert asyncio.run(step).data == b"x"


def test_rail_staging_and_cache_stats(pair):
    a, b, pb, pa = pair
    n = 4 << 20
    dst = np.zeros(n, np.uint8)
    b.register(dst, "dst")
    remote = pb.wait_segment("dst", timeout_s=10)
    seg = a.register(pattern(24, n), "src")
    before = sum(r["bytes"] for r in pb.rail_stats())
    pb.write(seg, 0, remote, 0, n, timeout_s=WAIT).wait(WAIT)
    rails = pb.rail_stats()
    assert len(rails) >= 1 and all(isinstance(r, dict) for r in rails)
    keys = {"rail", "device", "port", "state", "bytes", "slices", "errors", "retries",
            "renewals", "readmissions", "fences", "inflight_bytes", "throughput",
            "last_error", "last_failover_s"}
    assert all(set(r) == keys for r in rails), rails[0].keys()
    assert [(r["device"], r["port"]) for r in rails] == [a.rails[r["rail"]] for r in rails]
    assert all(r["state"] in ("active", "paused", "renewing", "probing") for r in rails)
    assert sum(r["bytes"] for r in rails) - before >= n
    assert sum(r["slices"] for r in rails) >= 1
    assert all(r["errors"] == 0 and r["last_error"] is None for r in rails)
    staging = a.staging_stats()
    assert staging == {"gpus": [], "buffers": 0, "active_transfers": 0, "transfers": 0,
                       "chunks": 0, "bytes": 0, "waited_for_nic": 0, "waiting_now": 0,
                       "chunks_in_use": 0}
    cache = a.cache_stats()
    assert set(cache) == {"hits", "registrations", "merged"}
    assert all(isinstance(v, int) and v >= 0 for v in cache.values())
    print(f"rail_stats: {rails}")


def test_transfer_pools_moves_the_same_blocks_in_every_layer(pair):
    a, b, pb, pa = pair
    layers, block, nlocal, nremote = 4, 1024, 16, 64
    kv = pattern(31, (layers, 2, nlocal, block))  # layers x {K, V} x blocks, one allocation
    pool = np.zeros((layers, 2, nremote, block), np.uint8)
    local = a.register(kv, "kv-layers")
    b.register(pool, "pool-layers")
    remote = pb.wait_segment("pool-layers", timeout_s=10)
    lpool, rpool = nlocal * block, nremote * block
    pools = [(local, p * lpool, remote, p * rpool) for p in range(layers * 2)]
    lb = np.arange(0, nlocal, 2, dtype=np.uint32)  # 8 blocks, every other one
    rb = [40 - 2 * i for i in range(len(lb))]  # reversed, every other one
    t = pb.transfer_pools("write", pools, lb, rb, block, notify=b"layers", timeout_s=WAIT)
    stats = t.wait(WAIT)
    assert stats["bytes"] == layers * 2 * len(lb) * block
    assert b.wait_notification(timeout_s=10).data == b"layers"
    assert np.array_equal(pool[:, :, rb], kv[:, :, lb]), "every pool got its blocks"
    assert np.count_nonzero(pool.reshape(layers, 2, nremote, block).any(axis=3)) <= layers * 2 * len(lb)

    # Back with a remote stride of two blocks (block k of a remote pool at base + 2k blocks),
    # by segment id, awaited.
    back = np.zeros_like(kv)
    bk = a.register(back, "back-layers")
    half = [r // 2 for r in rb]

    async def main():
        return await pb.transfer_pools(
            gdr.READ, [(bk, p * lpool, remote.id, p * rpool) for p in range(layers * 2)],
            lb, half, block, timeout_s=WAIT, remote_stride=2 * block,
        )

    assert asyncio.run(main())["bytes"] == stats["bytes"]
    assert np.array_equal(back[:, :, lb], kv[:, :, lb])
    untouched = np.ones(nlocal, bool)
    untouched[lb] = False
    assert not back[:, :, untouched].any()

    # Bad pools and blocks: typed exceptions before anything is posted.
    bad = [
        ([], gdr.InvalidArgument),
        (None, gdr.InvalidArgument),
        ([(local, 0)], gdr.InvalidArgument),
        ([(remote, 0, remote, 0)], gdr.InvalidArgument),
        ([(local, -1, remote, 0)], gdr.InvalidArgument),
        ([(local, 0, "pool", 0)], gdr.InvalidArgument),
        ([(local, 0, remote, 2**64)], gdr.InvalidArgument),
        ([(local, 0, 9999, 0)], gdr.GdrError),
        ([(local, kv.nbytes - block, remote, 0)], gdr.BlockOutOfSegment),
    ]
    for pools_arg, exc in bad:
        with pytest.raises(exc):
            pb.transfer_pools("write", pools_arg, lb, rb, block, timeout_s=WAIT).wait(WAIT)
    with pytest.raises(gdr.InvalidArgument):
        pb.transfer_pools("write", pools, lb, rb[:-1], block)
    with pytest.raises(gdr.InvalidArgument):
        pb.transfer_pools("write", pools, lb, rb, block, local_stride=block - 1)
    with pytest.raises(gdr.InvalidArgument):
        pb.transfer_pools("sideways", pools, lb, rb, block)


def test_many_transfers_awaited_at_once_use_no_thread_each(pair):
    a, b, pb, pa = pair
    n, count = 256 << 10, 64
    src = pattern(41, (count, n))
    dst = np.zeros((count, n), np.uint8)
    seg = a.register(src, "many-src")
    b.register(dst, "many-dst")
    remote = pb.wait_segment("many-dst", timeout_s=10)

    def threads() -> int:
        return len(os.listdir("/proc/self/task"))

    async def main():
        await pb.send_notification(b"warm-up", timeout_s=WAIT)  # the asyncio thread runs
        before = threads()
        ts = [pb.write(seg, i * n, remote, i * n, n, timeout_s=WAIT) for i in range(count)]
        waiting = asyncio.ensure_future(asyncio.gather(*ts))
        await asyncio.sleep(0)
        during = threads()
        results = await asyncio.wait_for(waiting, WAIT)
        return before, during, results

    before, during, results = asyncio.run(main())
    assert during <= before, f"{during - before} threads more while {count} transfers waited"
    assert all(r["bytes"] == n for r in results)
    assert np.array_equal(dst, src)
    assert b.wait_notification(timeout_s=10).data == b"warm-up"


def test_a_transfer_awaited_and_waited_for_by_a_thread_at_once(pair):
    a, b, pb, pa = pair
    n = 64 << 20
    dst = np.zeros(n, np.uint8)
    b.register(dst, "dst")
    remote = pb.wait_segment("dst", timeout_s=10)
    src = pattern(42, n)
    seg = a.register(src, "src")
    t = pb.write(seg, 0, remote, 0, n, timeout_s=WAIT)
    blocking = []
    th = threading.Thread(target=lambda: blocking.append(t.wait(WAIT)))
    th.start()

    async def main():
        statuses = []
        # Twice at once on the same transfer, and its getters meanwhile.
        waiting = asyncio.ensure_future(asyncio.gather(t, t.wait_async()))
        while not waiting.done():
            statuses.append(t.status)
            await asyncio.sleep(0.001)
        return await waiting, statuses

    (r1, r2), statuses = asyncio.run(main())
    th.join(WAIT)
    assert not th.is_alive()
    assert r1 == r2 == blocking[0] and r1["bytes"] == n
    assert statuses and set(statuses) <= {"pending", "done"}
    assert np.array_equal(dst, src)


# --- connecting and waiting for peers and segments, awaited ---------------------------------


def test_connect_wait_peer_and_wait_segment_awaited_then_bytes_moved():
    from conftest import agent

    a = agent("py-aio-a")
    b = agent("py-aio-b")
    n = 4 << 20
    src = pattern(41, n)
    dst = np.zeros(n, np.uint8)
    try:
        addr = b.listen("127.0.0.1:0")
        seg = a.register(src, "src")

        async def main():
            ticks = [0]
            ticker = asyncio.create_task(ticking(ticks))
            pb, pa = await asyncio.wait_for(
                asyncio.gather(a.connect_async(addr), b.wait_peer_async("py-aio-a")), WAIT)
            # The segment is registered after the wait started.
            waiting = asyncio.ensure_future(pb.wait_segment_async("dst"))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            b.register(dst, "dst")
            remote = await asyncio.wait_for(waiting, WAIT)
            stats = await asyncio.wait_for(pb.write(seg, 0, remote, 0, n, timeout_s=WAIT), WAIT)
            ticker.cancel()
            return pb, pa, remote, stats, ticks[0]

        pb, pa, remote, stats, ticks = asyncio.run(main())
        assert (pb.name, pa.name) == ("py-aio-b", "py-aio-a")
        assert (remote.name, remote.length) == ("dst", n)
        assert stats["bytes"] == n
        assert np.array_equal(dst, src), "WRITE byte for byte"
        assert ticks >= 1, "the loop kept turning"
    finally:
        a.shutdown(1.0)
        b.shutdown(1.0)


def test_cancelled_connect_peer_and_segment_awaits_lose_nothing():
    from conftest import agent, connect_threads, wait_for

    a = agent("py-aio-c")
    b = agent("py-aio-d")
    try:
        addr = b.listen("127.0.0.1:0")

        async def main():
            # A peer wait cancelled before anyone connects.
            w = b.wait_peer_async("py-aio-c")
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(w, 0.2)
            assert w.cancelled()
            # A connect cancelled at once: the engine's thread connects anyway, and the peer
            # stays; both sides find it.
            c = a.connect_async(addr)
            c.cancel()
            with pytest.raises(asyncio.CancelledError):
                await c
            pa = await asyncio.wait_for(b.wait_peer_async("py-aio-c"), WAIT)
            pb = await asyncio.wait_for(a.wait_peer_async("py-aio-d"), WAIT)
            # A segment wait cancelled before the segment exists; a later wait gets it.
            s = pb.wait_segment_async("late")
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(s, 0.2)
            assert s.cancelled()
            b.alloc(4096, "late")
            remote = await asyncio.wait_for(pb.wait_segment_async("late"), WAIT)
            return pa, pb, remote

        pa, pb, remote = asyncio.run(main())
        assert (pa.name, pb.name, remote.name, remote.length) == (
            "py-aio-c", "py-aio-d", "late", 4096)
        assert pb.is_connected and [p.name for p in a.peers()] == ["py-aio-d"]
        wait_for(lambda: connect_threads() == 0, 15, "the cancelled connect's thread ended")
        # Still one connection, which works: a message goes through.
        pb.send_notification(b"after-cancel").wait(WAIT)
        note = b.wait_notification(timeout_s=WAIT)
        assert note is not None and note.data == b"after-cancel"
    finally:
        a.shutdown(1.0)
        b.shutdown(1.0)


def test_awaited_connects_and_waits_raise_their_typed_errors(pair):
    from _etcd_server import free_port
    from conftest import agent

    a, b, pb, pa = pair
    lonely = agent("py-aio-lonely", connect_timeout_s=1.0)
    try:
        async def main():
            # Nothing listens there: IoError after the agent's 1 s connect timeout.
            t0 = time.monotonic()
            with pytest.raises(gdr.IoError):
                await asyncio.wait_for(lonely.connect_async(f"127.0.0.1:{free_port()}"), WAIT)
            refused_after = time.monotonic() - t0
            # A segment wait on a peer that is disconnected: PeerLost.
            s = pb.wait_segment_async("never")
            await asyncio.sleep(0.05)
            a.disconnect(pb)
            with pytest.raises(gdr.PeerLost):
                await asyncio.wait_for(s, WAIT)
            # A peer wait on an agent shut down meanwhile: AgentClosed.
            w = lonely.wait_peer_async("never")
            await asyncio.sleep(0.05)
            lonely.shutdown(0.0)
            with pytest.raises(gdr.AgentClosed):
                await asyncio.wait_for(w, WAIT)
            return refused_after

        refused_after = asyncio.run(main())
        assert refused_after < 10.0, refused_after
        # Outside a running loop: asyncio's own error, nothing started.
        with pytest.raises(RuntimeError):
            a.wait_peer_async("py-b")
    finally:
        lonely.shutdown(0.0)
