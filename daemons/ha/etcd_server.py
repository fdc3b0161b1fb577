"""A private etcd server (tests, `mooncake bench failover`): its own data dir and free ports,
optionally inside a network namespace (``prefix`` = ["ip", "netns", "exec", NS])."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from daemons.errors import ProgramMissing
from transfer.etcd.kv import EtcdKV, EtcdUnavailable


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class EtcdServer:
    def __init__(self, data_dir: Path, host: str = "127.0.0.1", client_port: int = 0,
                 prefix: list[str] | None = None) -> None:
        program = shutil.which("etcd")
        if program is None:
            raise ProgramMissing("etcd", "etcd-server")
        self.host = host
        self.port = client_port or free_port()
        peer = f"http://{host}:{client_port + 1 if client_port else free_port()}"
        client = f"http://{host}:{self.port}"
        self.process = subprocess.Popen(
            [*(prefix or []), program, "--name", "test", "--data-dir", str(data_dir),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"test={peer}", "--log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @property
    def endpoints(self) -> str:
        return f"{self.host}:{self.port}"

    def wait_ready(self, timeout: float = 15.0) -> EtcdServer:
        kv = EtcdKV(self.endpoints, timeout=0.5)
        deadline = time.monotonic() + timeout
        while True:
            try:
                kv.get("ready")
                return self
            except EtcdUnavailable:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"etcd did not start on {self.endpoints}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
