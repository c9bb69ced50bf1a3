"""The API's additions: task input and output, attempts and retry policies, idempotent
delegates, bounded envelopes, ``/readyz``. A server that predates one refuses its field (400
``invalid_request``) or its endpoint (404), and the tests of it fail."""

from __future__ import annotations

import time
from typing import List

import pytest

from brood_client import (
    ChildEvent,
    Client,
    Conflict,
    Done,
    ExternalRunner,
    InvalidRequest,
    RetryPolicy,
    SimRunner,
    Task,
    Worker,
    WorkItem,
)

from helpers import envelope, unique


def test_a_worker_is_handed_the_tasks_input_and_where_it_comes_from(client: Client, session_id: str) -> None:
    queue = unique("q")
    before = int(time.time() * 1000)
    call = client.delegate(session_id, [Task("sum", ExternalRunner(queue=queue), input={"xs": [1, 2, 3]},
                                             timeout_ms=60_000)])
    item = client.poll_work("w1", queue=queue, wait_ms=5_000)
    assert item is not None
    assert item.input == {"xs": [1, 2, 3]}
    assert (item.session_id, item.call_id, item.attempt) == (session_id, call.call_id, 1)
    assert item.deadline_at is not None and before + 60_000 <= item.deadline_at <= int(time.time() * 1000) + 60_000
    client.complete(item.child_id, item.token, "succeeded")


def test_a_workers_output_comes_back_in_the_result_the_call_and_the_event(client: Client, session_id: str) -> None:
    queue = unique("q")
    call = client.delegate(session_id, [Task("sum", ExternalRunner(queue=queue), input={"xs": [1, 2, 3]})])
    worker = Worker(client, "w1", queue, wait_ms=1_000)

    @worker.handler
    def total(item: WorkItem) -> Done:
        return Done(summary="summed", output={"total": sum(item.input["xs"])})

    with client.events(session_id, read_timeout=20) as stream:
        assert worker.run(max_items=1) == 1
        ended = next(e for e in stream if isinstance(e.data, ChildEvent) and e.data.status == "succeeded")
    assert (ended.data.output, ended.data.attempts) == ({"total": 6}, 1)
    env = envelope(client, session_id)
    assert [(i.summary, i.output, i.attempts) for i in env.items] == [("summed", {"total": 6}, 1)]
    client.ack(env.claim_id)
    (child,) = client.get_call(call.call_id).children
    assert (child.output, child.attempts) == ({"total": 6}, 1)


def test_an_input_over_the_limit_is_refused_naming_it(client: Client, session_id: str) -> None:
    client.delegate(session_id, [Task("small", SimRunner(), input="x" * 1000)])
    with pytest.raises(InvalidRequest) as caught:
        client.delegate(session_id, [Task("big", SimRunner(), input="x" * (1 << 20))])
    assert "tasks[0].input" in caught.value.message


def test_a_retried_child_says_how_many_attempts_it_took(client: Client, session_id: str) -> None:
    retry = RetryPolicy(max_attempts=3, backoff_ms=0)
    client.delegate(session_id, [Task("flaky", SimRunner(outcome="fail"), retry=retry)])
    env = envelope(client, session_id)
    assert [(i.status, i.attempts) for i in env.items] == [("failed", 3)]
    client.ack(env.claim_id)


def test_a_worker_sees_the_attempt_of_a_retried_child(client: Client, session_id: str) -> None:
    queue = unique("q")
    client.delegate(session_id, [Task("twice", ExternalRunner(queue=queue), retry=RetryPolicy(max_attempts=2))])
    attempts: List[int] = []

    def fail_first(item: WorkItem) -> str:
        attempts.append(item.attempt)
        if item.attempt == 1:
            raise RuntimeError("first attempt fails")
        return "second attempt"

    assert Worker(client, "w1", queue, handler=fail_first, wait_ms=5_000).run(max_items=2) == 2
    assert attempts == [1, 2]
    env = envelope(client, session_id)
    assert [(i.status, i.summary, i.attempts) for i in env.items] == [("succeeded", "second attempt", 2)]
    client.ack(env.claim_id)


def test_a_repeated_delegate_with_its_idempotency_key_answers_the_first_call(client: Client, session_id: str) -> None:
    tasks = [Task("once", SimRunner())]
    first = client.delegate(session_id, tasks, idempotency_key="k-1")
    again = client.delegate(session_id, tasks, idempotency_key="k-1")
    by_header = client.delegate(session_id, tasks, idempotency_header="k-1")
    assert again.call_id == first.call_id == by_header.call_id
    env = envelope(client, session_id)
    assert [i.call_id for i in env.items] == [first.call_id], "one call was made"
    client.ack(env.claim_id)


def test_an_idempotency_key_used_with_another_body_is_409(client: Client, session_id: str) -> None:
    client.delegate(session_id, [Task("one", SimRunner())], idempotency_key="k-2")
    with pytest.raises(Conflict) as caught:
        client.delegate(session_id, [Task("another", SimRunner())], idempotency_key="k-2")
    assert (caught.value.status, caught.value.code) == (409, "idempotency_conflict")


def test_the_body_key_wins_over_the_header(client: Client, session_id: str) -> None:
    first = client.delegate(session_id, [Task("one", SimRunner())], idempotency_key="a", idempotency_header="b")
    again = client.delegate(session_id, [Task("one", SimRunner())], idempotency_header="a")
    assert again.call_id == first.call_id
    other = client.delegate(session_id, [Task("one", SimRunner())], idempotency_header="b")
    assert other.call_id != first.call_id


def test_a_bounded_envelope_leaves_the_rest_ready(client: Client, session_id: str) -> None:
    client.delegate(session_id, [Task(f"t{i}", SimRunner()) for i in range(3)], independent_completions=True)
    deadline = time.monotonic() + 20
    while client.get_session(session_id).counts.ready < 3:
        assert time.monotonic() < deadline, "the three results did not get ready"
        time.sleep(0.02)
    first = client.boundary(session_id, "py-test", max_items=2)
    assert first is not None and (len(first.items), first.more) == (2, True)
    client.ack(first.claim_id)
    tiny = client.boundary(session_id, "py-test", max_bytes=1)
    assert tiny is not None and (len(tiny.items), tiny.more) == (1, False), "at least one item is handed out"
    client.ack(tiny.claim_id)


def test_a_boundary_acks_the_claim_it_names_before_it_claims(client: Client, session_id: str) -> None:
    client.delegate(session_id, [Task(f"t{i}", SimRunner()) for i in range(2)], independent_completions=True)
    deadline = time.monotonic() + 20
    while client.get_session(session_id).counts.ready < 2:
        assert time.monotonic() < deadline, "the two results did not get ready"
        time.sleep(0.02)
    first = client.boundary(session_id, "py-test", max_items=1)
    assert first is not None
    second = client.boundary(session_id, "py-test", ack=first.claim_id)
    assert second is not None and len(second.items) == 1
    assert client.ack(first.claim_id).delivered == 1, "the first claim was acked by the boundary"
    assert client.boundary(session_id, "py-test", ack=second.claim_id) is None
    assert client.get_session(session_id).counts.delivered == 2


def test_readyz_says_the_server_admits_work(client: Client) -> None:
    assert client.readyz().status
