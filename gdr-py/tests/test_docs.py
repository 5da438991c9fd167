"""Every ``python`` code block of the guide runs.

The guide is the top-level README.md, the book (every Markdown file under ``docs/src/``) and the
crates' own READMEs: the same files, in the same order, as ``cargo xtask docs`` reads. Each
python block has a runner here, named by the block's file, the heading above it and its place
under that heading. ``test_every_python_block_has_a_runner`` (a host test) fails for a block
without a runner and for a runner whose block is gone; the runners (device tests, run in the
Soft-RoCE VM) execute the blocks as written but for the machine's names: this VM's device
instead of ``mlx5_0`` and loopback instead of the ``10.0.0.x`` hosts.
"""

import asyncio
from pathlib import Path

import pytest

import gdr
from conftest import device_under_test

ROOT = Path(__file__).resolve().parents[2]

# The crates' READMEs, as xtask/src/docs/blocks.rs lists them.
CRATE_READMES = [
    "gdr/README.md",
    "gdr-sys/README.md",
    "gdr-doctor/README.md",
    "gdr-xfer/README.md",
    "gdr-xfer-proto/README.md",
    "gdr-py/README.md",
]

device = pytest.mark.device


def guide_files() -> list:
    """README.md, the book's files (sorted), then the crates' READMEs that exist."""
    book = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs/src").rglob("*.md"))
    crates = [f for f in CRATE_READMES if (ROOT / f).exists()]
    return ["README.md"] + book + crates


def python_blocks() -> dict:
    """Every python block of the guide, by ``(file, heading, n)``: n counts the python blocks
    under that heading from 0. A block closes at a bare fence line, as xtask's parser has it."""
    found = {}
    for file in guide_files():
        heading, block, counts = "", None, {}
        for line in (ROOT / file).read_text().splitlines():
            if block is None:
                if line.startswith("```"):
                    block = [] if line[3:].strip().split(",")[0] == "python" else False
                elif line.startswith("#") and "# " in line:
                    heading = line.rstrip()
            elif line.rstrip() == "```":
                if block is not False:
                    n = counts.get(heading, 0)
                    counts[heading] = n + 1
                    found[(file, heading, n)] = "\n".join(block) + "\n"
                block = None
            elif block is not False:
                block.append(line)
    return found


def block(file: str, heading: str, n: int = 0) -> str:
    """The block at ``(file, heading, n)``; the test fails when it is not there."""
    code = python_blocks().get((file, heading, n))
    if code is None:
        pytest.fail(f"no python block {n} under {heading!r} in {file}")
    return code


def local(code: str, etcd: str = "") -> str:
    """A block with this machine's names: the device under test, loopback, the test's etcd."""
    out = (code.replace('"mlx5_0"', repr(device_under_test()))
           .replace("0.0.0.0:7100", "127.0.0.1:0")
           .replace("10.0.0.1:", "127.0.0.1:"))
    return out.replace("10.0.0.9:2379", etcd) if etcd else out


# Each block's runner, by the block's key: the test functions below.
RUNNERS = {
    ("README.md", "## A transfer in Python", 0): "test_readme_transfer",
    ("docs/src/guide/python.md", "# Python", 0): "test_book_python_directory",
    ("gdr-py/README.md", "## Use", 0): "test_py_readme_use",
    ("gdr-py/README.md", "## Peers found by name: etcd", 0): "test_py_readme_etcd_and_asyncio",
    ("gdr-py/README.md", "## asyncio", 0): "test_py_readme_etcd_and_asyncio",
    ("docs/src/guide/dropins.md", "## NIXL", 0): "test_book_dropin_nixl",
    ("docs/src/guide/dropins.md", "## Mooncake", 0): "test_book_dropin_mooncake",
}


def test_every_python_block_has_a_runner():
    found = set(python_blocks())
    assert found, "the guide has python blocks"
    missing = sorted(found - set(RUNNERS))
    gone = sorted(set(RUNNERS) - found)
    assert not missing, f"python blocks that nothing runs (add a runner to RUNNERS): {missing}"
    assert not gone, f"runners whose block is gone: {gone}"
    for name in RUNNERS.values():
        assert callable(globals().get(name)), f"RUNNERS names {name}, which is not defined"


def shutdown(*agents) -> None:
    for a in agents:
        a.shutdown(1.0)


@device
def test_readme_transfer(monkeypatch):
    """The README's program, as written, with GDR_DEVICE naming this machine's device."""
    monkeypatch.setenv("GDR_DEVICE", device_under_test())
    env: dict = {}
    exec(block("README.md", "## A transfer in Python"), env)
    assert env["note"].peer == "prefill-0"
    assert (env["pool"][512:640] == env["kv"]).all()
    assert (env["pool"][:512] == 0).all() and (env["pool"][640:] == 0).all()
    shutdown(env["prefill"], env["decode"])


@device
def test_py_readme_use():
    """gdr-py/README.md's hand-over: both sides in this process, the target on loopback."""
    code = local(block("gdr-py/README.md", "## Use"))
    # The target's listen address, handed to the initiator as the README's second process
    # would be told it.
    code = code.replace('target.listen("127.0.0.1:0")', 'addr = target.listen("127.0.0.1:0")')
    code = code.replace('agent.connect("127.0.0.1:7100")', "agent.connect(addr)")
    assert "agent.connect(addr)" in code, "the block still connects to 10.0.0.1:7100"
    env: dict = {}
    exec(code, env)
    assert "kv" not in env, "the block deletes kv during the transfer"
    assert env["note"].peer == "prefill-0" and env["note"].data == b"req-42"
    assert (env["pool"][512:640] != 0).any()
    shutdown(env["agent"], env["target"])


@device
def test_book_python_directory(etcd_server):
    """The Python chapter's etcd snippet, against a target published as its text says."""
    directory = gdr.Directory(etcd_server.endpoint)
    target = gdr.Agent("decode-0", device=device_under_test())
    try:
        target.publish(directory, target.listen("127.0.0.1:0"))
        env: dict = {}
        exec(local(block("docs/src/guide/python.md", "# Python"), etcd_server.endpoint), env)
        assert env["peer"].name == "decode-0"
        shutdown(env["agent"])
        env["directory"].close()
    finally:
        shutdown(target)
        directory.close()


@device
def test_py_readme_etcd_and_asyncio(etcd_server):
    """gdr-py/README.md's etcd example, then its asyncio waits finding the same target."""
    env: dict = {}
    exec(local(block("gdr-py/README.md", "## Peers found by name: etcd"), etcd_server.endpoint),
         env)
    assert env["peer"].name == "decode-0" and env["remote"].name == "kv-pool"

    aio: dict = {}
    exec(block("gdr-py/README.md", "## asyncio"), aio)
    other = gdr.Agent("prefill-1", device=device_under_test())
    peer, remote = asyncio.run(aio["find"](other, env["directory"]))
    assert (peer.name, remote.name) == ("decode-0", "kv-pool")
    shutdown(other, env["agent"], env["target"])
    env["directory"].close()



@device
def test_book_dropin_nixl(monkeypatch):
    """The NIXL drop-in's hand-over, as written, on this machine's device (UCX's setting)."""
    monkeypatch.setenv("UCX_NET_DEVICES", f"{device_under_test()}:1")
    env: dict = {}
    exec(block("docs/src/guide/dropins.md", "## NIXL"), env)
    assert env["name"] == b"decode-0" and (env["pool"] == env["kv"]).all()
    shutdown(env["initiator"].gdr_agent, env["target"].gdr_agent)


@device
def test_book_dropin_mooncake(monkeypatch):
    """The Mooncake drop-in's batch, as written, with GDR_DEVICE naming this machine's device."""
    monkeypatch.setenv("GDR_DEVICE", device_under_test())
    env: dict = {}
    exec(block("docs/src/guide/dropins.md", "## Mooncake"), env)
    assert env["target"].read_bytes_from_buffer(env["pool"], 5) == b"hello"
    shutdown(env["initiator"].gdr_agent, env["target"].gdr_agent)
