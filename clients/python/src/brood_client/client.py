"""The blocking client, :class:`Client`: one method per endpoint of brood's HTTP API.

Every method sends one request and answers the reply as a model of :mod:`brood_client.models`
(``None`` where the API answers 204: a boundary with nothing ready, a poll that got no work).
Every failure raises a :class:`~brood_client.BroodError` (see :mod:`brood_client.errors`).
:class:`brood_client.AsyncClient` has the same methods, as coroutines.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, TypeVar, Union

import httpx

from . import _endpoints as ep
from . import models
from ._holder import Holders, resend_at_base
from .events import EventStream

__all__ = ["Client", "DEFAULT_URL", "DEFAULT_TIMEOUT", "EVENTS_READ_TIMEOUT"]

T = TypeVar("T")

#: Where ``brood serve`` listens by default.
DEFAULT_URL = "http://127.0.0.1:7070"
#: Seconds to connect, send, and read a reply (a long poll adds its ``wait_ms``).
DEFAULT_TIMEOUT = 30.0
#: Seconds an event stream may be silent (its keep-alives come every 15 s).
EVENTS_READ_TIMEOUT = 60.0

TimeoutLike = Union[float, httpx.Timeout, None]


def http_options(
    base_url: str, api_key: Optional[str], timeout: TimeoutLike, headers: Optional[Mapping[str, str]]
) -> Dict[str, Any]:
    """The options both clients give their httpx client."""
    sent = {"Accept": "application/json", "User-Agent": "brood-client-python"}
    if api_key is not None:
        sent["Authorization"] = f"Bearer {api_key}"
    sent.update(headers or {})
    return {"base_url": base_url.rstrip("/"), "headers": sent, "timeout": httpx.Timeout(timeout)}


def events_timeout(base: httpx.Timeout, read: Optional[float]) -> httpx.Timeout:
    """The timeouts of an event stream: the client's, with ``read`` as the read timeout."""
    return httpx.Timeout(connect=base.connect, read=read, write=base.write, pool=base.pool)


class Client:
    """A blocking client of one brood server, on an :class:`httpx.Client`.

    ``base_url`` is the server's root; ``api_key``, when given, is sent as
    ``Authorization: Bearer <key>``; ``timeout`` (seconds, or an :class:`httpx.Timeout`) bounds
    each request (a long poll adds its wait; the event stream has its own read timeout);
    ``headers`` are sent with every request; ``transport`` replaces httpx's (for tests, proxies).

    ``follow_holder=True``, for several ``brood serve`` processes sharing one database: the
    client remembers, for each session, the process the last answer about it named
    (``X-Brood-Holder``) and sends that session's next requests (its claims' too) there, with
    the same headers and key, sparing each a hop between processes. After a 503, or when the
    named process cannot be reached, it forgets that and sends to ``base_url`` again (a
    request that could not connect there is sent to ``base_url`` at once). Off by default: a
    client behind a load balancer may not reach the processes' own addresses.

    Use it as a context manager, or call :meth:`close`, to release its connections::

        with Client("http://127.0.0.1:7070") as brood:
            brood.put_session("chat-1", addressable=True)
            brood.delegate("chat-1", [Task("review PR 12", SimRunner(ms=50))])
            envelope = brood.boundary("chat-1", consumer="cli")
            if envelope is not None:
                print(envelope.text)
                brood.ack(envelope.claim_id)

    It may be shared between threads.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: Optional[str] = None,
        timeout: TimeoutLike = DEFAULT_TIMEOUT,
        headers: Optional[Mapping[str, str]] = None,
        transport: Optional[httpx.BaseTransport] = None,
        follow_holder: bool = False,
    ) -> None:
        options = http_options(base_url, api_key, timeout, headers)
        self.base_url: str = options["base_url"]
        self._timeout: httpx.Timeout = options["timeout"]
        self._http = httpx.Client(transport=transport, **options)
        self._holders: Optional[Holders] = Holders() if follow_holder else None

    def __repr__(self) -> str:
        return f"Client({self.base_url!r})"

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the client's connections."""
        self._http.close()

    def _send(self, request: "ep.Request[T]") -> T:
        holders = self._holders
        hinted = holders.url(request.path) if holders is not None else None
        try:
            response = self._request(request, hinted or request.path)
        except httpx.TransportError as e:
            if holders is None or hinted is None:
                raise request.failed(e) from e
            holders.forget(request.path)
            if not resend_at_base(e):
                raise request.failed(e) from e
            try:
                response = self._request(request, request.path)
            except httpx.TransportError as e:
                raise request.failed(e) from e
        if holders is not None:
            holders.learn(request.path, response)
        return request.answer(response)

    def _request(self, request: "ep.Request[Any]", url: str) -> httpx.Response:
        return self._http.request(
            request.method,
            url,
            json=request.body,
            params=request.params,
            headers=request.headers,
            timeout=request.timeout_from(self._timeout),
        )

    # -- sessions --

    def put_session(
        self,
        session_id: str,
        *,
        wake_url: Optional[str] = None,
        addressable: Optional[bool] = None,
        max_concurrent_children: Optional[int] = None,
    ) -> models.Session:
        """``PUT /v1/sessions/{id}``: creates or updates a session. A ``wake_url`` (the server
        POSTs ``{"session_id", "ready"}`` there to wake it) or ``addressable=True`` makes it
        wake-capable, so its calls run in the background."""
        return self._send(ep.put_session(session_id, wake_url, addressable, max_concurrent_children))

    def get_session(
        self,
        session_id: str,
        *,
        delivered: Optional[bool] = None,
        after: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> models.SessionDetail:
        """``GET /v1/sessions/{id}``: the session's state. Its calls are those not yet
        delivered, or with ``delivered=True`` every stored one; ``after``/``limit`` page them."""
        return self._send(ep.get_session(session_id, delivered, after, limit))

    def list_sessions(self, *, limit: Optional[int] = None, after: Optional[str] = None) -> models.SessionPage:
        """``GET /v1/sessions``: a page of sessions in ascending id order; pass the page's
        ``next`` as ``after`` for the next one."""
        return self._send(ep.list_sessions(limit, after))

    def set_turn(self, session_id: str, state: str) -> models.TurnState:
        """``POST /v1/sessions/{id}/turn``: ``"busy"`` while the session works, ``"idle"``
        between its turns (it is woken only while idle)."""
        return self._send(ep.set_turn(session_id, state))

    # -- delegation, boundaries, claims --

    def delegate(
        self,
        session_id: str,
        tasks: Iterable[ep.TaskLike],
        *,
        mode: Optional[str] = None,
        independent_completions: Optional[bool] = None,
        idempotency_key: Optional[str] = None,
        idempotency_header: Optional[str] = None,
        traceparent: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> models.Delegation:
        """``POST /v1/sessions/{id}/delegate``: starts a child for each of ``tasks``
        (:class:`~brood_client.Task`, or the JSON object of one).

        ``mode`` is ``"background"`` (the default: results come at the session's boundaries)
        or ``"sync"`` (the reply holds the results; a session that is not wake-capable always
        runs sync). ``independent_completions=True`` makes each ungrouped task its own unit.
        ``idempotency_key`` (sent in the body) or ``idempotency_header`` (sent as the
        ``Idempotency-Key`` header) makes the delegate safe to send again: the same key and body
        answer the first call's reply; the same key with another body raises
        :class:`~brood_client.Conflict` ``idempotency_conflict``. ``traceparent`` is the W3C
        trace context carried to the children. ``timeout`` replaces the read timeout (seconds),
        for a sync call whose children take longer.
        """
        return self._send(ep.delegate(session_id, tasks, mode, independent_completions, idempotency_key,
                                      idempotency_header, traceparent, timeout))

    def get_call(self, call_id: str) -> models.Call:
        """``GET /v1/calls/{id}``: the call, its units and children (also once delivered)."""
        return self._send(ep.get_call(call_id))

    def boundary(
        self,
        session_id: str,
        consumer: str,
        *,
        lease_ms: Optional[int] = None,
        max_items: Optional[int] = None,
        max_bytes: Optional[int] = None,
        ack: Optional[str] = None,
    ) -> Optional[models.Envelope]:
        """``POST /v1/sessions/{id}/boundary``: claims what is ready as one envelope, or answers
        ``None`` when nothing is. Ack it (:meth:`ack`) or release it (:meth:`release`) within
        ``lease_ms`` (default 60000), or its items are ready again. ``max_items`` and
        ``max_bytes`` bound the envelope (at least one item is always handed out); what does
        not fit stays ready and the envelope says ``more``. ``ack`` names a claim of this
        session to ack first, in the same request; a refused ack raises its error and nothing
        is claimed."""
        return self._send(ep.boundary(session_id, consumer, lease_ms, max_items, max_bytes, ack))

    def ack(self, claim_id: str) -> models.Acked:
        """``POST /v1/claims/{id}/ack``: the claim's items were delivered. Acking again answers
        the same; a claim that expired or was released raises :class:`~brood_client.Conflict`
        ``claim_lost``."""
        return self._send(ep.ack(claim_id))

    def release(self, claim_id: str, reason: str, *, retry_after_ms: Optional[int] = None) -> models.Released:
        """``POST /v1/claims/{id}/release``: hands the items back. ``reason`` ``"busy"`` is not a
        delivery attempt; ``"failed"`` is one, and backs off. They are ready again after
        ``retry_after_ms`` at least."""
        return self._send(ep.release(claim_id, reason, retry_after_ms))

    def cancel_call(self, call_id: str, *, reason: Optional[str] = None) -> models.Cancelled:
        """``POST /v1/calls/{id}/cancel``: cancels every unfinished child of the call, nested
        descendants included."""
        return self._send(ep.cancel("calls", call_id, reason))

    def cancel_unit(self, unit_id: str, *, reason: Optional[str] = None) -> models.Cancelled:
        """``POST /v1/units/{id}/cancel``: cancels every unfinished child of the unit."""
        return self._send(ep.cancel("units", unit_id, reason))

    def cancel_child(self, child_id: str, *, reason: Optional[str] = None) -> models.Cancelled:
        """``POST /v1/children/{id}/cancel``: cancels the child and its nested descendants."""
        return self._send(ep.cancel("children", child_id, reason))

    # -- dead letters --

    def dead_letters(self, *, session_id: Optional[str] = None) -> models.DeadLetters:
        """``GET /v1/dead-letters``: items that ran out of delivery attempts (of one session)."""
        return self._send(ep.dead_letters(session_id))

    def redrive(
        self,
        *,
        child_ids: Optional[List[str]] = None,
        session_id: Optional[str] = None,
        all_: bool = False,
        limit: Optional[int] = None,
    ) -> models.Redriven:
        """``POST /v1/dead-letters/redrive``: makes dead letters ready again, chosen by exactly
        one of ``child_ids``, ``session_id`` or ``all_=True``; at most ``limit`` of them."""
        return self._send(ep.redrive(child_ids, session_id, all_, limit))

    # -- events --

    def events(self, session_id: str, *, read_timeout: Optional[float] = EVENTS_READ_TIMEOUT) -> EventStream:
        """``GET /v1/sessions/{id}/events``: the session's events, as an iterator of
        :class:`~brood_client.Event` (see :mod:`brood_client.events` for reconnecting).
        ``read_timeout`` is how long the stream may be silent (``None``: forever)."""
        path = ep.events_path(session_id)
        timeout = events_timeout(self._timeout, read_timeout)
        return EventStream(
            lambda: self._http.stream("GET", path, headers={"Accept": "text/event-stream"}, timeout=timeout),
            f"GET {path}",
        )

    # -- external workers --

    def poll_work(
        self,
        worker: str,
        *,
        queue: Optional[str] = None,
        wait_ms: Optional[int] = None,
        lease_ms: Optional[int] = None,
    ) -> Optional[models.WorkItem]:
        """``POST /v1/workers/poll``: a child of an ``external`` runner on ``queue`` to run, or
        ``None`` when none came within ``wait_ms`` (0 to 30000). Heartbeat it within
        ``lease_ms`` (1000 to 3600000, default 30000) or it goes back to the queue.
        :class:`~brood_client.Worker` does all of that for you."""
        return self._send(ep.poll_work(worker, queue, wait_ms, lease_ms))

    def heartbeat(self, child_id: str, token: str, *, progress: Optional[str] = None) -> models.Heartbeat:
        """``POST /v1/children/{id}/heartbeat``: renews the lease of a polled child. A lease that
        ran out raises :class:`~brood_client.Conflict` ``stale_token`` (the child went back to
        the queue); a child that ended, ``child_ended``."""
        return self._send(ep.heartbeat(child_id, token, progress))

    def complete(
        self,
        child_id: str,
        token: str,
        status: str,
        *,
        summary: Optional[str] = None,
        error: Optional[str] = None,
        output: Any = None,
    ) -> models.Completion:
        """``POST /v1/children/{id}/complete``: the polled child ended, ``status``
        ``"succeeded"`` (with a ``summary`` and an ``output``, any JSON value) or ``"failed"``
        (with an ``error``). Sending the same completion again answers the recorded outcome, so
        a completion whose reply was lost can be repeated; another one raises
        :class:`~brood_client.Conflict` ``child_ended``, a lease that ran out ``stale_token``."""
        return self._send(ep.complete(child_id, token, status, summary, error, output))

    def take_work(
        self,
        child_id: str,
        worker: str,
        lease_ms: int,
        *,
        take_id: Optional[str] = None,
        answer_by_ms: Optional[int] = None,
    ) -> models.WorkItem:
        """``POST /v1/workers/take``: hands out a listed child; used between processes sharing
        a ledger, not by workers (they :meth:`poll_work`). A take read after ``answer_by_ms``
        (ms since the Unix epoch on the shared database's clock) raises
        :class:`~brood_client.Conflict` ``take_expired``."""
        return self._send(ep.take_work(child_id, worker, lease_ms, take_id, answer_by_ms))

    def untake_work(self, child_id: str, take_id: str) -> None:
        """``POST /v1/workers/untake``: gives up a take; between processes sharing a ledger."""
        self._send(ep.untake_work(child_id, take_id))

    # -- operations --

    def healthz(self) -> models.Health:
        """``GET /healthz``: the server is alive (its ledger is open, its actors answer)."""
        return self._send(ep.healthz())

    def readyz(self) -> models.Health:
        """``GET /readyz``: the server admits work and its ledger answers; otherwise raises
        :class:`~brood_client.Unavailable` (``draining``, ``ledger_unavailable``)."""
        return self._send(ep.readyz())

    def openapi(self) -> Dict[str, Any]:
        """``GET /v1/openapi.json``: the OpenAPI 3.1 document of the server's API."""
        return self._send(ep.openapi())

    def metrics(self) -> str:
        """``GET /metrics``: the Prometheus text."""
        return self._send(ep.metrics())

    def ui(self) -> str:
        """``GET /ui``: the web view's HTML."""
        return self._send(ep.ui())
