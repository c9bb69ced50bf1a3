"""What the client sends and how it reads replies, against a stand-in transport (no server)."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

import httpx
import pytest

from brood_client import (
    BadReply,
    BroodError,
    Client,
    Conflict,
    Envelope,
    ExternalRunner,
    RetryPolicy,
    SimRunner,
    Task,
)


def recording(reply: httpx.Response, timeout: float = 10) -> "Tuple[Client, List[httpx.Request]]":
    """A client whose every request is recorded and answered ``reply``."""
    sent: List[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return reply

    return Client("http://brood.test", api_key="k", timeout=timeout, transport=httpx.MockTransport(handle)), sent


def test_a_reply_field_the_client_does_not_know_is_kept_in_extra() -> None:
    env = Envelope.from_dict({
        "claim_id": "clm_1", "lease_expires_at": 5, "text": "t", "shiny": [1],
        "items": [{"kind": "result", "dedup_key": "d", "delivery_attempt": 1, "call_id": "c", "set": 1,
                   "unit_id": "c-1", "child_id": "c.0", "task_index": 0, "of": 1, "status": "succeeded",
                   "recovered": False, "novel": True}],
    })
    assert dict(env.extra) == {"shiny": [1]}
    assert env.items[0].child_id == "c.0"
    assert dict(env.items[0].extra) == {"novel": True}
    assert env.items[0].output is None and env.more is None, "a field the server does not send yet is None"


def test_a_reply_without_a_field_the_api_always_sends_is_refused() -> None:
    with pytest.raises(ValueError, match="claim_id"):
        Envelope.from_dict({"lease_expires_at": 5, "items": [], "text": ""})


def test_a_task_is_sent_without_its_unset_fields() -> None:
    task = Task("g", SimRunner(ms=5), input={"n": [1, 2]}, retry=RetryPolicy(max_attempts=3))
    assert task.to_dict() == {
        "goal": "g",
        "runner": {"kind": "sim", "ms": 5},
        "input": {"n": [1, 2]},
        "retry": {"max_attempts": 3},
    }
    assert Task("g", ExternalRunner()).to_dict() == {"goal": "g", "runner": {"kind": "external"}}
    assert Task("g", {"kind": "mine", "x": 1}).to_dict()["runner"] == {"kind": "mine", "x": 1}


def test_a_delegate_carries_the_key_and_the_idempotency_key() -> None:
    reply = httpx.Response(202, json={"call_id": "deleg_1", "set": 1, "mode": "background", "units": [], "note": ""})
    client, sent = recording(reply)
    client.delegate("s/1", [Task("g", SimRunner())], idempotency_key="body-key")
    client.delegate("s/1", [Task("g", SimRunner())], idempotency_header="header-key")
    body: Dict[str, Any] = json.loads(sent[0].content)
    assert sent[0].url.raw_path == b"/v1/sessions/s%2F1/delegate", "an id is one path segment"
    assert sent[0].headers["authorization"] == "Bearer k"
    assert sent[0].headers["content-type"] == "application/json"
    assert body["idempotency_key"] == "body-key" and "idempotency-key" not in sent[0].headers
    assert sent[1].headers["idempotency-key"] == "header-key"
    assert "idempotency_key" not in json.loads(sent[1].content)


def test_a_long_poll_waits_longer_than_the_read_timeout() -> None:
    client, sent = recording(httpx.Response(204), timeout=5)
    assert client.poll_work("w", wait_ms=20_000) is None
    assert sent[0].extensions["timeout"]["read"] == 25


def test_a_refusal_is_raised_with_the_servers_code_and_message() -> None:
    client, _ = recording(httpx.Response(409, json={"error": {"code": "stale_token", "message": "lease ran out"}}))
    with pytest.raises(Conflict) as caught:
        client.heartbeat("c.0", "t")
    assert (caught.value.status, caught.value.code, caught.value.message) == (409, "stale_token", "lease ran out")


def test_a_refusal_not_in_the_apis_shape_keeps_its_body_as_the_message() -> None:
    client, _ = recording(httpx.Response(502, text="bad gateway"))
    with pytest.raises(BroodError) as caught:
        client.healthz()
    assert (caught.value.status, caught.value.code, caught.value.message) == (502, "http_502", "bad gateway")


def test_a_reply_that_is_not_json_is_a_bad_reply() -> None:
    client, _ = recording(httpx.Response(200, text="<html>"))
    with pytest.raises(BadReply) as caught:
        client.get_session("s")
    assert (caught.value.status, caught.value.code) == (200, "bad_reply")
