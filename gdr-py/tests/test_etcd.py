"""Peers found by name through etcd (``gdr.Directory``, ``Agent.publish``,
``Agent.connect_named`` and ``connect_named_async``), against a real etcd server each test
starts on loopback (the ``etcd_server`` fixture, _etcd_server.py).

The ``Directory`` tests need no RDMA device; the others are marked ``device`` (the Soft-RoCE
VM). The two-process test runs the target of test_two_processes.py (_kv_target.py) published
in etcd; the initiator knows only its name."""

import asyncio
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import gdr
import _kv_target as target
from _etcd_server import free_port
from conftest import agent, connect_threads, device_under_test, wait_for
from test_two_processes import readline

device = pytest.mark.device

WAIT = 30.0


# --- host tests: the directory alone -------------------------------------------------------


def test_a_directory_holds_a_lease_on_a_real_etcd_and_closes(etcd_server):
    d = gdr.Directory(etcd_server.endpoint, prefix="/gdr-py-test/", ttl_s=3.0, timeout_s=5.0)
    assert d.endpoints == [etcd_server.endpoint]
    assert d.prefix == "/gdr-py-test/"
    assert d.ttl_s >= 3.0
    assert d.lease_id != 0
    assert d.lease_lost is None
    assert not d.closed
    assert etcd_server.endpoint in repr(d) and "lease_id=0x" in repr(d)
    # A second directory of the same process has a lease of its own; endpoints as a list.
    with gdr.Directory([etcd_server.endpoint]) as d2:
        assert d2.prefix == gdr.DEFAULT_PREFIX == "/gdr-xfer/agents/"
        assert d2.lease_id not in (0, d.lease_id)
    assert d2.closed
    d.close()
    d.close()  # again: nothing more
    assert d.closed and "closed" in repr(d)
    with pytest.raises(gdr.DirectoryError) as e:
        d.lease_lost
    assert e.value.detail == "the directory was closed"


def test_a_directory_without_etcd_raises_directory_error_within_its_timeout():
    port = free_port()  # nothing listens there
    start = time.monotonic()
    with pytest.raises(gdr.DirectoryError) as e:
        gdr.Directory(f"127.0.0.1:{port}", timeout_s=1.0)
    took = time.monotonic() - start
    assert took < 5.0, f"took {took:.1f} s for a 1 s timeout"
    assert e.value.hint, "the error says how to start etcd"
    assert isinstance(e.value, gdr.GdrError)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"endpoints": ""},
        {"endpoints": []},
        {"endpoints": 2379},
        {"endpoints": ["127.0.0.1:1", 5]},
        {"endpoints": "127.0.0.1:1", "ttl_s": -1.0},
        {"endpoints": "127.0.0.1:1", "timeout_s": float("nan")},
        {"endpoints": "127.0.0.1:1", "timeout_s": float("inf")},
        {"endpoints": "127.0.0.1:1", "prefix": "x" * 600},
    ],
)
def test_bad_directory_arguments_raise_invalid_argument_before_any_call(kwargs):
    with pytest.raises(gdr.InvalidArgument):
        gdr.Directory(**kwargs)


# --- device tests --------------------------------------------------------------------------


@device
def test_two_processes_the_initiator_finds_the_target_by_name_and_moves_bytes(etcd_server):
    device_under_test()
    host = os.environ.get("GDR_TEST_ADDR", "127.0.0.1")
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("_kv_target.py")), host,
         etcd_server.endpoint],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        me = agent("kv-initiator")
        directory = gdr.Directory(etcd_server.endpoint)
        kv = target.pattern(200, (target.SENT_BLOCKS, target.BLOCK))
        local = me.register(kv, "kv-cache")
        # Only the name: connect_named waits until the target (still starting) is published.
        start = time.monotonic()
        peer = me.connect_named(directory, "kv-target", timeout_s=120)
        found_in = time.monotonic() - start
        assert peer.name == "kv-target" and peer.is_connected
        pool = peer.wait_segment("kv-pool", timeout_s=30)
        assert pool.length == target.POOL_BLOCKS * target.BLOCK

        copy = np.zeros((target.POOL_BLOCKS, target.BLOCK), np.uint8)
        mine = me.register(copy, "pool-copy")
        peer.transfer_blocks("read", mine, range(target.POOL_BLOCKS), pool,
                             range(target.POOL_BLOCKS), target.BLOCK, timeout_s=60).wait(60)
        assert np.array_equal(copy, target.pattern(100, copy.shape)), "READ byte for byte"

        stats = peer.transfer_blocks("write", local, target.local_blocks(), pool,
                                     target.remote_blocks(), target.BLOCK, notify=b"req-1",
                                     timeout_s=60).wait(60)
        assert stats["bytes"] == target.SENT_BLOCKS * target.BLOCK
        line = readline(proc, 120)
        while line.startswith(("LISTEN", "PUBLISHED")):
            line = readline(proc, 120)
        assert line.startswith("VERIFIED"), line

        peer.transfer_blocks("read", mine, range(target.POOL_BLOCKS), pool,
                             range(target.POOL_BLOCKS), target.BLOCK).wait(60)
        assert hashlib.sha256(copy.tobytes()).hexdigest() == line.split()[-1]

        peer.send_notification(b"bye").wait(30)
        assert proc.wait(timeout=60) == 0
        # The target shut down: its records left the directory, and the peer is lost.
        wait_for(lambda: not peer.is_connected, 20, "the peer lost after the target exited")
        print(f"etcd: found kv-target by name in {found_in:.2f} s; WRITE {stats['bytes']} "
              f"bytes verified on both sides: {line}")
        me.shutdown(1.0)
        directory.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate(timeout=10)
        if proc.returncode not in (0, None):
            print(f"target exited {proc.returncode}: stdout {out!r} stderr {err!r}")


@device
def test_an_unknown_name_raises_unknown_peer_within_its_timeout(etcd_server):
    directory = gdr.Directory(etcd_server.endpoint)
    a = agent("etcd-lonely")
    try:
        start = time.monotonic()
        with pytest.raises(gdr.UnknownPeer) as e:
            a.connect_named(directory, "nobody-here", timeout_s=1.0)
        took = time.monotonic() - start
        assert 1.0 <= took < 4.0, f"UnknownPeer after {took:.2f} s for a 1 s timeout"
        assert e.value.name == "nobody-here"
        assert isinstance(e.value, LookupError) and e.value.hint

        async def main():
            t0 = time.monotonic()
            with pytest.raises(gdr.UnknownPeer) as e:
                await a.connect_named_async(directory, "nobody-here", timeout_s=1.0)
            return e.value, time.monotonic() - t0

        err, took = asyncio.run(main())
        assert err.name == "nobody-here" and 1.0 <= took < 4.0, took
        # Refused before any lookup: a name with '/', a timeout that is not finite.
        with pytest.raises(gdr.InvalidArgument):
            a.connect_named(directory, "a/b", timeout_s=1.0)
        with pytest.raises(gdr.InvalidArgument):
            a.connect_named(directory, "x", timeout_s=float("inf"))
        # Nothing is left running.
        wait_for(lambda: connect_threads() == 0, 10, "the connect threads ended")
    finally:
        a.shutdown(1.0)
        directory.close()


@device
def test_ctrl_c_interrupts_a_blocking_lookup_and_its_thread_ends_by_its_timeout(etcd_server):
    import _thread
    import threading

    directory = gdr.Directory(etcd_server.endpoint)
    a = agent("etcd-interrupted")
    try:
        # What Ctrl-C does (SIGINT's flag), 0.3 s into a lookup that would wait 3 s.
        timer = threading.Timer(0.3, _thread.interrupt_main)
        start = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            a.connect_named(directory, "never-published", timeout_s=3.0)
        took = time.monotonic() - start
        assert took < 1.5, f"KeyboardInterrupt after {took:.2f} s"
        # The engine's lookup ends by itself at its timeout: no thread stays behind.
        wait_for(lambda: connect_threads() == 0, 10, "the interrupted lookup's thread ended")
        assert a.peers() == []
    finally:
        a.shutdown(1.0)
        directory.close()


@device
def test_publish_refuses_addresses_peers_cannot_reach_and_a_second_publish(etcd_server):
    with gdr.Directory(etcd_server.endpoint) as directory:
        a = agent("etcd-pub")
        try:
            addr = a.listen("127.0.0.1:0")
            for bad in ("0.0.0.0:7100", "127.0.0.1:0", "not an address", "localhost:7100"):
                with pytest.raises(gdr.InvalidArgument):
                    a.publish(directory, bad)
            a.publish(directory, addr)
            with pytest.raises(gdr.InvalidArgument):
                a.publish(directory, addr)
        finally:
            a.shutdown(1.0)
        # A closed directory is refused with the typed error.
    b = agent("etcd-pub-2")
    try:
        with pytest.raises(gdr.DirectoryError):
            b.publish(directory, "127.0.0.1:7100")
        with pytest.raises(gdr.DirectoryError):
            b.connect_named(directory, "etcd-pub", timeout_s=1.0)
    finally:
        b.shutdown(1.0)


@device
def test_asyncio_an_agent_found_by_name_moves_bytes_and_a_cancelled_lookup_loses_nothing(
    etcd_server,
):
    """One process, three agents and one directory. ``a`` looks ``b`` up before ``b`` is
    published and cancels the await: the engine's lookup goes on, connects once ``b`` is
    published, and the peer stays (``wait_peer_async`` finds it); its thread then ends. ``c``
    finds ``b`` by name with ``await connect_named_async`` and WRITEs to it, verified byte for
    byte, the event loop turning all the while."""
    directory = gdr.Directory(etcd_server.endpoint)
    a = agent("etcd-async-a")
    b = agent("etcd-async-b")
    c = agent("etcd-async-c")
    n = 4 << 20
    src = target.pattern(31, n)
    dst = np.zeros(n, np.uint8)
    try:
        addr = b.listen("127.0.0.1:0")
        seg = c.register(src, "src")

        async def main():
            ticks = [0]

            async def ticking():
                while True:
                    await asyncio.sleep(0.001)
                    ticks[0] += 1

            ticker = asyncio.create_task(ticking())
            # Cancelled while the name is not published yet.
            early = a.connect_named_async(directory, "etcd-async-b", timeout_s=20)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(early, 0.3)
            assert early.cancelled()
            assert connect_threads() >= 1, "the engine's lookup runs on until its timeout"
            b.publish(directory, addr)
            # The cancelled lookup lost nothing: it connected a to b, and the peer stays.
            kept = await asyncio.wait_for(a.wait_peer_async("etcd-async-b"), WAIT)
            assert kept.name == "etcd-async-b" and kept.is_connected

            pb = await asyncio.wait_for(
                c.connect_named_async(directory, "etcd-async-b", timeout_s=20), WAIT)
            assert pb.name == "etcd-async-b"
            pc = await asyncio.wait_for(b.wait_peer_async("etcd-async-c"), WAIT)
            assert pc.name == "etcd-async-c"

            # The segment appears after the wait started.
            waiting = asyncio.ensure_future(pb.wait_segment_async("dst"))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            b.register(dst, "dst")
            remote = await asyncio.wait_for(waiting, WAIT)
            assert remote.name == "dst" and remote.length == n
            stats = await asyncio.wait_for(pb.write(seg, 0, remote, 0, n, timeout_s=WAIT), WAIT)
            ticker.cancel()
            return kept, pb, stats, ticks[0]

        kept, pb, stats, ticks = asyncio.run(main())
        assert stats["bytes"] == n
        assert np.array_equal(dst, src), "WRITE byte for byte"
        assert ticks >= 1, "the loop kept turning"
        wait_for(lambda: connect_threads() == 0, 25, "the cancelled lookup's thread ended")
        assert [p.name for p in a.peers()] == ["etcd-async-b"]
        # b shuts down: its records leave the directory and the peers found through it are
        # lost.
        b.shutdown(1.0)
        wait_for(lambda: not pb.is_connected and not kept.is_connected, 20,
                 "the peers lost after b shut down")
    finally:
        for x in (a, b, c):
            x.shutdown(1.0)
        directory.close()


@device
def test_a_published_name_is_not_taken_over(etcd_server):
    # Before: a second agent could publish the name of a live agent; when it left, the live
    # agent's record was gone and its clients got 'peer "svc" lost: its directory record is
    # gone'.
    with gdr.Directory(etcd_server.endpoint) as d1, gdr.Directory(etcd_server.endpoint) as d2:
        holder = agent("svc")
        client = agent("svc-client")
        try:
            holder.publish(d1, holder.listen("127.0.0.1:0"))
            seg = holder.alloc(4096, "kv")
            peer = client.connect_named(d1, "svc", timeout_s=10)
            remote = peer.wait_segment("kv", timeout_s=10)
            intruder = agent("svc")
            try:
                for directory in (d2, d1):
                    with pytest.raises(gdr.NameTaken) as e:
                        intruder.publish(directory, intruder.listen("127.0.0.1:0"))
                    assert isinstance(e.value, gdr.DirectoryError)
                    assert e.value.call == "Agent::publish" and e.value.name == "svc"
                    assert e.value.hint
            finally:
                intruder.shutdown(1.0)
            time.sleep(1.0)  # what the intruder's leaving would have deleted, it did not
            assert peer.is_connected, peer.lost_reason
            src = client.alloc(4096, "src")
            src.write(0, b"\x42" * 4096)
            peer.write(src, 0, remote, 0, 4096, timeout_s=WAIT).wait(WAIT)
            assert seg.read(0, 4096) == b"\x42" * 4096
        finally:
            holder.shutdown(1.0)
            client.shutdown(1.0)
        # Once the holder left, the name is free again.
        again = agent("svc")
        try:
            again.publish(d2, again.listen("127.0.0.1:0"))
        finally:
            again.shutdown(1.0)
