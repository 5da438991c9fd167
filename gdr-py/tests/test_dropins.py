"""The drop-ins' own logic, on the host (no RDMA device): memory named by address, NIXL's
descriptor lists and refusals, Mooncake's return codes before and without an engine. Their
behaviour against the real NIXL and Mooncake is `cargo xtask dropins` (the VM); their use
from two processes, the device tests below (marker `device`)."""

import ctypes
import gc
import mmap
import pickle

import numpy as np
import pytest

import gdr
from gdr import _by_address as by_address
from gdr.mooncake import TransferEngine, TransferNotify
from gdr.nixl import _descs, nixl_agent_config, nixlInvalidParamError, nixlNotFoundError, nixlRegDList, nixlXferDList
from gdr.nixl._api import nixl_agent


# -- memory named by address -----------------------------------------------------------------


def test_segment_names_carry_kind_device_address_and_length():
    name = by_address.segment_name("VRAM", 3, 0x7F00_0000_1000, 4096, 9)
    assert by_address.parse_segment_name(name) == ("VRAM", 3, 0x7F00_0000_1000, 4096)
    for other in ["", "kv-pool", "addr:DRAM:0:0x10", "addr:DRAM:x:0x10:0x10:1", "addr:DRAM:0:zz:0x10:1", "x:DRAM:0:0x1:0x1:1"]:
        assert by_address.parse_segment_name(other) is None, other


def test_the_address_map_finds_the_registration_holding_a_range():
    m = by_address.AddressMap()
    m.add("DRAM", 0, 1000, 100, "a")
    m.add("DRAM", 0, 1050, 10, "b")  # inside a: overlapping registrations
    m.add("VRAM", 1, 1000, 100, "g")
    assert m.find("DRAM", 0, 1000, 100) == ("a", 0)
    assert m.find("DRAM", 0, 1052, 8) == ("b", 2)
    assert m.find("DRAM", 0, 1055, 20) == ("a", 55)  # past b's end: only a holds it
    assert m.find("DRAM", 0, 1099, 2) is None  # one byte past a
    assert m.find("DRAM", 0, 999, 1) is None
    assert m.find("DRAM", 1, 1000, 1) is None  # another device
    assert m.find("DRAM", 0, 1000, -1) is None
    assert m.find_any(1000, 100) in (("a", 0), ("g", 0))
    assert m.starting_at(1050) == ("DRAM", 0, 10, "b")
    assert m.remove("DRAM", 0, 1050, 10) == "b"
    assert m.remove("DRAM", 0, 1050, 10) is None
    assert len(m) == 2


def test_a_peers_segment_names_cannot_widen_its_segments():
    class Seg:
        def __init__(self, id, name, length):
            self.id, self.name, self.length = id, name, length

    lying = Seg(1, by_address.segment_name("DRAM", 0, 0x10000, 1 << 30, 1), 4096)  # claims 1 GiB
    other = Seg(2, "kv-pool", 4096)  # gdr's own API: not by address
    m, seen = by_address.AddressMap(), set()
    by_address.learn_segments(m, seen, [lying, other])
    assert m.find("DRAM", 0, 0x10000, 4096) == (lying, 0)
    assert m.find("DRAM", 0, 0x10000 + 4096, 1) is None  # past its real length
    assert seen == {1} and len(m) == 1
    by_address.learn_segments(m, seen, [lying])  # known: not added twice
    assert len(m) == 1


def test_a_host_range_is_the_callers_memory_and_refuses_nonsense():
    buf = bytearray(b"abcdef")
    addr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    view = memoryview(by_address.host_range(addr + 1, 3))
    assert view.tobytes() == b"bcd" and not view.readonly
    view.release()
    for a, n in [(0, 10), (addr, 0), (addr, -1), (-5, 10), (2**64 - 1, 2)]:
        with pytest.raises(ValueError):
            by_address.host_range(a, n)
    with pytest.raises(TypeError):
        by_address.host_range(1.5, 10)


def test_an_ipv4_gid_gives_the_address_peers_reach():
    assert by_address._ipv4_of_gid("0000:0000:0000:0000:0000:ffff:0a4d:0001") == "10.77.0.1"
    assert by_address._ipv4_of_gid("fe80:0000:0000:0000:5054:00ff:fe12:3456") is None
    assert by_address._ipv4_of_gid("garbage") is None


def test_the_advertised_host_can_be_named(monkeypatch):
    monkeypatch.setenv("GDR_ADVERTISE_HOST", "10.1.2.3")
    assert by_address.advertise_host(None) == "10.1.2.3"


def test_ucx_and_gdr_settings_choose_rails_gid_and_qps(monkeypatch):
    for v in ["GDR_DEVICE", "GDR_GID_INDEX", "GDR_QPS_PER_PEER"]:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("UCX_NET_DEVICES", "all")
    monkeypatch.setenv("UCX_IB_GID_INDEX", "3")
    assert by_address.rails_from_env() == (None, 3, None)
    monkeypatch.setenv("UCX_NET_DEVICES", "eth0,no_such_dev:1")
    monkeypatch.setenv("UCX_IB_GID_INDEX", "x")
    assert by_address.rails_from_env() == (None, None, None)
    monkeypatch.setenv("GDR_DEVICE", "mlx5_0:1,mlx5_1:1")
    monkeypatch.setenv("GDR_GID_INDEX", "1")
    monkeypatch.setenv("GDR_QPS_PER_PEER", "4")
    assert by_address.rails_from_env() == ("mlx5_0:1,mlx5_1:1", 1, 4)


def test_a_device_range_exports_a_dlpack_tensor_and_gets_it_back():
    # Without CUDA the pointer checks refuse it with a typed error, after gdr took the
    # capsule: its deleter ran (nothing left exported).
    r = by_address.DeviceRange(0x7F00_0000_0000, 1 << 20, 0)
    assert r.__dlpack_device__() == (2, 0)
    before = len(by_address._EXPORTED)
    with pytest.raises(gdr.GdrError):
        gdr.inspect_memory(r)
    gc.collect()
    assert len(by_address._EXPORTED) == before
    for bad in [(0, 1, 0), (1, 0, 0), (1, 1, -1)]:
        with pytest.raises(ValueError):
            by_address.DeviceRange(*bad)


# -- NIXL ------------------------------------------------------------------------------------


def test_nixl_lists_from_every_input_form():
    rows = [(4096, 64, 0), (8192, 64, 0)]
    x = _descs.from_input(nixlXferDList, rows, "DRAM")
    assert x.descCount() == 2 and x.getType() == "DRAM" and list(x) == rows
    assert _descs.from_input(nixlXferDList, np.array(rows, dtype=np.uint64), "cpu") == x  # NIXL's alias
    r = _descs.from_input(nixlRegDList, [(4096, 64, 0, "meta")], "VRAM")
    assert r[0] == (4096, 64, 0, "meta") and r.getType() == "VRAM"
    assert _descs.from_input(nixlXferDList, x, None) is x
    assert pickle.loads(pickle.dumps(x)) == x
    strided = _descs.expand_strided(np.array([[1000, 10, 0, 100, 3]]))
    assert strided == [(1000, 10, 0), (1100, 10, 0), (1200, 10, 0)]


@pytest.mark.parametrize(
    "descs, mem_type, cls",
    [
        ([(1, 2, 0)], None, nixlInvalidParamError),  # tuples need a memory type
        ([(1, 2, 0)], "FILE", nixlNotFoundError),  # no storage backend, as NIXL's missing plugin
        ([(1, 2, 0)], "HBM", nixlInvalidParamError),
        ([(1, 2)], "DRAM", nixlInvalidParamError),
        ([("a", 2, 0)], "DRAM", nixlInvalidParamError),
        (np.zeros((2, 4)), "DRAM", nixlInvalidParamError),
        ("not descriptors", "DRAM", nixlInvalidParamError),
        (nixlRegDList("DRAM", [(1, 2, 0, "")]), None, nixlInvalidParamError),  # the wrong kind of list
    ],
)
def test_nixl_refuses_descriptors_it_cannot_mean(descs, mem_type, cls):
    with pytest.raises(cls):
        _descs.from_input(nixlXferDList, descs, mem_type)


def test_nixl_notification_messages_are_bytes_or_str():
    from gdr.nixl._api import _message

    assert _message(b"req-1") == b"req-1" and _message(bytearray(b"x")) == b"x"
    assert _message("req-1") == b"req-1"  # NIXL: "will work with str too"
    assert _message(None) == b"" and _message(memoryview(b"ab")) == b"ab"
    with pytest.raises(nixlInvalidParamError):
        _message(3.5)


def test_nixl_refuses_storage_backends_by_name():
    with pytest.raises(nixlNotFoundError, match="GDS"):
        nixl_agent("x", nixl_agent_config(backends=["GDS"]))
    with pytest.raises(nixlNotFoundError, match="POSIX"):
        nixl_agent._check_backends(["UCX", "POSIX"], "test")
    nixl_agent._check_backends(["UCX", "LIBFABRIC"], "test")


def test_nixl_without_a_device_says_so(monkeypatch):
    monkeypatch.setenv("GDR_DEVICE", "no_such_device0")
    with pytest.raises(gdr.nixl.nixlBackendError):
        nixl_agent("x")


# -- Mooncake --------------------------------------------------------------------------------


def test_mooncake_before_initialize_answers_codes_and_never_crashes():
    te = TransferEngine()
    mm = mmap.mmap(-1, 4096)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    assert te.register_memory(addr, 4096) == -1
    assert "not initialized" in str(te.last_error)
    assert te.unregister_memory(addr) == -1
    assert te.transfer_sync_write("127.0.0.1:1", addr, addr, 8) == -1
    assert te.batch_transfer_async_write("127.0.0.1:1", [addr], [addr], [8]) == 0
    assert te.get_batch_transfer_status([1, 2**63]) == -1  # Mooncake reads the id as a pointer
    assert te.transfer_check_status(7) == -1
    assert te.allocate_managed_buffer(4096) == 0
    assert te.write_bytes_to_buffer(addr, b"x", 1) == -1  # not memory of this engine
    assert te.read_bytes_from_buffer(addr, 1) == b""
    assert te.get_rpc_port() == 0 and te.get_notifies() == []
    assert te.warmup_efa_segment("x") == 0  # nothing to warm up, as Mooncake off EFA


def test_mooncake_refuses_tcp_and_a_missing_device():
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == -1
    assert "never falls back to TCP" in str(te.last_error)
    assert te.initialize("127.0.0.1", "http://meta:8080/metadata", "rdma", "") == -1
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "no_such_device0") == -1
    # DeviceNotFound where an RDMA stack is loaded (the VM), RdmaError where none is (a host).
    assert isinstance(te.last_error, gdr.RdmaError)


def test_mooncake_lists_that_differ_are_refused_before_anything():
    te = TransferEngine()
    te._agent = object()  # as if initialized: the lists are checked first
    assert te.batch_transfer_sync_write("h:1", [1, 2], [1], [8, 8]) == -1
    assert "differ in size" in str(te.last_error)
    assert te.batch_transfer_async_read("h:1", [], [], []) == 0


def test_mooncake_notifications_round_trip():
    n = TransferNotify.decode(TransferNotify("req", "done 42").encode())
    assert (n.name, n.msg) == ("req", "done 42")
    assert TransferNotify.decode(b"\xff raw").name == ""


# -- on the device: the drop-ins' rules where the originals have none ------------------------
# Two agents of this process, one queue pair each: its send queue holds 64 MiB of 256 KiB
# slices, so a 128 MiB transfer is still in flight when the call that submitted it returns.

BIG = 128 << 20


def _region(n):
    mm = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return mm, np.frombuffer(mm, dtype=np.uint8), ctypes.addressof(ctypes.c_char.from_buffer(mm))


@pytest.fixture
def nixl_pair(monkeypatch):
    from conftest import device_under_test

    monkeypatch.setenv("GDR_DEVICE", device_under_test())
    monkeypatch.setenv("GDR_QPS_PER_PEER", "1")
    target, initiator = nixl_agent("dropin-target"), nixl_agent("dropin-initiator")
    regions = [_region(BIG), _region(BIG)]
    for agent, (_, _, addr) in zip((target, initiator), regions):
        agent.register_memory([(addr, BIG, 0, "")], "DRAM")
    name = initiator.add_remote_agent(target.get_agent_metadata())
    yield target, initiator, name, regions
    initiator.gdr_agent.shutdown(1.0)
    target.gdr_agent.shutdown(1.0)


def _big_write(initiator, name, regions):
    (_, _, raddr), (_, _, laddr) = regions
    lh = initiator.prep_xfer_dlist("NIXL_INIT_AGENT", [(laddr, BIG, 0)], "DRAM")
    rh = initiator.prep_xfer_dlist(name, [(raddr, BIG, 0)], "DRAM")
    return initiator.make_prepped_xfer("WRITE", lh, [0], rh, [0])


@pytest.mark.device
def test_nixl_reposting_a_transfer_in_flight_is_refused(nixl_pair):
    # NIXL would post the same descriptors again into memory the NIC is still writing.
    target, initiator, name, regions = nixl_pair
    h = _big_write(initiator, name, regions)
    assert initiator.transfer(h) == "PROC"
    with pytest.raises(gdr.nixl.nixlRepostActiveError):
        initiator.transfer(h)
    while initiator.check_xfer_state(h) == "PROC":
        pass
    assert initiator.check_xfer_state(h) == "DONE"
    assert initiator.transfer(h) in ("PROC", "DONE")  # done: it may go again


@pytest.mark.device
def test_nixl_releasing_a_handle_in_flight_cancels_and_the_memory_goes_quiet(nixl_pair):
    # NIXL tries to abort and raises when it cannot, keeping the handle; gdr cancels, and once
    # deregister_memory returned nothing of the transfer lands any more.
    target, initiator, name, regions = nixl_pair
    (_, tview, _), (_, lview, laddr) = regions
    lview[:] = 0xAB
    h = _big_write(initiator, name, regions)
    assert initiator.transfer(h) == "PROC"
    initiator.release_xfer_handle(h)
    initiator.release_xfer_handle(h)  # twice: nothing more
    initiator.deregister_memory(initiator.get_reg_descs([(laddr, BIG, 0, "")], "DRAM"))
    landed = int(np.count_nonzero(tview == 0xAB))
    import time

    time.sleep(0.5)
    assert int(np.count_nonzero(tview == 0xAB)) == landed, "bytes landed after the memory went quiet"
    assert landed < BIG, "the transfer was not stopped"
    with pytest.raises(gdr.nixl.nixlNotFoundError):
        initiator.prep_xfer_dlist("NIXL_INIT_AGENT", [(laddr, 4096, 0)], "DRAM")


@pytest.mark.device
def test_nixl_a_transfer_to_memory_the_target_deregistered_fails_alone(nixl_pair):
    target, initiator, name, regions = nixl_pair
    (_, _, raddr), (_, _, laddr) = regions
    lh = initiator.prep_xfer_dlist("NIXL_INIT_AGENT", [(laddr, 4096, 0)], "DRAM")
    rh = initiator.prep_xfer_dlist(name, [(raddr, 4096, 0)], "DRAM")
    h = initiator.make_prepped_xfer("WRITE", lh, [0], rh, [0])
    target.deregister_memory(target.get_reg_descs([(raddr, BIG, 0, "")], "DRAM"))
    import time

    deadline = time.time() + 10
    state = "DONE"
    while time.time() < deadline and state != "ERR":
        try:
            initiator.transfer(h)
        except gdr.nixl.nixlNotFoundError:
            break  # refused at submission: the target's table says the segment is gone
        state = initiator.check_xfer_state(h)
        while state == "PROC":
            state = initiator.check_xfer_state(h)
    else:
        assert state == "ERR", "transfers into deregistered memory kept succeeding"
    # The connection is unharmed: a notification still goes through.
    initiator.send_notif(name, b"still here")
    deadline = time.time() + 10
    while time.time() < deadline and not target.check_remote_xfer_done("dropin-initiator", b"still"):
        time.sleep(0.01)
    assert time.time() < deadline


@pytest.mark.device
def test_mooncake_a_batch_whose_buffer_was_unregistered_in_flight_ends_and_nothing_crashes(monkeypatch):
    from conftest import device_under_test

    monkeypatch.setenv("GDR_QPS_PER_PEER", "1")
    dev = device_under_test()
    a, b = TransferEngine(), TransferEngine()
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", dev) == 0
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", dev) == 0
    # The mmaps stay referenced: an address is the caller's promise (a dropped mmap is
    # unmapped, and its registration fails: EFAULT, "not mapped in this process").
    (lm, _, la), (tm, _, ta) = _region(BIG), _region(BIG)
    assert a.register_memory(la, BIG) == 0 and b.register_memory(ta, BIG) == 0
    session = f"127.0.0.1:{b.get_rpc_port()}"
    bid = a.batch_transfer_async_write(session, [la], [ta], [BIG])
    assert bid > 0
    assert a.unregister_memory(la) == 0  # under the transfer: the memory stays until it is quiet
    assert a.get_batch_transfer_status([bid]) in (0, -1)
    assert a.get_batch_transfer_status([bid]) == -1  # asked again: Mooncake crashes here
    assert a.transfer_sync_write(session, la, ta, 4096) == -1  # no longer registered
    (lm2, _, la2) = _region(4096)
    assert a.register_memory(la2, 4096) == 0
    assert a.transfer_sync_write(session, la2, ta, 4096) == 0  # the engine goes on
    a.gdr_agent.shutdown(1.0)
    b.gdr_agent.shutdown(1.0)
    del lm, tm, lm2


@pytest.mark.device
def test_mooncake_through_etcd_metadata_and_a_notification(etcd_server):
    # initialize with an etcd metadata server: each engine publishes itself under its
    # local_hostname, and a batch names its target by that name. A batch with a notification:
    # the target's get_notifies has it once the batch is done.
    from conftest import device_under_test

    dev = device_under_test()
    meta = f"etcd://{etcd_server.endpoint}"
    a, b = TransferEngine(), TransferEngine()
    assert b.initialize("mc-decode-0", meta, "rdma", dev) == 0, b.last_error
    assert a.initialize("mc-prefill-0", meta, "rdma", dev) == 0, a.last_error
    (am, aview, la), (bm, bview, lb) = _region(1 << 20), _region(1 << 20)
    aview[:] = 7
    assert a.register_memory(la, 1 << 20) == 0 and b.register_memory(lb, 1 << 20) == 0
    from gdr.mooncake import TransferOpcode

    note = TransferNotify("mc-prefill-0", "req-7 done")
    assert a.batch_transfer_sync("mc-decode-0", [la, la + 4096], [lb, lb + 8192], [4096, 4096], TransferOpcode.Write, note) == 0
    assert (bview[:4096] == 7).all() and (bview[8192 : 8192 + 4096] == 7).all() and not bview[4096:8192].any()
    got = []
    import time

    deadline = time.time() + 10
    while not got and time.time() < deadline:
        got = b.get_notifies()
    assert [(n.name, n.msg) for n in got] == [("mc-prefill-0", "req-7 done")]
    assert a.get_first_buffer_address("mc-decode-0") == lb
    assert a.transfer_sync_read("nobody-here", la, lb, 8) == -1  # not published: refused
    a.gdr_agent.shutdown(1.0)
    b.gdr_agent.shutdown(1.0)
    del am, bm
