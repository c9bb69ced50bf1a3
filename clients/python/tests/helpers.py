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
from typing import Iterator, List, Optional, Sequence

import httpx
import pytest

from brood_client import AsyncClient, Client, Envelope

KEY = "py-s3cret"


class Server:
    """A running ``brood serve`` (with ``flags`` besides its own); :meth:`stop` ends it."""

    def __init__(self, key: Optional[str] = None, flags: Sequence[str] = ()) -> None:
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
        args += flags
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

    def kill(self) -> None:
        """SIGKILL: the process dies at once, as in a crash."""
        self.process.kill()
        self.process.wait(timeout=30)

    def metric(self, series: str) -> float:
        """The value of one sample of ``/metrics`` (``name{label="v"}`` as encoded); 0 when absent."""
        return metric(httpx.get(f"{self.url}/metrics", headers=self._auth(), timeout=10).text, series)

    def _auth(self) -> dict:
        return {"Authorization": f"Bearer {self.key}"} if self.key is not None else {}

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


#: The variable naming, space-separated, the empty PostgreSQL databases the tests of several
#: processes on one database use (``cargo test --test python_client`` makes them).
DATABASES = "BROOD_TEST_PG_DATABASES"

_taken: List[str] = []


def database() -> str:
    """An empty PostgreSQL database no other test of this run uses; a failure (not a skip) when
    none was given: the tests of several processes must run."""
    given = os.environ.get(DATABASES, "").split()
    if not given:
        pytest.fail(f"{DATABASES} is not set: name empty PostgreSQL databases, space-separated, for the tests "
                    "of several processes on one database (`cargo test --test python_client` makes them)",
                    pytrace=False)
    free = [d for d in given if d not in _taken]
    if not free:
        pytest.fail(f"{DATABASES} names {len(given)} databases, and every one is taken", pytrace=False)
    _taken.append(free[0])
    return free[0]


class Cluster:
    """Processes ``a`` and ``b`` of ``brood serve`` sharing one PostgreSQL database (each its
    own data folder, with the key :data:`KEY`)."""

    def __init__(self) -> None:
        url = database()
        self.nodes: List[Server] = []
        try:
            for name in ("a", "b"):
                flags = ["--ledger", url, "--node", name, "--session-lease-ms", "2000"]
                self.nodes.append(Server(key=KEY, flags=flags))
        except BaseException:
            self.stop()
            raise
        self.a, self.b = self.nodes

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __iter__(self) -> Iterator[Server]:
        return iter(self.nodes)


def metric(text: str, series: str) -> float:
    """The value of one sample in a metrics text; 0 when it is absent."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line[len(series) + 1:].split()[0])
    return 0.0


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
