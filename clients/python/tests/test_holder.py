"""Following the holder hint (``follow_holder=True``): two ``brood serve`` processes sharing one
PostgreSQL database, a session served by ``a``, and a client whose base URL is ``b``. Following
the hint, the session's requests go to ``a`` once an answer named it, and ``b`` sends none on;
not following it, ``b`` sends every one on. A named process that does not answer sends the
request to the base URL again. The databases come from ``BROOD_TEST_PG_DATABASES`` (see
:func:`helpers.database`)."""

from __future__ import annotations

import asyncio
import time
from typing import Iterator

import httpx
import pytest

from brood_client import AsyncClient, Client, SimRunner, Task, Unavailable
from brood_client._holder import HOLDER, Holders, address, claim_session, session_of

from helpers import KEY, Cluster, Server, envelope, unique

#: Requests ``b`` sent on to the holder and answered with its answer.
RELAYED = 'brood_requests_forwarded_total{outcome="relayed"}'
#: Reads of one session a process answered (itself, or for a process that sent them on).
READS = 'brood_http_requests_total{route="/v1/sessions/{session_id}",method="GET",status="200"}'
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    yield c
    c.stop()


def held_by(node: Server, through: Server, name: str) -> str:
    """A fresh session opened through ``node`` (so served by it), whose answers through
    ``through`` name ``node`` as its holder. A second one is opened through ``through``, so the
    two processes keep holding as many sessions each and neither hands one over to even them
    out."""
    sid = unique(name)
    with node.client(timeout=10) as c:
        c.put_session(sid, addressable=True)
    with through.client(timeout=10) as c:
        c.put_session(unique(f"{name}-ballast"))
    reply = httpx.get(f"{through.url}/v1/sessions/{sid}", headers=AUTH, timeout=10)
    assert reply.status_code == 200, reply.text
    assert reply.headers.get(HOLDER) == node.url, dict(reply.headers)
    return sid


def following(node: Server, follow: bool) -> Client:
    return Client(node.url, api_key=KEY, timeout=10, follow_holder=follow)


def test_a_client_following_the_hint_sends_the_sessions_requests_to_its_holder(cluster: Cluster) -> None:
    a, b = cluster.a, cluster.b
    sid = held_by(a, b, "follow")
    relayed = b.metric(RELAYED)
    with following(b, True) as brood:
        assert brood.get_session(sid).session_id == sid
        assert b.metric(RELAYED) == relayed + 1, "the first request went through b"
        reads = a.metric(READS)
        for _ in range(5):
            assert brood.get_session(sid).session_id == sid
        brood.delegate(sid, [Task("t", SimRunner(ms=5))])
        env = envelope(brood, sid)  # type: ignore[arg-type]
        assert brood.ack(env.claim_id).delivered == 1
        assert brood.get_session(sid).counts.ready == 0
        assert a.metric(READS) >= reads + 6, "a answered every read"
    assert b.metric(RELAYED) == relayed + 1, "after an answer named a, b sent no request on"


def test_a_client_not_following_the_hint_has_every_request_sent_on(cluster: Cluster) -> None:
    a, b = cluster.a, cluster.b
    sid = held_by(a, b, "stay")
    relayed = b.metric(RELAYED)
    with following(b, False) as brood:
        for _ in range(5):
            assert brood.get_session(sid).session_id == sid
    assert b.metric(RELAYED) == relayed + 5, "b sent each request on to a"


def test_the_async_client_follows_the_hint(cluster: Cluster) -> None:
    a, b = cluster.a, cluster.b
    sid = held_by(a, b, "follow-async")
    relayed = b.metric(RELAYED)

    async def main() -> None:
        async with AsyncClient(b.url, api_key=KEY, timeout=10, follow_holder=True) as brood:
            for _ in range(5):
                assert (await brood.get_session(sid)).session_id == sid
            await brood.delegate(sid, [Task("t", SimRunner(ms=5))])
            for _ in range(1000):
                env = await brood.boundary(sid, "py-async")
                if env is not None:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError(f"no envelope for {sid} in 20 s")
            await brood.ack(env.claim_id)

    asyncio.run(main())
    assert b.metric(RELAYED) == relayed + 1, "only the first request went through b"


def test_a_holder_that_does_not_answer_sends_the_request_to_the_base_url() -> None:
    cluster = Cluster()
    try:
        a, b = cluster.a, cluster.b
        sid = held_by(a, b, "gone")
        with following(b, True) as brood:
            assert brood.get_session(sid).session_id == sid
            assert brood._holders is not None and len(brood._holders) == 1
            a.kill()
            # Each request first tries a, which refuses the connection, then goes to b: it
            # answers 503 while a's tenure of the session lasts, then serves it. No request
            # fails for want of a connection.
            deadline = time.monotonic() + 60
            refused = 0
            while True:
                try:
                    assert brood.get_session(sid).session_id == sid
                    break
                except Unavailable:
                    refused += 1
                    assert time.monotonic() < deadline, f"b did not take the session over in 60 s ({refused} 503s)"
                    time.sleep(0.05)
            # b serves the session now, and names itself.
            relayed = b.metric(RELAYED)
            assert brood.get_session(sid).session_id == sid
            assert b.metric(RELAYED) == relayed
            assert brood._holders.url(f"/v1/sessions/{sid}") == f"{b.url}/v1/sessions/{sid}"
    finally:
        cluster.stop()


def test_the_async_client_sends_the_request_to_the_base_url_when_the_holder_does_not_answer() -> None:
    cluster = Cluster()
    try:
        a, b = cluster.a, cluster.b
        sid = held_by(a, b, "gone-async")

        async def main() -> None:
            async with AsyncClient(b.url, api_key=KEY, timeout=10, follow_holder=True) as brood:
                assert (await brood.get_session(sid)).session_id == sid
                a.kill()
                deadline = time.monotonic() + 60
                while True:
                    try:
                        assert (await brood.get_session(sid)).session_id == sid
                        return
                    except Unavailable:
                        assert time.monotonic() < deadline, "b did not take the session over in 60 s"
                        await asyncio.sleep(0.05)

        asyncio.run(main())
    finally:
        cluster.stop()


def test_a_hint_of_a_closed_port_is_forgotten_and_the_base_url_answers(server: Server) -> None:
    """One process: the client is told a holder on a port nothing listens on; the request goes
    to the base URL, and the answer (naming no holder) leaves nothing remembered."""
    sid = unique("closed")
    with server.client(timeout=10, follow_holder=True) as brood:
        brood.put_session(sid)
        closed = httpx.Response(200, headers={HOLDER: "http://127.0.0.1:9"})
        assert brood._holders is not None
        brood._holders.learn(f"/v1/sessions/{sid}", closed)
        assert brood._holders.url(f"/v1/sessions/{sid}") == f"http://127.0.0.1:9/v1/sessions/{sid}"
        assert brood.get_session(sid).session_id == sid
        assert brood._holders.url(f"/v1/sessions/{sid}") is None


def test_what_the_hint_names_and_what_it_is_about() -> None:
    assert session_of("/v1/sessions/chat-1") == "chat-1"
    assert session_of("/v1/sessions/a%2Fb/boundary") == "a/b"
    assert session_of("/v1/sessions") is None
    assert session_of("/v1/calls/deleg_1") is None
    claim = "clm_" + "chat-1".encode().hex() + "_0123"
    assert claim_session(claim) == "chat-1"
    assert session_of(f"/v1/claims/{claim}/ack") == "chat-1"
    assert claim_session("clm_zz_1") is None and claim_session("other") is None
    assert address("http://10.0.0.7:4100") == "http://10.0.0.7:4100"
    assert address("https://b.example/") == "https://b.example"
    for bad in (None, "", "ftp://b:1", "b:4100", "http://", "http://b/x", "http://u:p@b", "javascript:x"):
        assert address(bad) is None, bad

    holders = Holders()
    path = f"/v1/claims/{claim}/release"
    holders.learn("/v1/sessions/chat-1", httpx.Response(200, headers={HOLDER: "http://b:1"}))
    assert holders.url(path) == f"http://b:1{path}", "a claim goes where its session is"
    holders.learn("/v1/sessions/chat-1", httpx.Response(503, headers={HOLDER: "http://b:1"}))
    assert holders.url(path) is None, "a 503 forgets the holder"
    holders.learn(path, httpx.Response(200, headers={HOLDER: "ftp://b:1"}))
    assert holders.url(path) is None, "only http and https are followed"
