"""The fixtures of the tests: servers started from ``BROOD_BIN``, clients, fresh sessions."""

from __future__ import annotations

from typing import Iterator

import pytest

from brood_client import Client

from helpers import KEY, Server, unique


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """A server without a key, shared by the tests (each uses sessions of its own)."""
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def keyed_server() -> Iterator[Server]:
    """A server started with ``--api-key``."""
    s = Server(key=KEY)
    yield s
    s.stop()


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with server.client(timeout=10) as c:
        yield c


@pytest.fixture
def session_id(request: pytest.FixtureRequest, client: Client) -> str:
    """A fresh wake-capable session of the test's own (its calls run in the background)."""
    sid = unique(request.node.name)
    client.put_session(sid, addressable=True)
    return sid
