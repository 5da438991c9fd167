"""Prepared lists and indexed transfers (NIXL's prepped descriptor lists): ranges checked once
with ``gdr.LocalList`` / ``gdr.RemoteList``, then moved by index with
``Peer.transfer_indexed``. Device tests: they run in the Soft-RoCE VM."""

import threading

import numpy as np
import pytest

import gdr

from conftest import eventually

pytestmark = pytest.mark.device

WAIT = 30.0


def test_entries_move_by_index_byte_for_byte_in_both_directions(pair):
    a, b, pb, pa = pair
    rng = np.random.default_rng(11)
    # Two local segments, ranges of different sizes in each (layers of unequal blocks).
    k = rng.integers(0, 256, 64 << 10, dtype=np.uint8)
    v = rng.integers(0, 256, 64 << 10, dtype=np.uint8)
    ks, vs = a.register(k, "k"), a.register(v, "v")
    sizes = [512, 4096, 1000, 8192, 3, 16384]
    local_ranges, offset = [], 0
    for i, n in enumerate(sizes):
        local_ranges.append((ks if i % 2 == 0 else vs, offset, n))
        offset += n
    local = gdr.LocalList(local_ranges)
    assert len(local) == len(sizes)

    dst = np.zeros(256 << 10, np.uint8)
    b.register(dst, "dst")
    remote_seg = pb.wait_segment("dst", timeout_s=10)
    # The remote list holds each size at a scattered offset, in reverse order.
    remote_ranges, spots = [], {}
    at = 1 << 10
    for i, n in reversed(list(enumerate(sizes))):
        spots[i] = at
        remote_ranges.append((remote_seg if i % 2 else remote_seg.id, at, n))
        at += n + 777
    remote = gdr.RemoteList(pb, remote_ranges)
    assert (len(remote), remote.peer) == (len(sizes), "py-b")
    # Entry i of `local` pairs with entry len-1-i of `remote` (same size).
    li = np.arange(len(sizes), dtype=np.int64)
    ri = [len(sizes) - 1 - i for i in range(len(sizes))]
    stats = pb.transfer_indexed("write", local, li, remote, ri, notify=b"idx",
                                timeout_s=WAIT).wait(WAIT)
    assert stats["bytes"] == sum(sizes)
    assert b.wait_notification(10).data == b"idx"
    for i, (seg_arr, off, n) in enumerate(
        (k if i % 2 == 0 else v, r[1], r[2]) for i, r in enumerate(local_ranges)
    ):
        assert np.array_equal(dst[spots[i]:spots[i] + n], seg_arr[off:off + n]), f"entry {i}"
    # READ two of them back into a fresh local list, by index again.
    back = np.zeros(32 << 10, np.uint8)
    bs = a.register(back, "back")
    back_list = gdr.LocalList([(bs, 0, sizes[1]), (bs, 8192, sizes[5])])
    pb.transfer_indexed("read", back_list, [0, 1], remote, [4, 0]).wait(WAIT)
    assert np.array_equal(back[:sizes[1]], v[local_ranges[1][1]:][:sizes[1]])
    assert np.array_equal(back[8192:8192 + sizes[5]], v[local_ranges[5][1]:][:sizes[5]])


def test_bad_lists_and_indices_raise_typed_exceptions(pair):
    a, b, pb, pa = pair
    src = a.register(np.zeros(8192, np.uint8), "src")
    b.register(np.zeros(8192, np.uint8), "dst")
    rs = pb.wait_segment("dst", timeout_s=10)
    with pytest.raises(gdr.OutOfSegment):
        gdr.LocalList([(src, 4096, 8192)])
    with pytest.raises(gdr.InvalidArgument, match="empty"):
        gdr.LocalList([(src, 0, 0)])
    with pytest.raises(gdr.InvalidArgument, match="not a Segment"):
        gdr.LocalList([(rs, 0, 10)])
    with pytest.raises(gdr.InvalidArgument, match="not 3"):
        gdr.LocalList([(src, 0)])
    with pytest.raises(gdr.UnknownSegment):
        gdr.RemoteList(pb, [(9999, 0, 10)])
    with pytest.raises(gdr.OutOfSegment):
        gdr.RemoteList(pb, [(rs, 8000, 400)])
    local = gdr.LocalList([(src, 0, 100), (src, 100, 200)])
    remote = gdr.RemoteList(pb, [(rs, 0, 100), (rs, 4096, 300)])
    with pytest.raises(gdr.IndexOutOfRange):
        pb.transfer_indexed("write", local, [2], remote, [0])
    with pytest.raises(gdr.IndexOutOfRange):
        pb.transfer_indexed("write", local, [0], remote, [5])
    with pytest.raises(gdr.LengthMismatch):
        pb.transfer_indexed("write", local, [1], remote, [1])  # 200 bytes against 300
    with pytest.raises(gdr.InvalidArgument):
        pb.transfer_indexed("write", local, [0, 1], remote, [0])
    with pytest.raises(gdr.InvalidArgument):
        pb.transfer_indexed("write", local, [-1], remote, [0])
    # A list prepared for one peer is refused by another: `pa` is b's view of a.
    with pytest.raises(gdr.InvalidArgument):
        pa.transfer_indexed("write", local, [0], remote, [0])
    # Nothing was posted by any of them: a good one still works.
    pb.transfer_indexed("write", local, [0], remote, [0]).wait(WAIT)


def test_extreme_offsets_lengths_indices_and_a_vanished_segment(pair):
    a, b, pb, pa = pair
    U64 = 2**64 - 1
    src = a.register(np.arange(8192, dtype=np.uint8) % 251, "src")
    dst_arr = np.zeros(8192, np.uint8)
    b.register(dst_arr, "dst")
    gone_arr = np.zeros(4096, np.uint8)
    gone = b.register(gone_arr, "gone")
    rs = pb.wait_segment("dst", timeout_s=10)
    rg = pb.wait_segment("gone", timeout_s=10)
    # Offsets and lengths at u64::MAX overflow no sum: refused as outside the segment.
    for off, n in ((U64, 2), (0, U64), (U64, U64), (1, U64)):
        with pytest.raises(gdr.OutOfSegment):
            gdr.LocalList([(src, off, n)])
        with pytest.raises(gdr.OutOfSegment):
            gdr.RemoteList(pb, [(rs, off, n)])
    # Past u64: not an offset at all.
    with pytest.raises(gdr.InvalidArgument):
        gdr.LocalList([(src, 2**64, 1)])
    with pytest.raises(gdr.InvalidArgument):
        gdr.RemoteList(pb, [(2**32, 0, 1)])
    local = gdr.LocalList([(src, 0, 4096), (src, 4096, 4096)])
    remote = gdr.RemoteList(pb, [(rs, 0, 4096), (rg, 0, 4096), (rs, 4096, 4096)])
    # Indices past u32 are not indices; the last valid u32 is out of range.
    with pytest.raises(gdr.InvalidArgument):
        pb.transfer_indexed("write", local, [2**32], remote, [0])
    with pytest.raises(gdr.IndexOutOfRange):
        pb.transfer_indexed("write", local, [2**32 - 1], remote, [0])
    # The peer removes a segment a prepared list names: only a transfer naming it fails, and
    # it fails before anything is posted; the others go on.
    b.deregister(gone)
    assert eventually(lambda: pb.segment("gone") is None)
    with pytest.raises(gdr.UnknownSegment):
        pb.transfer_indexed("write", local, [0], remote, [1])
    # Two threads moving by index through the same prepared lists at once.
    errors = []

    def move(li, ri):
        try:
            for _ in range(20):
                pb.transfer_indexed("write", local, [li], remote, [ri]).wait(WAIT)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=move, args=(0, 0)), threading.Thread(target=move, args=(1, 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    want = (np.arange(8192, dtype=np.uint8) % 251)
    assert np.array_equal(dst_arr, want), "both threads' entries landed"
    assert not gone_arr.any(), "nothing reached the removed segment"
