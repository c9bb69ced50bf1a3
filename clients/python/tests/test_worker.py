"""The worker kit against the real server: it polls external children, runs the handler,
heartbeats while it runs, completes, retries a completion whose reply was lost, and stops."""

from __future__ import annotations

import threading
import time
from typing import Dict, List

import httpx
import pytest

from brood_client import Client, ExternalRunner, Task, Worker, WorkItem

from helpers import Server, envelope, unique


def delegate_external(client: Client, session_id: str, queue: str, goals: List[str]) -> str:
    tasks = [Task(goal, ExternalRunner(queue=queue)) for goal in goals]
    return client.delegate(session_id, tasks, independent_completions=True).call_id


def results(client: Client, session_id: str, count: int) -> Dict[str, tuple]:
    """Every result of the session, acked: child id → (status, summary, error)."""
    got: Dict[str, tuple] = {}
    while len(got) < count:
        env = envelope(client, session_id)
        for item in env.items:
            assert item.child_id not in got, f"{item.child_id} was delivered twice"
            got[item.child_id] = (item.status, item.summary, item.error)
        client.ack(env.claim_id)
    return got


def shortest_lease_ms(client: Client) -> int:
    """The shortest worker lease the server grants, as its OpenAPI document states it."""
    return int(client.openapi()["components"]["schemas"]["PollBody"]["properties"]["lease_ms"]["minimum"])


def test_the_kit_completes_external_children_with_the_handlers_answer(client: Client, session_id: str) -> None:
    queue = unique("q")
    call_id = delegate_external(client, session_id, queue, ["abc", "hello"])
    worker = Worker(client, "w1", queue, wait_ms=1_000)

    @worker.handler
    def reverse(item: WorkItem) -> str:
        return item.goal[::-1]

    assert worker.run(max_items=2) == 2
    assert results(client, session_id, 2) == {
        f"{call_id}.0": ("succeeded", "cba", None),
        f"{call_id}.1": ("succeeded", "olleh", None),
    }


def test_a_handler_that_raises_fails_its_child(client: Client, session_id: str) -> None:
    queue = unique("q")
    call_id = delegate_external(client, session_id, queue, ["explode"])

    def explode(item: WorkItem) -> None:
        raise RuntimeError(f"cannot {item.goal}")

    assert Worker(client, "w1", queue, handler=explode, wait_ms=1_000).run(max_items=1) == 1
    status, _, error = results(client, session_id, 1)[f"{call_id}.0"]
    assert status == "failed"
    assert error == "RuntimeError: cannot explode"


def test_a_completion_the_server_refuses_fails_the_child_saying_why(client: Client, session_id: str) -> None:
    queue = unique("q")
    call_id = delegate_external(client, session_id, queue, ["huge"])
    worker = Worker(client, "w1", queue, handler=lambda item: {"blob": "x" * (2 << 20)}, wait_ms=1_000)
    assert worker.run(max_items=1) == 1
    status, _, error = results(client, session_id, 1)[f"{call_id}.0"]
    assert status == "failed"
    assert error.startswith("the worker's completion was refused: ")


def test_heartbeats_keep_a_slow_handler_past_its_lease(client: Client, session_id: str) -> None:
    queue = unique("q")
    call_id = delegate_external(client, session_id, queue, ["slow"])
    lease_ms = shortest_lease_ms(client)
    others: List[object] = []

    def slow(item: WorkItem) -> str:
        # Three leases long: without heartbeats the child would go back to the queue, where
        # another worker's poll would get it, and this completion would be refused.
        deadline = time.monotonic() + 3 * lease_ms / 1000
        while time.monotonic() < deadline:
            others.append(client.poll_work("w2", queue=queue, wait_ms=500))
        return "slow but kept"

    worker = Worker(client, "w1", queue, handler=slow, lease_ms=lease_ms, wait_ms=1_000)
    item = client.poll_work("w1", queue=queue, wait_ms=5_000, lease_ms=lease_ms)
    assert item is not None and item.lease_ms == lease_ms
    completion = worker.handle(item)
    assert completion is not None and completion.status == "succeeded"
    assert others and all(o is None for o in others), "the child stayed with its worker"
    assert results(client, session_id, 1) == {f"{call_id}.0": ("succeeded", "slow but kept", None)}


def test_stop_lets_the_current_child_finish_and_takes_no_other(client: Client, session_id: str) -> None:
    queue = unique("q")
    call_id = delegate_external(client, session_id, queue, ["first", "second"])
    started = threading.Event()

    def handler(item: WorkItem) -> str:
        started.set()
        time.sleep(0.5)
        return f"did {item.goal}"

    worker = Worker(client, "w1", queue, handler=handler, wait_ms=1_000)
    handled: List[int] = []
    runner = threading.Thread(target=lambda: handled.append(worker.run()))
    runner.start()
    assert started.wait(10)
    worker.stop()
    runner.join(10)
    assert not runner.is_alive() and handled == [1]
    assert results(client, session_id, 1) == {f"{call_id}.0": ("succeeded", "did first", None)}
    left = client.poll_work("w2", queue=queue, wait_ms=1_000)
    assert left is not None and left.child_id == f"{call_id}.1", "the second child was not taken"


def test_stop_ends_an_idle_worker_within_its_poll_wait(client: Client) -> None:
    worker = Worker(client, "w1", unique("q"), handler=lambda item: None, wait_ms=500)
    runner = threading.Thread(target=worker.run)
    runner.start()
    time.sleep(0.2)
    stopped_at = time.monotonic()
    worker.stop()
    runner.join(5)
    assert not runner.is_alive()
    assert time.monotonic() - stopped_at < 2


class LoseFirstCompletion(httpx.HTTPTransport):
    """A transport that delivers the first completion to the server and then loses its reply."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.url.path.endswith("/complete") and self.lost == 0:
            response.read()
            response.close()
            self.lost += 1
            raise httpx.ReadError("the reply was lost", request=request)
        return response


def test_a_completion_whose_reply_was_lost_is_sent_again_and_recorded_once(server: Server, session_id: str) -> None:
    transport = LoseFirstCompletion()
    with server.client(transport=transport) as c:
        queue = unique("q")
        call_id = delegate_external(c, session_id, queue, ["once"])
        worker = Worker(c, "w1", queue, handler=lambda item: "done once", wait_ms=1_000)
        assert worker.run(max_items=1) == 1
        assert transport.lost == 1
        assert results(c, session_id, 1) == {f"{call_id}.0": ("succeeded", "done once", None)}


def test_a_child_cancelled_under_its_handler_is_given_up(
    client: Client, session_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue = unique("q")
    call_id = delegate_external(client, session_id, queue, ["doomed"])

    def cancel_myself(item: WorkItem) -> str:
        client.cancel_child(item.child_id, reason="no longer wanted")
        return "too late"

    worker = Worker(client, "w1", queue, handler=cancel_myself, wait_ms=1_000)
    item = client.poll_work("w1", queue=queue, wait_ms=5_000)
    assert item is not None
    assert worker.handle(item) is None
    assert any("gave up" in r.getMessage() and "child_ended" in r.getMessage() for r in caplog.records)
    assert results(client, session_id, 1)[f"{call_id}.0"][0] == "cancelled"
