"""Tests of brood_client against a running `brood serve` (unittest, standard library only).

The server is named by the environment: ``BROOD_URL`` (a server without a key, required), and
optionally ``BROOD_KEYED_URL`` with ``BROOD_API_KEY`` (a server started with ``--api-key``).
tests/python_client.rs starts both and runs this file:

    BROOD_URL=http://127.0.0.1:7070 python3 clients/python/test_brood_client.py -v
"""

from __future__ import annotations

import os
import sys
import time
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from brood_client import BroodClient, BroodError, Envelope, external, parse_events, sim  # noqa: E402

URL = os.environ.get("BROOD_URL")
KEYED_URL = os.environ.get("BROOD_KEYED_URL")
API_KEY = os.environ.get("BROOD_API_KEY")


def session_name(test: unittest.TestCase) -> str:
    """A session id of the test's own, fresh on every run against a long-lived server."""
    return f"py-{test.id().rsplit('.', 1)[-1]}-{os.getpid()}-{int(time.time() * 1000)}"


def envelope(client: BroodClient, session_id: str, lease_ms: int = 30_000) -> Envelope:
    """Boundaries until one answers an envelope (at most 20 s)."""
    deadline = time.monotonic() + 20
    while True:
        env = client.boundary(session_id, consumer="py-test", lease_ms=lease_ms)
        if env is not None:
            return env
        if time.monotonic() > deadline:
            raise AssertionError(f"no envelope for {session_id} in 20 s")
        time.sleep(0.02)


class ServerTest(unittest.TestCase):
    client: BroodClient

    @classmethod
    def setUpClass(cls) -> None:
        if not URL:
            raise RuntimeError("BROOD_URL is not set: start `brood serve` and name it in BROOD_URL")
        cls.client = BroodClient(URL, timeout=10)

    def open(self, addressable: bool = True) -> str:
        session_id = session_name(self)
        reply = self.client.put_session(session_id, addressable=addressable)
        self.assertEqual(reply["session_id"], session_id)
        self.assertEqual(reply["turn"], "idle")
        return session_id

    def assertError(self, error: BroodError, status: int, code: str) -> None:  # noqa: N802
        self.assertEqual((error.status, error.code), (status, code), repr(error))
        self.assertTrue(error.message, "an error carries a message")


class ErrorShapes(ServerTest):
    def test_empty_tasks_is_400_invalid_request(self) -> None:
        session_id = self.open()
        with self.assertRaises(BroodError) as caught:
            self.client.delegate(session_id, [])
        self.assertError(caught.exception, 400, "invalid_request")
        self.assertIn("tasks", caught.exception.message)

    def test_a_missing_field_is_400_invalid_request(self) -> None:
        session_id = self.open()
        with self.assertRaises(BroodError) as caught:
            self.client.delegate(session_id, [{"goal": "no runner"}])
        self.assertError(caught.exception, 400, "invalid_request")

    def test_an_unknown_session_is_404_unknown_session(self) -> None:
        with self.assertRaises(BroodError) as caught:
            self.client.delegate("py-nobody-" + session_name(self), [{"goal": "g", "runner": sim()}])
        self.assertError(caught.exception, 404, "unknown_session")

    def test_an_unknown_claim_is_404_unknown_claim(self) -> None:
        with self.assertRaises(BroodError) as caught:
            self.client.ack("clm_nope")
        self.assertError(caught.exception, 404, "unknown_claim")

    def test_events_of_an_unknown_session_are_404_unknown_session(self) -> None:
        with self.assertRaises(BroodError) as caught:
            next(self.client.events("py-nobody-" + session_name(self), timeout=5))
        self.assertError(caught.exception, 404, "unknown_session")

    def test_an_endpoint_the_server_lacks_raises_404_not_found(self) -> None:
        with self.assertRaises(BroodError) as caught:
            self.client._json("GET", "/v1/no-such-endpoint")
        self.assertError(caught.exception, 404, "not_found")

    def test_no_server_raises_connection_failed(self) -> None:
        with self.assertRaises(BroodError) as caught:
            BroodClient("http://127.0.0.1:9", timeout=2).healthz()
        self.assertEqual((caught.exception.status, caught.exception.code), (0, "connection_failed"))


class Claims(ServerTest):
    def test_delegate_boundary_ack_round_trip(self) -> None:
        session_id = self.open()
        self.assertIsNone(self.client.boundary(session_id, consumer="py-test"), "nothing ready: 204 is None")
        reply = self.client.delegate(
            session_id, [{"goal": "a", "runner": sim(ms=0)}, {"goal": "b", "runner": sim(ms=10, summary="done b")}]
        )
        self.assertEqual(reply["mode"], "background")
        self.assertTrue(reply["call_id"].startswith("deleg_"), reply)
        env = envelope(self.client, session_id)
        items = env["items"]
        self.assertEqual([i["child_id"] for i in items], [f"{reply['call_id']}.0", f"{reply['call_id']}.1"])
        self.assertEqual({i["status"] for i in items}, {"succeeded"})
        self.assertIn(f"[set {reply['set']} · 1/2]", env["text"])
        self.assertEqual(self.client.ack(env["claim_id"])["delivered"], 2)
        self.assertEqual(self.client.ack(env["claim_id"])["delivered"], 2, "acking again answers the same")
        self.assertIsNone(self.client.boundary(session_id, consumer="py-test"))
        self.assertEqual(self.client.get_session(session_id)["counts"]["delivered"], 2)

    def test_the_event_stream_tells_the_children_and_the_claim(self) -> None:
        session_id = self.open()
        stream = self.client.events(session_id, timeout=20)
        first = next(stream)
        self.assertEqual((first.event, first.json()["ready"]), ("ready", 0))
        reply = self.client.delegate(session_id, [{"goal": "a", "runner": sim(ms=0)}])
        child = f"{reply['call_id']}.0"
        statuses = []
        for event in stream:
            data = event.json()
            if event.event == "child" and data["child_id"] == child:
                statuses.append(data["status"])
            if event.event == "ready" and data["ready"] == 1:
                break
        self.assertEqual(statuses, ["queued", "running", "succeeded"])
        env = envelope(self.client, session_id)
        claimed = next(e for e in stream if e.event == "claim")
        self.assertEqual(claimed.json()["claim_id"], env["claim_id"])
        self.assertEqual(claimed.json()["change"], "claimed")

    def test_a_busy_release_makes_the_items_ready_again_without_an_attempt(self) -> None:
        session_id = self.open()
        self.client.delegate(session_id, [{"goal": "a", "runner": sim()}])
        first = envelope(self.client, session_id)
        self.client.release(first["claim_id"], "busy")
        with self.assertRaises(BroodError) as caught:
            self.client.ack(first["claim_id"])
        self.assertError(caught.exception, 409, "claim_lost")
        again = envelope(self.client, session_id)
        self.assertEqual(again["items"][0]["dedup_key"], first["items"][0]["dedup_key"])
        self.assertEqual(again["items"][0]["delivery_attempt"], 1, "busy is not a delivery attempt")
        self.assertEqual(self.client.ack(again["claim_id"])["delivered"], 1)

    def test_a_session_that_cannot_be_woken_runs_its_calls_synchronously(self) -> None:
        session_id = session_name(self)
        self.client.put_session(session_id)
        reply = self.client.delegate(session_id, [{"goal": "a", "runner": sim()}])
        self.assertEqual(reply["mode"], "sync")
        self.assertTrue(reply["forced_sync_reason"])
        self.assertEqual(reply["results"][0]["status"], "succeeded")


class Workers(ServerTest):
    def test_a_worker_polls_heartbeats_and_completes_an_external_child(self) -> None:
        session_id = self.open()
        queue = f"py-{session_id}"
        reply = self.client.delegate(session_id, [{"goal": "render", "runner": external(queue=queue)}])
        work = self.client.poll_work("py-worker", queue=queue, wait_ms=20_000, lease_ms=5_000)
        assert work is not None, "the child was queued, so the poll hands it out"
        self.assertEqual((work["child_id"], work["goal"], work["lease_ms"]), (f"{reply['call_id']}.0", "render", 5_000))
        self.assertEqual(self.client.heartbeat(work["child_id"], work["token"], progress="half")["lease_ms"], 5_000)
        with self.assertRaises(BroodError) as caught:
            self.client.heartbeat(work["child_id"], "wtk_not-the-token")
        self.assertError(caught.exception, 409, "stale_token")
        self.client.complete(work["child_id"], work["token"], "succeeded", summary="rendered")
        env = envelope(self.client, session_id)
        self.assertEqual([(i["status"], i["summary"]) for i in env["items"]], [("succeeded", "rendered")])
        self.client.ack(env["claim_id"])
        self.assertIsNone(self.client.poll_work("py-worker", queue=queue), "nothing left: 204 is None")

    def test_an_unknown_child_is_404_unknown_child(self) -> None:
        with self.assertRaises(BroodError) as caught:
            self.client.complete("deleg_nope.0", "wtk_x", "failed", error="e")
        self.assertError(caught.exception, 404, "unknown_child")


class Auth(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        if not (KEYED_URL and API_KEY):
            raise unittest.SkipTest("BROOD_KEYED_URL and BROOD_API_KEY are not set")

    def test_a_wrong_key_is_401_unauthorized(self) -> None:
        assert KEYED_URL is not None and API_KEY is not None
        for key in (None, API_KEY + "x"):
            with self.subTest(key=key):
                with self.assertRaises(BroodError) as caught:
                    BroodClient(KEYED_URL, api_key=key, timeout=10).put_session("py-keyed")
                self.assertEqual((caught.exception.status, caught.exception.code), (401, "unauthorized"))

    def test_the_right_key_is_let_in(self) -> None:
        assert KEYED_URL is not None
        reply = BroodClient(KEYED_URL, api_key=API_KEY, timeout=10).put_session("py-keyed", addressable=True)
        self.assertTrue(reply["wake_capable"])


class EventParsing(unittest.TestCase):
    def test_events_split_on_blank_lines_and_join_their_data_lines(self) -> None:
        stream = [
            ": a comment\n",
            "event: ready\n",
            'data: {"ready": 2}\n',
            "\n",
            "id: 7\r\n",
            "event: child\r\n",
            "data: line one\r\n",
            "data:line two\r\n",
            "\r\n",
            "data: unnamed, unterminated\n",
        ]
        events = list(parse_events(iter(stream)))
        self.assertEqual([e.event for e in events], ["ready", "child", "message"])
        self.assertEqual(events[0].json(), {"ready": 2})
        self.assertEqual(events[1].data, "line one\nline two")
        self.assertEqual(events[1].id, "7")
        self.assertEqual(events[2].data, "unnamed, unterminated")

    def test_an_event_without_data_is_not_dispatched(self) -> None:
        self.assertEqual(list(parse_events(iter(["event: ping\n", "\n"]))), [])


if __name__ == "__main__":
    unittest.main()
