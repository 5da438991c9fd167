"""The third audit's attacks from plain Python (no ctypes), kept as tests: registered memory that
Python code tries to free or move, memory that is not plain data, lengths that lie. Each test
says the attack and what the audit saw before the fix. Device tests: they need GDR_TEST_DEVICE
(the Soft-RoCE VM) and fail without it."""

import array
import gc
import mmap
import time

import numpy as np
import pytest

import gdr

pytestmark = pytest.mark.device

WAIT = 30.0


def _peer_writes(pb, a_seg_name, payload: bytes, src_seg, remote_name=None):
    """The peer (``pb``'s agent side) writes ``payload`` over the start of ``a``'s segment."""
    remote = pb.wait_segment(remote_name or a_seg_name, timeout_s=10)
    src_seg.write(0, payload)
    pb.write(src_seg, 0, remote, 0, len(payload), timeout_s=WAIT).wait(WAIT)


def test_no_python_object_can_end_a_registered_bytearrays_export(pair):
    # Before: gdr held the export through a memoryview; gc.get_objects() found it, release()
    # worked, the bytearray was resized while registered, and the peer's WRITE landed in an
    # unrelated bytearray that took the freed buffer.
    a, b, pb, pa = pair
    buf = bytearray(64 << 10)
    seg = b.register(buf, "victim")
    released = 0
    for o in gc.get_objects():
        if isinstance(o, memoryview):
            try:
                if o.obj is buf:
                    o.release()
                    released += 1
            except (ValueError, BufferError):
                pass
    assert released == 0, "a Python-visible memoryview held the export"
    with pytest.raises(BufferError):
        buf.extend(b"x" * (1 << 20))
    # The registered memory is still the bytearray's: a peer's WRITE lands in it.
    src = a.alloc(4096, "src")
    _peer_writes(pb, "victim", b"\xab" * 4096, src)
    assert bytes(buf[:4096]) == b"\xab" * 4096
    b.deregister(seg)


def test_the_owner_of_a_registered_arrays_memory_cannot_free_it(pair):
    # np.frombuffer(bytearray): the array borrows the bytearray's memory through a memoryview
    # (its .base). Releasing that view and resizing the bytearray would free registered memory.
    a, b, pb, pa = pair
    owner = bytearray(16 << 10)
    arr = np.frombuffer(owner, dtype=np.uint8)
    seg = b.register(arr, "borrowed")
    base = arr.base
    if isinstance(base, memoryview):
        with pytest.raises(BufferError):
            base.release()
    with pytest.raises(BufferError):
        owner.extend(b"x" * (1 << 20))
    src = a.alloc(4096, "src2")
    _peer_writes(pb, "borrowed", b"\x5a" * 4096, src)
    assert bytes(owner[:4096]) == b"\x5a" * 4096
    b.deregister(seg)


def test_numpy_cannot_resize_a_registered_array_even_without_refcheck(pair):
    a, b, pb, pa = pair
    arr = np.zeros(1 << 16, np.uint8)
    seg = b.register(arr, "np")
    with pytest.raises((ValueError, BufferError)):
        arr.resize(1 << 24, refcheck=False)
    # A view registered: its base array cannot be resized either.
    parent = np.zeros(1 << 16, np.uint8)
    view = parent[4096:8192]
    seg2 = b.register(view, "npview")
    with pytest.raises((ValueError, BufferError)):
        parent.resize(1 << 24, refcheck=False)
    b.deregister(seg)
    b.deregister(seg2)


def test_array_and_mmap_exporters_refuse_to_move_while_registered(pair):
    a, b, pb, pa = pair
    arr = array.array("I", bytes(4096))
    seg = b.register(arr, "arr")
    with pytest.raises(BufferError):
        arr.extend(range(100000))
    m = mmap.mmap(-1, 1 << 16)
    seg2 = b.register(m, "mm")
    with pytest.raises(BufferError):
        m.close()
    with pytest.raises(BufferError):
        m.resize(1 << 20)
    # An mmap seen through numpy: the mmap still cannot be closed.
    m2 = mmap.mmap(-1, 1 << 16)
    seg3 = b.register(np.frombuffer(m2, dtype=np.uint8), "mm-np")
    with pytest.raises(BufferError):
        m2.close()
    for s in (seg, seg2, seg3):
        b.deregister(s)


def test_only_plain_data_is_registrable(pair):
    # Before: an object array was accepted, its PyObject pointers remotely writable memory.
    a, b, pb, pa = pair
    refused = [
        np.array([object(), "x", 3], dtype=object),
        np.zeros(4, dtype=[("a", "i4"), ("o", "O")]),
        memoryview(bytearray(64)).cast("P"),
    ]
    for obj in refused:
        with pytest.raises(gdr.NotPlainData) as e:
            b.register(obj, "refused")
        assert isinstance(e.value, gdr.InvalidArgument)
        assert e.value.hint
    assert not [s for s in b.segments() if s.name == "refused"]
    # Plain data of any shape and kind is fine.
    for obj in (
        np.zeros(16, dtype=[("a", "<i4"), ("b", "<f8"), ("c", "S3")]),
        np.zeros((4, 4), np.complex128),
        np.zeros(8, np.float16),
        memoryview(bytearray(64)).cast("d"),
    ):
        s = b.register(obj, "plain")
        b.deregister(s)


class _LyingLen:
    """An iterable whose ``__len__`` claims far more items than it yields."""

    def __init__(self, items, claimed):
        self.items, self.claimed = items, claimed

    def __len__(self):
        return self.claimed

    def __iter__(self):
        return iter(self.items)


@pytest.mark.parametrize("claimed", [2**40, 2**62, 2**63 - 1])
def test_lying_lengths_allocate_nothing_and_never_abort(pair, claimed):
    # Before: 2**40 killed the interpreter with SIGABRT (a 26 TB allocation), 2**62 raised a
    # PanicException (capacity overflow).
    a, b, pb, pa = pair
    src = a.alloc(4 * 4096, "lsrc")
    dst = b.alloc(4 * 4096, "ldst")
    remote = pb.wait_segment("ldst", timeout_s=10)
    local = gdr.LocalList(_LyingLen([(src, 0, 4096), (src, 4096, 4096)], claimed))
    assert len(local) == 2
    rlist = gdr.RemoteList(pb, _LyingLen([(remote, 0, 4096), (remote, 8192, 4096)], claimed))
    assert len(rlist) == 2
    src.write(0, bytes(range(256)) * 32)
    pb.transfer_indexed("write", local, _LyingLen([0, 1], claimed), rlist,
                        _LyingLen([0, 1], claimed), timeout_s=WAIT).wait(WAIT)
    assert dst.read(8192, 4096) == src.read(4096, 4096)
    t = pb.transfer_blocks("write", src, _LyingLen([2, 3], claimed), remote,
                           _LyingLen([0, 1], claimed), 4096, timeout_s=WAIT)
    t.wait(WAIT)
    assert dst.read(0, 8192) == src.read(8192, 8192)
    # Items that claim more fields than they have, or yield without end.
    with pytest.raises(gdr.InvalidArgument):
        gdr.LocalList([_LyingLen([src, 0, 4096, 1, 2], claimed)])

    def endless():
        while True:
            yield src

    with pytest.raises(gdr.InvalidArgument):
        gdr.LocalList([endless()])


def test_reads_of_impossible_lengths_are_typed_errors(pair):
    # Before: Segment::to_vec(0, usize::MAX) panicked, to_vec(0, 1 << 40) aborted.
    a, b, pb, pa = pair
    seg = a.alloc(4096, "small")
    for off, n in ((0, 2**64 - 1), (0, 1 << 40), (2**64 - 1, 1), (4096, 1), (1, 4096)):
        with pytest.raises(gdr.OutOfSegment):
            seg.read(off, n)
    with pytest.raises(gdr.OutOfSegment):
        seg.write(2**64 - 1, b"x")
    assert seg.read(0, 4096) == bytes(4096)


def test_a_notification_for_a_step_whose_loop_closed_is_kept_for_the_next_wait(pair):
    # Before: gdr's asyncio thread took the notification for the step and dropped it when the
    # loop refused the callback: "a message sent (reported done) ... b.wait_notification
    # (timeout_s=5) returned None and take_notifications() 0 notifications".
    import asyncio

    a, b, pb, pa = pair
    loop = asyncio.new_event_loop()

    async def start_a_step():
        task = asyncio.ensure_future(b.notifications().__anext__())
        await asyncio.sleep(0.05)  # the step waits
        return task

    step = loop.run_until_complete(start_a_step())
    loop.close()  # the step is still pending, its loop gone
    pb.send_notification(b"to a closed loop", timeout_s=WAIT).wait(WAIT)
    note = b.wait_notification(timeout_s=10)
    assert note is not None and note.data == b"to a closed loop"
    assert not step.done()


def test_cancelled_async_waits_hold_no_wakers(pair):
    # Before: "wait_notification_async: 10000 of 10000 wakers held after their futures were
    # dropped" (the same for notifications() and wait_peer_async).
    import asyncio

    from conftest import eventually

    a, b, pb, pa = pair
    n = 2000

    async def main():
        steps = [asyncio.ensure_future(b.notifications().__anext__()) for _ in range(n)]
        peers = [b.wait_peer_async(f"nobody-{i}") for i in range(n)]
        segs = [pa.wait_segment_async(f"none-{i}") for i in range(n)]
        await asyncio.sleep(0.2)
        held = b._waker_counts()
        for f in steps + peers + segs:
            f.cancel()
        await asyncio.sleep(0)
        # Timeouts of a wait in a loop, as an application polls.
        for _ in range(200):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(b.wait_peer_async("never"), 0.001)
        return held

    held = asyncio.run(main())
    assert held["notifications"] >= 1 and held["peers"] >= 1, held
    assert eventually(lambda: b._waker_counts() == {"notifications": 0, "peers": 0}, 10), (
        b._waker_counts()
    )
    # Still served afterwards.
    pb.send_notification(b"after", timeout_s=WAIT).wait(WAIT)

    async def one():
        return await asyncio.wait_for(b.notifications().__anext__(), WAIT)


    assert asyncio.run(one()).data == b"after"


def test_notifications_of_cancelled_steps_reach_exactly_one_later_wait(pair):
    # Before: 24 `async for` tasks cancelled as their notification arrived: "6: b'PONG 6' gone".
    import asyncio

    a, b, pb, pa = pair
    n = 24

    async def main():
        got = []

        async def consumer():
            async for note in b.notifications():
                got.append(note.data)
                return

        tasks = [asyncio.create_task(consumer()) for _ in range(n)]
        await asyncio.sleep(0.1)
        sends = []
        for i in range(n):
            sends.append(pb.send_notification(f"PONG {i}".encode(), timeout_s=WAIT))
            await asyncio.sleep(0)
            tasks[i].cancel()
        for t in sends:
            await t
        await asyncio.gather(*tasks, return_exceptions=True)
        # What no task got is still there, once each, for the next waits.
        async def drain():
            rest = []
            while len(got) + len(rest) < n:
                note = await asyncio.wait_for(b.notifications().__anext__(), 10)
                rest.append(note.data)
            return rest

        rest = await drain()
        return got, rest

    got, rest = asyncio.run(main())
    assert sorted(got + rest) == sorted(f"PONG {i}".encode() for i in range(n))
    assert b.take_notifications() == []


def test_after_shutdown_every_wait_says_agent_closed(pair):
    # Before: after shutdown, wait_peer raised Timeout rather than AgentClosed.
    import asyncio

    a, b, pb, pa = pair
    b.shutdown(0.0)
    with pytest.raises(gdr.AgentClosed):
        b.wait_peer("py-a", timeout_s=1)
    with pytest.raises(gdr.AgentClosed):
        b.wait_peer("nobody", timeout_s=None)
    with pytest.raises(gdr.AgentClosed):
        b.register(bytearray(4096))
    with pytest.raises(gdr.AgentClosed):
        b.alloc(4096)
    with pytest.raises(gdr.AgentClosed):
        b.listen("127.0.0.1:0")

    async def main():
        with pytest.raises(gdr.AgentClosed):
            await asyncio.wait_for(b.wait_peer_async("nobody"), 5)

    asyncio.run(main())


def test_a_large_submission_from_a_coroutine_is_posted_off_the_loop(pair):
    # Before: submitting one 16 MiB range blocked the event loop for 275 ms (Soft-RoCE does the
    # NIC's work inside ibv_post_send). Now the loop only checks, plans and queues it; gdr's
    # post thread posts it. Paired in one run: the same submission outside a loop posts inline.
    import asyncio
    import time

    a, b, pb, pa = pair
    n = 16 << 20
    dst = np.zeros(n, np.uint8)
    b.register(dst, "big-dst")
    remote = pb.wait_segment("big-dst", timeout_s=10)
    src = a.alloc(n, "big-src")
    src.write(0, bytes(range(256)) * (n // 256))

    t0 = time.perf_counter()
    t = pb.write(src, 0, remote, 0, n, timeout_s=WAIT)
    inline = time.perf_counter() - t0
    t.wait(WAIT)
    dst[:] = 0

    async def main():
        t0 = time.perf_counter()
        t = pb.write(src, 0, remote, 0, n, timeout_s=WAIT)
        on_loop = time.perf_counter() - t0
        # Bad input still raises from the call itself.
        with pytest.raises(gdr.OutOfSegment):
            pb.write(src, 1, remote, 0, n, timeout_s=WAIT)
        stats = await t
        return on_loop, stats

    on_loop, stats = asyncio.run(main())
    assert stats["bytes"] == n
    assert bytes(dst[:4096]) == bytes(range(256)) * 16 and dst[-1] == 255
    print(f"16 MiB write: the caller's thread spent {1e3 * inline:.1f} ms outside a loop "
          f"(posted inline), {1e3 * on_loop:.2f} ms on an event loop (ratio {on_loop / inline:.3f})")
    assert on_loop < 0.25 * inline, (on_loop, inline)


def test_queued_submissions_cancelled_disconnected_or_dropped_at_once_keep_their_promises(pair):
    # The adversary's turn on the post thread: a transfer queued on the loop and cancelled,
    # its peer disconnected, or its handles dropped, before gdr's post thread posted it.
    import asyncio

    a, b, pb, pa = pair
    n = 4 << 20
    dst = np.zeros(n, np.uint8)
    b.register(dst, "q-dst")
    remote = pb.wait_segment("q-dst", timeout_s=10)
    src = a.alloc(n, "q-src")
    src.write(0, b"\x77" * n)

    async def main():
        # Cancelled while queued: Cancelled. (The post thread may win the race and post it
        # first; a transfer that finished before its cancel keeps its outcome, so success is
        # the other answer the promise allows. The CI saw it on a loaded host.)
        t = pb.write(src, 0, remote, 0, n, timeout_s=WAIT)
        t.cancel()
        try:
            await t
            assert t.status == "done"
        except gdr.Cancelled:
            assert t.status == "failed"
        # Many queued at once, every handle dropped at once: each still lands.
        for i in range(8):
            pb.write(src, 0, remote, 0, n, timeout_s=WAIT)
        last = pb.write(src, 0, remote, 0, n, notify=b"last", timeout_s=WAIT)
        await last
        note = b.wait_notification(timeout_s=10)
        assert note is not None and note.data == b"last"
        assert bytes(dst[:16]) == b"\x77" * 16 and dst[-1] == 0x77
        # Queued, then the peer disconnected before the post thread ran: PeerLost.
        t2 = pb.write(src, 0, remote, 0, n, timeout_s=WAIT)
        a.disconnect(pb)
        try:
            await t2  # landed before the disconnect, or failed with it
        except gdr.PeerLost:
            pass
        assert t2.status in ("done", "failed")

    asyncio.run(main())
    # Nothing is left pending: the agent shuts down at once.
    assert a.shutdown(5.0)["pending"] == 0


def test_notifications_reach_each_exactly_once_across_loops_threads_and_random_cancels(pair):
    # The class of the lost message, attacked at once from several event loops in several
    # threads, with blocking waits beside them and steps cancelled at random moments.
    import asyncio
    import random
    import threading

    a, b, pb, pa = pair
    total = 120
    got = []
    lock = threading.Lock()
    stop = threading.Event()

    def async_consumer(seed):
        rng = random.Random(seed)

        async def main():
            stream = b.notifications()
            while not stop.is_set():
                step = asyncio.ensure_future(stream.__anext__())
                done, _ = await asyncio.wait({step}, timeout=rng.uniform(0, 0.02))
                if step in done:
                    with lock:
                        got.append(step.result().data)
                else:
                    step.cancel()
                    try:
                        note = await step
                    except asyncio.CancelledError:
                        continue
                    with lock:
                        got.append(note.data)  # it completed before the cancel took

        asyncio.run(main())

    def blocking_consumer():
        while not stop.is_set():
            note = b.wait_notification(timeout_s=0.01)
            if note is not None:
                with lock:
                    got.append(note.data)

    threads = [threading.Thread(target=async_consumer, args=(s,)) for s in range(3)]
    threads.append(threading.Thread(target=blocking_consumer))
    for t in threads:
        t.start()
    try:
        for i in range(total):
            pb.send_notification(f"m{i}".encode(), timeout_s=WAIT).wait(WAIT)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            with lock:
                if len(got) >= total:
                    break
            time.sleep(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert sorted(got) == sorted(f"m{i}".encode() for i in range(total)), (len(got), total)
    assert b.take_notifications() == []


def test_impossible_allocations_are_typed_errors_not_aborts(pair):
    a, b, pb, pa = pair
    for n in (2**62, 2**64 - 1):
        with pytest.raises(gdr.GdrError):
            a.alloc(n, "huge")
    with pytest.raises(gdr.InvalidArgument):
        a.alloc(2**64, "huge")
