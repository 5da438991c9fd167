"""Device tests in one process: two agents on the device under test, connected over TCP and
moving bytes over RDMA. They need GDR_TEST_DEVICE (the Soft-RoCE VM) and fail without it."""

import gc
import threading
import time
import weakref

import numpy as np
import pytest

import gdr
from gdr import _gdr

from conftest import agent, connect_threads, eventually

pytestmark = pytest.mark.device

WAIT = 30.0


def pattern(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def test_write_then_read_back_byte_for_byte_with_a_notification(pair):
    a, b, pb, pa = pair
    n = 1 << 20
    src = pattern(1, n)
    dst = np.zeros(n, np.uint8)
    back = np.zeros(n, np.uint8)
    s = a.register(src, "src")
    k = a.register(back, "back")
    b.register(dst, "dst")
    remote = pb.wait_segment("dst", timeout_s=10)
    assert (remote.length, remote.location) == (n, "cpu")
    stats = pb.write(s, 0, remote, 0, n, notify=b"written", timeout_s=WAIT).wait(WAIT)
    assert stats["bytes"] == n and stats["slices"] >= 1
    note = b.wait_notification(timeout_s=10)
    assert note is not None and (note.peer, note.data) == ("py-a", b"written")
    assert np.array_equal(dst, src), "every byte landed in the target's numpy array"
    # READ it back from b into a third array, by id this time.
    pb.read(k, 0, remote.id, 0, n).wait(WAIT)
    assert back.tobytes() == src.tobytes()
    # Segment.read sees the same bytes as the array.
    assert s.read(100, 50) == src[100:150].tobytes()
    print(f"1 MiB written and read back; {stats}")


def test_transfer_blocks_scatters_blocks_by_index(pair):
    a, b, pb, pa = pair
    block, nlocal, npool = 4096, 64, 256
    kv = pattern(2, (nlocal, block))
    pool = np.zeros((npool, block), np.uint8)
    local = a.register(kv, "kv")
    b.register(pool, "pool")
    remote = pb.wait_segment("pool")
    local_blocks = np.arange(nlocal, dtype=np.uint32)[::-1]  # numpy indices, reversed
    remote_blocks = list(range(100, 100 + 2 * nlocal, 2))  # every other block
    t = pb.transfer_blocks("write", local, local_blocks, remote, remote_blocks, block,
                           notify="req-7", timeout_s=WAIT)
    stats = t.wait(WAIT)
    assert stats["descriptors"] == nlocal and stats["bytes"] == nlocal * block
    assert b.wait_notification(10).data == b"req-7"
    assert np.array_equal(pool[remote_blocks], kv[local_blocks])
    untouched = np.ones(npool, bool)
    untouched[remote_blocks] = False
    assert not pool[untouched].any(), "no other block was written"
    # And back: READ them into a fresh array in the original order.
    back = np.zeros_like(kv)
    bk = a.register(back, "back")
    pb.transfer_blocks(gdr.READ, bk, local_blocks, remote.id, remote_blocks, block).wait(WAIT)
    assert np.array_equal(back, kv)


def test_numpy_index_arrays_of_any_integer_type_are_read_whole(pair):
    """A 1-D numpy array of block indices is read in one piece (its bytes), whatever its integer
    type and byte order; a value outside 0..2**32 is a typed error naming its position."""
    a, b, pb, pa = pair
    block = 4096
    kv = pattern(5, (8, block))
    pool = np.zeros((64, block), np.uint8)
    local = a.register(kv, "kv")
    b.register(pool, "pool")
    remote = pb.wait_segment("pool")
    targets = [3, 9, 12, 20, 33, 40, 50, 63]
    for dtype in (np.int64, np.uint16, np.int8, np.dtype(">i4"), np.dtype("<u8")):
        pool[:] = 0
        lb = np.arange(8, dtype=dtype)
        rb = np.array(targets, dtype=dtype)
        pb.transfer_blocks("write", local, lb, remote, rb, block).wait(WAIT)
        assert np.array_equal(pool[targets], kv), dtype
    pool[:] = 7
    before = pool.copy()
    with pytest.raises(gdr.InvalidArgument, match=r"remote_blocks\[1\] = -1 "):
        pb.transfer_blocks("write", local, np.arange(2), remote, np.array([0, -1], np.int64), block)
    with pytest.raises(gdr.InvalidArgument, match=r"local_blocks\[1\] = 4294967296 "):
        pb.transfer_blocks("write", local, np.array([0, 2**32], np.int64), remote, [0, 1], block)

    class Lying:
        """Looks like a 1-D uint32 array of 4 items, but its bytes hold 3 and a half."""

        dtype = np.dtype(np.uint32)
        ndim = 1

        def __len__(self):
            return 4

        def __iter__(self):
            return iter([0, 1, 2, 3])

        def tobytes(self):
            return b"\x00" * 14

    with pytest.raises(gdr.InvalidArgument, match=r"tobytes\(\) gave 14 bytes for 4 items"):
        pb.transfer_blocks("write", local, Lying(), remote, [0, 1, 2, 3], block)
    assert np.array_equal(pool, before), "nothing was posted for a refused table"


def test_source_deleted_mid_transfer_is_released_only_after_the_nic_is_done(one_qp_pair):
    a, b, pb, pa = one_qp_pair
    # Larger than one queue pair's send queue holds (256 requests of 256 KiB), so the submitting
    # call cannot post all of it (rxe moves what it posts within the call): the progress thread
    # posts the rest while the test deletes the array.
    n = 128 << 20
    dst = np.zeros(n, np.uint8)
    b.register(dst, "dst")
    remote = pb.wait_segment("dst")
    src = (np.arange(n // 4, dtype=np.uint32) * np.uint32(2654435761)).view(np.uint8)
    expected = src.copy()
    released = []

    def on_release():
        # Runs when the array's memory is freed (on gdr's release thread, under the GIL): by
        # then every byte must have landed.
        released.append((time.monotonic(), bool(np.array_equal(dst, expected))))

    weak = weakref.ref(src)
    weakref.finalize(src, on_release)
    before = _gdr._release_stats()
    seg = a.register(src, "src")
    t = pb.write(seg, 0, remote, 0, n, timeout_s=120)
    deleted = time.monotonic()
    # Drop every reference the application has: the array, the segment and its registration.
    a.deregister(seg)
    del seg, src
    gc.collect()
    status_after_del, alive_after_del = t.status, weak() is not None
    assert status_after_del == "pending", "the transfer ended before the del: make it larger"
    assert alive_after_del, "the array was freed while the NIC was reading it"
    assert not released
    stats = t.wait(120)
    done = time.monotonic()
    assert eventually(lambda: released), "the array was never freed after the transfer"
    freed_at, complete = released[0]
    assert complete, "the array was freed before every byte had landed"
    assert weak() is None
    after = _gdr._release_stats()
    assert after["exported"] - before["exported"] == 1
    assert after["released"] - before["released"] >= 1
    assert np.array_equal(dst, expected)
    print(
        f"del during a {n >> 20} MiB write: status {status_after_del!r} and array alive after "
        f"del; freed {freed_at - deleted:.3f} s after the del, {freed_at - done:+.3f} s from "
        f"the outcome, with every byte landed; transfer {stats['time_to_complete_s']:.3f} s"
    )


def test_registered_buffers_cannot_move_and_are_given_back(pair):
    a, b, pb, pa = pair
    buf = bytearray(8192)
    seg = a.register(buf, "ba")
    with pytest.raises(BufferError):
        buf.extend(b"x")  # the export pins it
    a.deregister(seg)
    del seg
    gc.collect()

    assert eventually(lambda: _resizable(buf)), "the export was never given back"
    # A registration refused by the engine gives its export back too.
    other = bytearray(4096)
    with pytest.raises(gdr.TooLarge):
        a.register(other, "n" * 65)
    assert eventually(lambda: _resizable(other)), "a refused registration kept its export"


def _resizable(buf: bytearray) -> bool:
    try:
        buf.append(0)
        buf.pop()
        return True
    except BufferError:
        return False


def test_bad_inputs_raise_typed_exceptions(pair):
    a, b, pb, pa = pair
    with pytest.raises(gdr.ReadOnlyBuffer):
        a.register(b"immutable bytes", "ro")
    ro = np.zeros(64, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(gdr.ReadOnlyBuffer):
        a.register(ro)
    with pytest.raises(gdr.NotContiguous):
        a.register(np.zeros((64, 64), np.uint8)[:, ::2])
    with pytest.raises(gdr.NotABuffer):
        a.register(42)
    with pytest.raises(TypeError):
        a.register(object())
    with pytest.raises(gdr.InvalidArgument, match="empty"):
        a.register(bytearray())
    with pytest.raises(gdr.TooLarge):
        a.register(np.zeros(64, np.uint8), "x" * 65)

    src = np.zeros(4 * 4096, np.uint8)
    seg = a.register(src, "src")
    b.register(np.zeros(4 * 4096, np.uint8), "dst")
    remote = pb.wait_segment("dst")
    with pytest.raises(gdr.UnknownSegment):
        pb.write(seg, 0, 9999, 0, 16).wait(WAIT)
    with pytest.raises(gdr.OutOfSegment) as e:
        pb.write(seg, 0, remote, remote.length - 1, 16)
    assert e.value.side == "remote"
    with pytest.raises(gdr.OutOfSegment):
        pb.write(seg, len(src), remote, 0, 16)
    with pytest.raises(gdr.InvalidArgument, match="local_offset"):
        pb.write(seg, -1, remote, 0, 16)
    with pytest.raises(gdr.InvalidArgument, match="length"):
        pb.write(seg, 0, remote, 0, 2**64)
    with pytest.raises(gdr.InvalidArgument):
        pb.write(seg, 0, remote, 0, 0)
    with pytest.raises(gdr.InvalidArgument, match="remote_segment"):
        pb.write(seg, 0, "dst", 0, 16)
    with pytest.raises(gdr.InvalidArgument, match="timeout_s"):
        pb.write(seg, 0, remote, 0, 16, timeout_s=-1)
    with pytest.raises(gdr.InvalidArgument):
        pb.write(seg, 0, remote, 0, 16, notify=b"n" * 5000)
    with pytest.raises(gdr.InvalidArgument, match="notify"):
        pb.write(seg, 0, remote, 0, 16, notify=3.5)
    with pytest.raises(TypeError):
        pb.write("not a segment", 0, remote, 0, 16)

    with pytest.raises(gdr.InvalidArgument, match="op"):
        pb.transfer_blocks("sideways", seg, [0], remote, [0], 4096)
    with pytest.raises(gdr.InvalidArgument, match=r"local_blocks\[1\]"):
        pb.transfer_blocks("write", seg, [0, -1], remote, [0, 1], 4096)
    with pytest.raises(gdr.InvalidArgument, match=r"remote_blocks\[0\]"):
        pb.transfer_blocks("write", seg, [0], remote, [1.5], 4096)
    with pytest.raises(gdr.InvalidArgument, match="local_blocks"):
        pb.transfer_blocks("write", seg, 7, remote, [0], 4096)
    with pytest.raises(gdr.InvalidArgument):
        pb.transfer_blocks("write", seg, [0], remote, [0], 0)
    with pytest.raises(gdr.InvalidArgument):
        pb.transfer_blocks("write", seg, [0, 1], remote, [0], 4096)
    with pytest.raises(gdr.InvalidArgument) as e:  # IndexOutOfRange or BlockOutOfSegment
        pb.transfer_blocks("write", seg, [4], remote, [0], 4096)
    assert isinstance(e.value, (gdr.IndexOutOfRange, gdr.BlockOutOfSegment)), type(e.value)
    with pytest.raises(gdr.InvalidArgument) as e:
        pb.transfer_blocks("read", seg, [0], remote, [2**31], 4096)
    assert isinstance(e.value, (gdr.IndexOutOfRange, gdr.BlockOutOfSegment)), type(e.value)

    # Another agent's segment as the local side.
    theirs = b.register(np.zeros(4096, np.uint8), "theirs")
    with pytest.raises(gdr.ForeignSegment):
        pb.write(theirs, 0, remote, 0, 16)
    with pytest.raises(gdr.ForeignObject) as e:
        a.deregister(theirs)
    assert (e.value.call, e.value.kind, e.value.segment) == ("Agent::deregister", "segment", theirs.id)
    a.deregister(seg)
    with pytest.raises(gdr.UnknownSegment):
        a.deregister(seg)
    with pytest.raises(gdr.UnknownSegment):
        pb.write(seg, 0, remote, 0, 16)
    with pytest.raises(gdr.OutOfSegment):
        theirs.read(4000, 200)
    with pytest.raises(gdr.InvalidArgument):
        theirs.read(-5, 1)

    with pytest.raises(gdr.Timeout) as e:
        pb.wait_segment("never-registered", timeout_s=0.2)
    assert isinstance(e.value, TimeoutError) and e.value.after_s == pytest.approx(0.2)
    with pytest.raises(gdr.InvalidArgument):
        pb.send_notification(b"")
    assert b.wait_notification(timeout_s=0.05) is None
    assert b.wait_notification(timeout_s=0) is None
    with pytest.raises(gdr.InvalidArgument):
        b.wait_notification(timeout_s=float("nan"))
    with pytest.raises(gdr.Timeout):
        a.wait_peer("nobody", timeout_s=0.1)
    assert a.peer("nobody") is None
    with pytest.raises(gdr.IoError):
        a.listen("256.0.0.1:0")


def test_connecting_to_nothing_is_an_io_error():
    c = agent("py-lonely", connect_timeout_s=0.5)
    with pytest.raises(gdr.IoError):
        c.connect("127.0.0.1:1")
    with pytest.raises(gdr.GdrError):
        c.connect("not an address")


def test_ctrl_c_interrupts_a_blocking_connect_and_its_thread_ends_by_its_timeout():
    import _thread

    c = agent("py-impatient", connect_timeout_s=3.0)
    try:
        # What Ctrl-C does (SIGINT's flag), 0.3 s into a connect refused until its 3 s timeout.
        timer = threading.Timer(0.3, _thread.interrupt_main)
        start = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            c.connect("127.0.0.1:1")
        took = time.monotonic() - start
        assert took < 1.5, f"KeyboardInterrupt after {took:.2f} s"
        assert eventually(lambda: connect_threads() == 0, 10), "the connect thread stayed"
        assert c.peers() == []
    finally:
        c.shutdown(1.0)


def test_a_closed_agent_refuses_work_and_its_peer_sees_it_lost(pair):
    a, b, pb, pa = pair
    seg = a.register(np.zeros(4096, np.uint8), "s")
    b.register(np.zeros(4096, np.uint8), "d")
    remote = pb.wait_segment("d")
    report = b.shutdown(0.5)
    assert report == {"pending": 0, "failed": 0}
    with pytest.raises(gdr.AgentClosed):
        b.register(np.zeros(16, np.uint8))
    with pytest.raises(gdr.AgentClosed):
        b.listen("127.0.0.1:0")
    assert eventually(lambda: not pb.is_connected)
    assert pb.lost_reason
    with pytest.raises(gdr.PeerLost) as e:
        pb.write(seg, 0, remote, 0, 16).wait(WAIT)
    assert isinstance(e.value, ConnectionError) and e.value.peer == "py-b"
    # Why, as a value: b said goodbye when it shut down.
    assert e.value.why == "goodbye", (e.value.why, e.value.reason)


def test_disconnect_fails_pending_transfers_with_peer_lost(pair):
    a, b, pb, pa = pair
    seg = a.register(np.zeros(4096, np.uint8), "s")
    b.register(np.zeros(4096, np.uint8), "d")
    remote = pb.wait_segment("d")
    a.disconnect(pb)
    with pytest.raises(gdr.PeerLost):
        pb.write(seg, 0, remote, 0, 16).wait(WAIT)


def test_another_agents_peer_and_lists_are_refused_and_break_nothing(pair):
    """Issue 37's class from Python: another agent's peer handle to ``disconnect``, a
    ``RemoteList`` prepared on another agent's connection (to the same peer) to
    ``transfer_indexed``: refused with ``ForeignObject`` before anything changed; both
    connections keep working."""
    a, b, pb, pa = pair
    c = agent("py-c")
    try:
        pc = c.connect(b.listen("127.0.0.1:0"))
        buf = np.zeros(8192, np.uint8)
        b.register(buf, "d")
        remote = pb.wait_segment("d")
        pc.wait_segment("d")
        src_a = a.register(pattern(1, 4096), "sa")
        src_c = c.register(pattern(2, 4096), "sc")
        with pytest.raises(gdr.ForeignObject) as e:
            c.disconnect(pb)
        assert (e.value.call, e.value.kind, e.value.peer) == ("Agent::disconnect", "peer", "py-b")
        listed = gdr.RemoteList(pb, [(remote, 0, 4096)])
        with pytest.raises(gdr.ForeignObject) as e:
            pc.transfer_indexed("write", gdr.LocalList([(src_c, 0, 4096)]), [0], listed, [0])
        assert (e.value.call, e.value.kind) == ("Peer::transfer_indexed", "remote list")
        assert pb.is_connected and pc.is_connected
        pb.transfer_indexed("write", gdr.LocalList([(src_a, 0, 4096)]), [0], listed, [0]).wait(WAIT)
        pc.write(src_c, 0, remote, 4096, 4096).wait(WAIT)
        assert bytes(buf[:4096]) == bytes(pattern(1, 4096))
        assert bytes(buf[4096:]) == bytes(pattern(2, 4096))
    finally:
        c.shutdown(0.5)


def test_cancel_ends_a_transfer_with_cancelled_or_success(pair):
    a, b, pb, pa = pair
    # Large enough that the progress thread still has slices to post when cancel comes (rxe
    # moves what the submitting call posts within the call).
    n = 128 << 20
    src = a.alloc(n, "src")
    b.alloc(n, "dst")
    remote = pb.wait_segment("dst")
    t = pb.write(src, 0, remote, 0, n, timeout_s=60)
    t.cancel()
    try:
        t.wait(WAIT)
        outcome = "done"
    except gdr.Cancelled as e:
        outcome = "cancelled"
        assert e.peer == "py-b"
    assert t.done and t.status in ("done", "failed")
    print(f"cancelled transfer: {outcome}")


def test_waits_release_the_gil(pair):
    a, b, pb, pa = pair
    result = []
    th = threading.Thread(target=lambda: result.append(b.wait_notification(timeout_s=1.0)))
    count = 0
    start = time.monotonic()
    th.start()
    while time.monotonic() - start < 0.5:
        count += 1
    th.join()
    assert result == [None]
    # Had the wait held the GIL, this thread would have stopped counting for its whole second.
    assert count > 1000, count


def test_alloc_and_segment_copies(pair):
    a, b, pb, pa = pair
    s = a.alloc(8192, "alloc")
    assert (len(s), s.path, s.location) == (8192, "host", "cpu")
    s.write(10, b"hello")
    s.write(20, bytearray(b"world"))
    s.write(30, memoryview(b"!"))
    assert s.read(10, 21) == b"hello" + bytes(5) + b"world" + bytes(5) + b"!"
    d = b.alloc(8192, "d")
    remote = pb.wait_segment("d")
    pb.write(s, 0, remote, 0, 8192).wait(WAIT)
    assert d.read(10, 5) == b"hello"
    names = sorted(x.name for x in a.segments())
    assert "alloc" in names
    assert [p.name for p in a.peers()] == ["py-b"]
    assert "py-b" in repr(pb) and "alloc" in repr(s)


def test_ctrl_c_interrupts_a_blocking_wait(pair):
    import _thread

    a, b, pb, pa = pair
    timer = threading.Timer(0.3, _thread.interrupt_main)  # as SIGINT would
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        b.wait_notification(timeout_s=None)  # no limit: only the interrupt ends it
    took = time.monotonic() - start
    timer.join()
    assert took < 5, took
    # The agent is still usable afterwards.
    assert b.wait_notification(timeout_s=0) is None
    print(f"KeyboardInterrupt ended an unbounded wait after {took:.2f} s")


def test_register_transfer_release_cycles_leak_nothing(pair):
    a, b, pb, pa = pair
    b.register(np.zeros(1 << 20, np.uint8), "dst")
    remote = pb.wait_segment("dst")
    gc.collect()
    before = _gdr._release_stats()
    weaks = []
    cycles = 200
    for i in range(cycles):
        arr = np.full(4096 * (1 + i % 8), i % 251, np.uint8)
        weaks.append(weakref.ref(arr))
        seg = a.register(arr, f"cycle-{i}")
        t = pb.write(seg, 0, remote, (i % 16) * 65536, len(arr))
        a.deregister(seg)
        del seg, arr  # while the write may still be in flight
        t.wait(WAIT)
    assert eventually(lambda: all(w() is None for w in weaks)), "an array was never freed"
    after = _gdr._release_stats()
    assert after["exported"] - before["exported"] == cycles
    # At least these (an earlier test's segments may be given back meanwhile).
    assert after["released"] - before["released"] >= cycles
    assert after["leaked"] == before["leaked"]
    assert not any(s.name.startswith("cycle-") for s in a.segments())
    print(f"{cycles} register/write/deregister/del cycles: {cycles} arrays freed, none leaked")


def test_python_threads_transfer_concurrently(pair):
    a, b, pb, pa = pair
    threads, rounds, block = 4, 20, 65536
    pool = np.zeros((threads * rounds, block), np.uint8)
    b.register(pool, "pool")
    remote = pb.wait_segment("pool")
    errors = []

    def worker(k):
        try:
            src = np.empty((rounds, block), np.uint8)
            for r in range(rounds):
                src[r] = (k * rounds + r) % 251
            seg = a.register(src, f"t{k}")
            for r in range(rounds):
                pb.transfer_blocks("write", seg, [r], remote, [k * rounds + r], block).wait(WAIT)
        except BaseException as e:  # reported below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    for i in range(threads * rounds):
        assert (pool[i] == i % 251).all(), i
