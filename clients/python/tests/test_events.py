"""A session's event stream, typed: from the real server, and the decoder on its own."""

from __future__ import annotations

from typing import List, Optional

import pytest

from brood_client import (
    ChildEvent,
    ClaimEvent,
    Client,
    ConnectionFailed,
    DroppedEvent,
    Event,
    NotFound,
    ReadyEvent,
    SimRunner,
    Task,
)
from brood_client.events import SseDecoder

from helpers import Server, envelope, unique


def test_the_stream_tells_a_delegated_call_ready(client: Client, session_id: str) -> None:
    with client.events(session_id, read_timeout=20) as stream:
        first = next(stream)
        assert (first.name, first.data, first.seq, first.session_id) == ("ready", ReadyEvent(ready=0), 0, session_id)
        call = client.delegate(session_id, [Task("a", SimRunner(ms=20))])
        child = f"{call.call_id}.0"
        statuses: List[str] = []
        for event in stream:
            if isinstance(event.data, ChildEvent) and event.data.child_id == child:
                statuses.append(event.data.status)
            if event.name == "ready" and event.data.ready == 1:
                break
        assert statuses == ["queued", "running", "succeeded"]
        env = envelope(client, session_id)
        claimed = next(e for e in stream if e.name == "claim")
        assert isinstance(claimed.data, ClaimEvent)
        assert (claimed.data.claim_id, claimed.data.change, claimed.data.items) == (env.claim_id, "claimed", 1)
        assert claimed.seq is not None and claimed.id == str(claimed.seq)


def test_the_stream_of_an_unknown_session_is_refused_when_opened(client: Client) -> None:
    with pytest.raises(NotFound) as caught, client.events(unique("nobody")):
        pass
    assert caught.value.code == "unknown_session"


def test_a_silent_stream_times_out_as_connection_failed(client: Client, session_id: str) -> None:
    stream = client.events(session_id, read_timeout=0.5)
    assert next(stream).name == "ready"
    with pytest.raises(ConnectionFailed) as caught:
        next(stream)
    assert caught.value.code == "timeout"
    stream.close()


def test_the_stream_ends_when_the_server_stops() -> None:
    server = Server()
    try:
        with server.client() as c:
            sid = unique("stopping")
            c.put_session(sid, addressable=True)
            stream = c.events(sid, read_timeout=20)
            assert next(stream).name == "ready"
            server.terminate()
            assert list(stream) == [], "the stream ends, and the caller reconnects"
    finally:
        server.stop()


def decode(lines: List[str]) -> List[Event]:
    decoder = SseDecoder()
    events: List[Optional[Event]] = [decoder.feed(line) for line in lines]
    return [e for e in events if e is not None]


def test_the_decoder_reads_named_events_and_skips_comments() -> None:
    events = decode([
        ": keep-alive",
        "",
        "id: 4",
        "event: child",
        'data: {"session_id": "s", "seq": 4, "at": 9, "child_id": "c.0", "call_id": "c",'
        ' "task_index": 0, "status": "running", "new_field": 1}',
        "",
    ])
    assert len(events) == 1
    event = events[0]
    assert (event.name, event.id, event.session_id, event.seq, event.at) == ("child", "4", "s", 4, 9)
    assert event.data == ChildEvent(child_id="c.0", call_id="c", task_index=0, status="running")
    assert dict(event.data.extra) == {"new_field": 1}


def test_the_decoder_joins_data_lines_of_an_unknown_event_as_json() -> None:
    (event,) = decode(["event: novel", 'data: {"a":', "data: 1}", ""])
    assert (event.name, event.data) == ("novel", {"a": 1})


def test_a_dropped_event_says_how_many_were_missed() -> None:
    ready, dropped = decode(["id: 7", "event: ready", 'data: {"ready": 1}', "",
                             "event: dropped", 'data: {"reason":"lagged","missed":12}', ""])
    assert (ready.id, ready.data) == ("7", ReadyEvent(ready=1))
    assert dropped.data == DroppedEvent(reason="lagged", missed=12)
    assert dropped.id is None, "dropped is sent without an id"


def test_an_event_cut_off_by_the_end_of_the_stream_is_not_dispatched() -> None:
    assert decode(["event: ready", 'data: {"ready": 1}']) == []
