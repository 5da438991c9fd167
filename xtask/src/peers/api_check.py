"""What the drop-ins' differential tests share (nixl_api_check.py, mooncake_api_check.py): one
line per call (`step`, `forked`), the regions both sides register, the digest of blocks, and
the control connection's ends and the command line (`main`)."""

import argparse
import ctypes
import hashlib
import mmap
import os
import signal
import socket
import sys
import time

import numpy as np

BLOCK = 4096
BLOCKS = 16


def step(name, fn, *args, show=True, **kw):
    """Runs one call and prints its line; returns its value (None when it raised)."""
    try:
        v = fn(*args, **kw)
    except Exception as e:  # noqa: BLE001 - the class is the result
        print(f"step {name}: raises {type(e).__name__}", flush=True)
        print(f"  ({str(e).splitlines()[0][:160] if str(e) else ''})", file=sys.stderr, flush=True)
        return None
    shown = ""
    if show and isinstance(v, (str, bool, int)):
        shown = f" {v!r}"
    elif show and isinstance(v, (list, tuple, dict)):
        shown = f" len={len(v)}"
    print(f"step {name}: ok {type(v).__name__}{shown}", flush=True)
    return v


def forked(name, fn, *args):
    """A call that may crash the process (the original engine's use of a freed batch): run
    in a forked child, which prints its line; a child killed by a signal prints
    `step NAME: crashes SIGNAL`."""
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        step(name, fn, *args)
        sys.stdout.flush()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        print(f"step {name}: crashes {signal.Signals(os.WTERMSIG(status)).name}", flush=True)


def region(n):
    """A page-aligned anonymous region: the mmap (keep it: the address is only a promise), its
    numpy view, its address."""
    mm = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return mm, np.frombuffer(mm, dtype=np.uint8), ctypes.addressof(ctypes.c_char.from_buffer(mm))


def digest(view, blocks):
    h = hashlib.blake2b(digest_size=8)
    for b in blocks:
        h.update(view[b * BLOCK : (b + 1) * BLOCK])
    return h.hexdigest()


def dial(port):
    """The initiator's end of the control connection (the target may not listen yet)."""
    for _ in range(600):
        try:
            return socket.create_connection(("127.0.0.1", port))
        except OSError:
            time.sleep(0.1)
    return socket.create_connection(("127.0.0.1", port))


def goodbye(send, conn):
    """The initiator's last words: the target ends after them."""
    send(conn, {"bye": True})
    time.sleep(0.5)
    sys.stdout.flush()
    os._exit(0)


def main(what, impls, load, target, initiator):
    """`--impl` (the original's name or `gdr`), `--mode`, `--port`, `--device`: runs one side
    with the API module `load(impl)` returns."""
    p = argparse.ArgumentParser(description=f"one side of the {what} drop-in's differential test")
    p.add_argument("--impl", choices=impls, required=True)
    p.add_argument("--mode", choices=["target", "initiator"], required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--device", default="rxe0", help="the RDMA device (NIXL's UCX_NET_DEVICES names it for both)")
    a = p.parse_args()
    (target if a.mode == "target" else initiator)(load(a.impl), a)
