"""A parent's side with the blocking client: delegate, claim at boundaries, ack, release, cancel."""

from __future__ import annotations

from typing import Dict

import pytest

from brood_client import Client, Conflict, SimRunner, Task

from helpers import envelope, unique


def test_every_result_is_delivered_exactly_once(client: Client, session_id: str) -> None:
    tasks = [Task(f"t{i}", SimRunner(ms=10 * i, summary=f"done {i}")) for i in range(5)]
    call = client.delegate(session_id, tasks, independent_completions=True)
    assert call.mode == "background"
    assert call.call_id.startswith("deleg_")
    assert [u.tasks for u in call.units] == [[i] for i in range(5)]
    seen: Dict[str, str] = {}
    while len(seen) < len(tasks):
        env = envelope(client, session_id)
        for item in env.items:
            assert item.child_id not in seen, f"{item.child_id} was delivered twice"
            seen[item.child_id] = item.summary
        assert client.ack(env.claim_id).delivered == len(env.items)
        assert client.ack(env.claim_id).delivered == len(env.items), "acking again answers the same"
    assert seen == {f"{call.call_id}.{i}": f"done {i}" for i in range(5)}
    assert client.boundary(session_id, "py-test") is None, "nothing is left to claim"
    assert client.get_session(session_id).counts.delivered == 5


def test_an_envelope_says_what_a_model_reads(client: Client, session_id: str) -> None:
    call = client.delegate(session_id, [Task("a", SimRunner()), Task("b", SimRunner(outcome="fail"))])
    env = envelope(client, session_id)
    assert f"[set {call.set} · 1/2]" in env.text
    by_index = {i.task_index: i for i in env.items}
    assert (by_index[0].status, by_index[1].status) == ("succeeded", "failed")
    assert by_index[1].error
    client.ack(env.claim_id)


def test_a_busy_release_hands_the_items_back_without_an_attempt(client: Client, session_id: str) -> None:
    client.delegate(session_id, [Task("a", SimRunner())])
    first = envelope(client, session_id)
    assert client.release(first.claim_id, "busy").released
    with pytest.raises(Conflict) as caught:
        client.ack(first.claim_id)
    assert (caught.value.status, caught.value.code) == (409, "claim_lost")
    again = envelope(client, session_id)
    assert again.items[0].dedup_key == first.items[0].dedup_key
    assert again.items[0].delivery_attempt == 1
    assert client.ack(again.claim_id).delivered == 1


def test_a_failed_release_counts_a_delivery_attempt(client: Client, session_id: str) -> None:
    client.delegate(session_id, [Task("a", SimRunner())])
    first = envelope(client, session_id)
    client.release(first.claim_id, "failed")
    again = envelope(client, session_id)
    assert again.items[0].delivery_attempt == 2
    client.ack(again.claim_id)


def test_a_session_that_cannot_be_woken_runs_its_calls_sync(client: Client) -> None:
    sid = unique("sync")
    assert not client.put_session(sid).wake_capable
    reply = client.delegate(sid, [Task("a", SimRunner(ms=5, summary="inline"))])
    assert reply.mode == "sync"
    assert reply.forced_sync_reason
    assert [(r.status, r.summary) for r in reply.results] == [("succeeded", "inline")]


def test_cancelling_a_call_ends_its_children_cancelled(client: Client, session_id: str) -> None:
    call = client.delegate(session_id, [Task("forever", SimRunner(outcome="hang"))])
    cancelled = client.cancel_call(call.call_id, reason="not needed")
    assert cancelled.cancelled == [f"{call.call_id}.0"]
    assert client.cancel_call(call.call_id).cancelled == [], "cancelling again cancels nothing"
    env = envelope(client, session_id)
    assert [i.status for i in env.items] == ["cancelled"]
    client.ack(env.claim_id)
    assert client.get_call(call.call_id).children[0].status == "cancelled"


def test_a_call_is_read_back_with_its_units_and_children(client: Client, session_id: str) -> None:
    call = client.delegate(session_id, [Task("a", SimRunner(), group="g"), Task("b", SimRunner(), group="g")])
    env = envelope(client, session_id)
    client.ack(env.claim_id)
    got = client.get_call(call.call_id)
    assert (got.call_id, got.session_id, got.mode) == (call.call_id, session_id, "background")
    assert [(u.group, u.tasks) for u in got.units] == [("g", [0, 1])]
    assert [(c.child_id, c.status, c.delivery) for c in got.children] == [
        (f"{call.call_id}.0", "succeeded", "delivered"),
        (f"{call.call_id}.1", "succeeded", "delivered"),
    ]


def test_sessions_are_listed_in_pages(client: Client) -> None:
    prefix = unique("list")
    made = [f"{prefix}-{i}" for i in range(3)]
    for sid in made:
        client.put_session(sid)
    found, after = [], None
    while True:
        page = client.list_sessions(limit=2, after=after)
        found += [s.session_id for s in page.sessions]
        if page.next is None:
            break
        after = page.next
    assert [s for s in found if s.startswith(prefix)] == made
    assert found == sorted(found)


def test_the_turn_is_set(client: Client, session_id: str) -> None:
    assert client.set_turn(session_id, "busy").turn == "busy"
    assert client.get_session(session_id).turn == "busy"
    assert client.set_turn(session_id, "idle").turn == "idle"


def test_there_are_no_dead_letters_to_redrive_on_a_quiet_session(client: Client, session_id: str) -> None:
    assert client.dead_letters(session_id=session_id).items == []
    assert client.redrive(session_id=session_id).redriven == 0


def test_the_server_describes_itself(client: Client) -> None:
    assert client.healthz().status == "ok"
    document = client.openapi()
    assert document["openapi"].startswith("3.1")
    assert "/v1/sessions/{session_id}/boundary" in document["paths"]
    assert "brood" in client.metrics()
