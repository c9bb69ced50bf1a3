"""Refusals and failures reach the caller as BroodError with the server's status, code, message."""

from __future__ import annotations

import pytest

from brood_client import (
    Client,
    ConnectionFailed,
    InvalidRequest,
    NotFound,
    SimRunner,
    Task,
    Unauthorized,
)

from helpers import KEY, Server, unique


def test_an_empty_task_list_is_400_invalid_request_naming_tasks(client: Client, session_id: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        client.delegate(session_id, [])
    assert (caught.value.status, caught.value.code) == (400, "invalid_request")
    assert "tasks" in caught.value.message


def test_a_task_without_a_runner_is_400_invalid_request(client: Client, session_id: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        client.delegate(session_id, [{"goal": "no runner"}])
    assert caught.value.code == "invalid_request"
    assert "runner" in caught.value.message


def test_an_unknown_session_is_404_unknown_session(client: Client) -> None:
    nobody = unique("nobody")
    with pytest.raises(NotFound) as caught:
        client.delegate(nobody, [Task("g", SimRunner())])
    assert (caught.value.status, caught.value.code) == (404, "unknown_session")
    with pytest.raises(NotFound) as caught:
        client.get_session(nobody)
    assert caught.value.code == "unknown_session"
    assert caught.value.message


def test_an_unknown_claim_is_404_unknown_claim(client: Client) -> None:
    with pytest.raises(NotFound) as caught:
        client.ack("clm_nope")
    assert caught.value.code == "unknown_claim"


def test_a_keyed_server_refuses_no_key_and_a_wrong_key_with_401(keyed_server: Server) -> None:
    for key in (None, KEY + "x"):
        with Client(keyed_server.url, api_key=key) as c:
            with pytest.raises(Unauthorized) as caught:
                c.put_session(unique("keyed"))
            assert (caught.value.status, caught.value.code) == (401, "unauthorized")
            assert caught.value.message


def test_a_keyed_server_lets_its_key_in(keyed_server: Server) -> None:
    with keyed_server.client() as c:
        assert c.put_session(unique("keyed"), addressable=True).wake_capable


def test_no_server_raises_connection_failed() -> None:
    with Client("http://127.0.0.1:9", timeout=2) as c, pytest.raises(ConnectionFailed) as caught:
        c.healthz()
    assert (caught.value.status, caught.value.code) == (0, "connection_failed")
