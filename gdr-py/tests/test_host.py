"""Host tests: no RDMA device needed. The exception hierarchy, the mapping of every variant of
the engine's error to its class and attributes, argument checks that come before any device is
opened, and the package's shape (stubs, abi3)."""

import ast
import builtins
import gc
import pathlib

import pytest

import gdr
from gdr import _errors, _gdr

# Every class the engine's variants map to, with the attributes its sample must carry and the
# built-in exception it must also be.
VARIANTS = {
    "InvalidArgument": ({"what": "len 0"}, ValueError),
    "TooLarge": ({"what": "segment name", "length": 65, "max": 64}, ValueError),
    "OutOfSegment": (
        {"index": 2, "side": "remote", "segment": 7, "offset": 4000, "length": 200, "segment_len": 4096},
        ValueError,
    ),
    "UnknownSegment": ({"owner": "peer-b", "segment": 7}, LookupError),
    "ForeignSegment": ({"index": 0, "segment": 7}, ValueError),
    "ForeignObject": (
        {"call": "Agent::register_within", "kind": "segment", "segment": 7, "peer": None},
        ValueError,
    ),
    "Cancelled": ({"peer": "peer-b"}, None),
    "Rejected": ({"peer": "peer-b", "detail": "a transfer without runs and without a notification"}, None),
    "LengthMismatch": ({"index": 1, "local_len": 10, "remote_len": 20}, ValueError),
    "IndexOutOfRange": ({"list": "local blocks", "index": 9, "length": 4}, IndexError),
    "BlockOutOfSegment": (
        {"pool": 0, "side": "local", "block": 9, "segment": 7, "block_len": 4096, "segment_len": 16384},
        ValueError,
    ),
    "UnknownPeer": ({"name": "nobody"}, LookupError),
    "PeerLost": (
        {"peer": "peer-b", "reason": "disconnected by this agent", "why": "disconnected"},
        ConnectionError,
    ),
    "ProtocolError": ({"peer": "10.0.0.2:7000", "detail": "bad kind"}, None),
    "Timeout": ({"what": "waiting", "after_s": 0.25}, TimeoutError),
    "SliceFailed": ({"peer": "peer-b", "qp_num": 0x11, "vendor_err": 0x88}, None),
    "NoRail": (
        {"peer": "peer-b", "detail": "rail 0 Paused: the peer did not answer the renewal"},
        None,
    ),
    "AgentClosed": ({}, None),
    "StagingFailed": ({"peer": "peer-b", "detail": "copy failed"}, None),
    "DirectoryError": ({"op": "put", "key": "/gdr/a", "detail": "unavailable"}, None),
    "NameTaken": (
        {"call": "Agent::publish", "name": "svc", "key": "/gdr-xfer/agents/svc/endpoint", "holder_lease": 0x1234},
        None,
    ),
    "IoError": ({"what": "listening on 10.0.0.1:1", "errno": 98}, OSError),
    "RdmaError": ({"errno": 12}, None),
    "DeviceNotFound": ({"wanted": "mlx5_9", "available": ["rxe0"]}, None),
    "Unsupported": ({"what": "dma-buf"}, None),
    "NotGpuMemory": ({"address": 0x7F0000001000, "kind": "pageable-host"}, ValueError),
}


def test_every_class_is_a_gdr_error_and_exported():
    for name in _errors.__all__:
        cls = getattr(gdr, name)
        assert cls is getattr(_errors, name)
        assert issubclass(cls, gdr.GdrError), name
        assert cls.__doc__, f"{name} has no docstring"
    assert set(_errors.__all__) <= set(gdr.__all__)


def test_hierarchy_mirrors_the_concepts():
    for sub in (gdr.TooLarge, gdr.OutOfSegment, gdr.BlockOutOfSegment, gdr.LengthMismatch, gdr.NotPlainData,
                gdr.IndexOutOfRange, gdr.ForeignSegment, gdr.ForeignObject, gdr.NotABuffer, gdr.ReadOnlyBuffer,
                gdr.NotContiguous):
        assert issubclass(sub, gdr.InvalidArgument)
        assert issubclass(sub, ValueError)
    assert issubclass(gdr.NotABuffer, TypeError)
    assert issubclass(gdr.ForeignSegment, gdr.ForeignObject)
    assert issubclass(gdr.DeviceNotFound, gdr.RdmaError)
    assert issubclass(gdr.Unsupported, gdr.RdmaError)
    assert not issubclass(gdr.PeerLost, gdr.InvalidArgument)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_variant_maps_to_its_class_with_its_fields(name):
    attrs, builtin = VARIANTS[name]
    e = _gdr._error_for_test(name)
    assert type(e) is getattr(gdr, name), type(e)
    assert isinstance(e, gdr.GdrError)
    if builtin is not None:
        assert isinstance(e, builtin)
    for k, v in attrs.items():
        assert getattr(e, k) == v, (name, k, getattr(e, k))
    assert str(e), "a message"
    if name not in ("Cancelled", "LengthMismatch", "IndexOutOfRange", "AgentClosed", "IoError"):
        assert e.hint, f"{name} carries its hint"
    with pytest.raises(getattr(gdr, name)):
        raise e


def test_every_variant_class_is_covered():
    # Binding-only classes (raised before the engine sees the input) and the base.
    binding = {"GdrError", "NotABuffer", "ReadOnlyBuffer", "NotContiguous", "NotPlainData"}
    assert set(_errors.__all__) - binding == set(VARIANTS)
    assert _gdr._error_for_test("NoSuchVariant") is None


def test_agent_arguments_are_checked_before_any_device_is_opened():
    with pytest.raises(gdr.InvalidArgument, match="agent name"):
        gdr.Agent("")
    with pytest.raises(gdr.InvalidArgument, match="agent name"):
        gdr.Agent("n" * 65)
    with pytest.raises(gdr.InvalidArgument, match="connect_timeout_s"):
        gdr.Agent("a", connect_timeout_s=float("nan"))
    with pytest.raises(gdr.InvalidArgument, match="default_timeout_s"):
        gdr.Agent("a", default_timeout_s=-1)
    with pytest.raises(gdr.InvalidArgument, match="qps_per_peer"):
        gdr.Agent("a", qps_per_peer=1000)
    with pytest.raises(gdr.InvalidArgument, match="gid_index"):
        gdr.Agent("a", gid_index=-1)
    with pytest.raises(gdr.InvalidArgument, match="queue pairs"):
        gdr.Agent("a", qps_per_peer=0)


def test_a_missing_device_is_a_typed_error():
    # On this host there is no RDMA stack at all (RdmaError) or no such device (DeviceNotFound).
    with pytest.raises(gdr.RdmaError) as e:
        gdr.Agent("a", device="no-such-device-9")
    assert e.value.hint


def test_the_stub_declares_what_the_module_has():
    stub = pathlib.Path(gdr.__file__).with_name("_gdr.pyi")
    tree = ast.parse(stub.read_text())
    declared = {
        n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))
    } | {
        t.id
        for n in tree.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        for t in [n.target]
    }
    public = {n for n in dir(_gdr) if not n.startswith("__") or n == "__version__"}
    assert public <= declared, public - declared
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for name, node in classes.items():
        if not hasattr(_gdr, name):
            continue
        cls = getattr(_gdr, name)
        stubbed = {m.name for m in node.body if isinstance(m, ast.FunctionDef)}
        real = {m for m in dir(cls) if not m.startswith("_")}
        assert real <= stubbed, (name, real - stubbed)
        assert cls.__doc__, f"{name} has no docstring"
        for m in real:
            assert getattr(cls, m).__doc__, f"{name}.{m} has no docstring"


def test_the_module_is_built_for_the_stable_abi():
    assert _gdr.__file__.endswith(".abi3.so"), _gdr.__file__
    assert gdr.__version__


def test_release_counters_are_consistent():
    gc.collect()
    s = _gdr._release_stats()
    assert set(s) == {"exported", "handed_back", "released", "leaked"}
    assert s["released"] + s["leaked"] <= s["handed_back"] <= s["exported"]


def test_no_name_shadows_a_builtin():
    for name in gdr.__all__:
        assert not hasattr(builtins, name), name


def test_stubtest_finds_the_stubs_exact(tmp_path):
    """mypy's stubtest compares the stubs with the module at run time (signatures, defaults,
    classes, __all__). `cargo xtask py-test` installs mypy; without it this test says so."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (cargo xtask py-test installs it)")
    p = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "gdr"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Success" in p.stdout, p.stdout


def test_the_asyncio_resolver_sets_once_and_leaves_a_cancelled_future_alone():
    import asyncio

    from gdr import _aio

    async def main():
        loop = asyncio.get_running_loop()
        ok, err, end, cancelled = (loop.create_future() for _ in range(4))
        _aio._resolve(ok, True, {"bytes": 1})
        _aio._resolve(err, False, gdr.Cancelled("x"))
        _aio._resolve(end, None, None)
        cancelled.cancel()
        _aio._resolve(cancelled, True, None)
        _aio._resolve(ok, True, "ignored: already done")
        assert await ok == {"bytes": 1}
        with pytest.raises(gdr.Cancelled):
            await err
        with pytest.raises(StopAsyncIteration):
            await end
        return cancelled.cancelled()

    assert asyncio.run(main())


def test_a_notification_step_takes_its_notification_itself_after_waking():
    # The step's coroutine takes the notification in the awaiting task: a task cancelled while
    # it waits (or after the wake-up, before it runs) has taken nothing.
    import asyncio

    from gdr import _aio

    class Stream:
        def __init__(self):
            self.queue, self.taken, self.fut = [], [], None

        def _take(self):
            if self.queue:
                self.taken.append(self.queue.pop(0))
                return self.taken[-1]
            return None

        def _ready(self):
            self.fut = asyncio.get_running_loop().create_future()
            return self.fut

    async def main():
        s = Stream()
        task = asyncio.ensure_future(_aio._next_notification(s))
        await asyncio.sleep(0)
        s.queue.append("n1")
        s.fut.set_result(None)  # woken ...
        task.cancel()  # ... and cancelled before it ran again
        with pytest.raises(asyncio.CancelledError):
            await task
        assert s.queue == ["n1"] and s.taken == [], "the cancelled step took nothing"
        # The next step takes it.
        return await _aio._next_notification(s)

    assert asyncio.run(main()) == "n1"
