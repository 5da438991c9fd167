"""A real etcd server for the tests (the Python twin of gdr-test-support's ``EtcdServer``):
Debian's ``etcd`` binary (``GDR_TEST_ETCD`` names another) on loopback, with free client and
peer ports and a data directory of its own, killed and removed afterwards."""

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

START_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def etcd_binary() -> str:
    """The etcd binary: ``GDR_TEST_ETCD``, else ``etcd`` on the PATH, else Debian's."""
    wanted = os.environ.get("GDR_TEST_ETCD")
    if wanted:
        return wanted
    return shutil.which("etcd") or "/usr/bin/etcd"


class EtcdServer:
    """One etcd member on 127.0.0.1; ``endpoint`` is its client address."""

    def __init__(self) -> None:
        self.client_port = free_port()
        self.peer_port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"gdr-py-etcd-{os.getpid()}-"))
        self.log_path = self.dir / "etcd.log"
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    etcd_binary(),
                    "--name=test",
                    f"--data-dir={self.dir / 'data'}",
                    f"--listen-client-urls={client}",
                    f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=test={peer}",
                    "--initial-cluster-state=new",
                    "--enable-pprof=false",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-16384:]
        except OSError:
            return ""

    def healthy(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.client_port), timeout=0.5) as s:
                s.settimeout(2.0)
                s.sendall(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                answer = b""
                while len(answer) < 65536:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    answer += chunk
            return b'"health":"true"' in answer
        except OSError:
            return False

    def wait_healthy(self) -> None:
        end = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"etcd exited with {self.proc.returncode} while starting; its log:\n{self.log()}"
                )
            if self.healthy():
                return
            time.sleep(0.05)
        raise RuntimeError(
            f"etcd did not answer /health at {self.endpoint} in {START_TIMEOUT_S} s:\n{self.log()}"
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


def start() -> EtcdServer:
    """A healthy etcd server (three tries: a free port may be taken meanwhile)."""
    last: Exception = RuntimeError("etcd did not start")
    for _ in range(3):
        server = EtcdServer()
        try:
            server.wait_healthy()
            return server
        except Exception as e:  # noqa: BLE001 - tried again, the last one raised
            server.stop()
            last = e
    raise last
