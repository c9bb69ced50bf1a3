"""What the tests share: the real ``brood serve`` (the binary named by ``BROOD_BIN``, on a free
loopback port over a temporary data folder), fresh names, and waiting for an envelope."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Optional

import httpx
import pytest

from brood_client import AsyncClient, Client, Envelope

KEY = "py-s3cret"


class Server:
    """A running ``brood serve``; :meth:`stop` ends it."""

    def __init__(self, key: Optional[str] = None) -> None:
        binary = os.environ.get("BROOD_BIN")
        if not binary:
            pytest.fail("BROOD_BIN is not set: name the brood binary to test against "
                        "(e.g. BROOD_BIN=target/debug/brood)", pytrace=False)
        if not Path(binary).is_file():
            pytest.fail(f"BROOD_BIN is {binary!r}, which is not a file", pytrace=False)
        self.key = key
        self._data = tempfile.TemporaryDirectory(prefix="brood-py-")
        self._log = open(Path(self._data.name) / "server.log", "w+b")  # noqa: SIM115 (closed by stop())
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        args = [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(Path(self._data.name) / "data")]
        if key is not None:
            args += ["--api-key", key]
        # Configured by its flags alone: brood refuses a BROOD_ variable it does not read
        # (BROOD_BIN among them), and BROOD_API_KEY would give it a key.
        env = {k: v for k, v in os.environ.items() if not k.startswith("BROOD_")}
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self._log, env=env)
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"brood serve exited ({self.process.returncode}) before it answered:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        pytest.fail(f"brood serve did not answer /healthz in 30 s:\n{self.log()}")

    def log(self) -> str:
        """What the server wrote to stderr."""
        self._log.seek(0)
        return self._log.read().decode("utf-8", errors="replace")

    def client(self, **options: object) -> Client:
        """A client of this server, with its key."""
        return Client(self.url, api_key=self.key, **options)  # type: ignore[arg-type]

    def async_client(self, **options: object) -> AsyncClient:
        """An asyncio client of this server, with its key."""
        return AsyncClient(self.url, api_key=self.key, **options)  # type: ignore[arg-type]

    def terminate(self) -> int:
        """SIGTERM; answers the exit status."""
        self.process.terminate()
        return self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()
        self._data.cleanup()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unique(name: str) -> str:
    """A session id (or queue name) made from ``name``, fresh on every run."""
    return f"{re.sub(r'[^A-Za-z0-9_-]', '-', name)[:80]}-{uuid.uuid4().hex[:8]}"


def envelope(client: Client, session_id: str, within: float = 20.0, **boundary: object) -> Envelope:
    """Boundaries until one answers an envelope (within ``within`` seconds)."""
    deadline = time.monotonic() + within
    while True:
        env = client.boundary(session_id, "py-test", **boundary)  # type: ignore[arg-type]
        if env is not None:
            return env
        assert time.monotonic() < deadline, f"no envelope for {session_id} in {within} s"
        time.sleep(0.02)
