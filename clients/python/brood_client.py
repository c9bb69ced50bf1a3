"""A small typed client for brood's HTTP API, version 1 (API.md), on the standard library only.

One method of :class:`BroodClient` per endpoint of API.md. Replies are the server's JSON, typed
as :class:`typing.TypedDict` shapes (plain dicts at run time, so a field the server adds later
is kept, not dropped). Every failure — an error reply, a reply that is not JSON, a server that
cannot be reached — is raised as one exception type, :class:`BroodError`, carrying the HTTP
``status``, the API's snake_case ``code`` and its ``message``.

Example::

    from brood_client import BroodClient, sim

    brood = BroodClient("http://127.0.0.1:7070")
    brood.put_session("chat-1", addressable=True)
    brood.delegate("chat-1", [{"goal": "review PR 12", "runner": sim(ms=50)}])
    envelope = brood.boundary("chat-1", consumer="cli")
    if envelope is not None:
        print(envelope["text"])
        brood.ack(envelope["claim_id"])

Endpoints the server does not serve yet (the event stream, cancel, metrics, the OpenAPI
document, listing, redrive, the web view) answer 404 ``not_found``, which is raised like any
other error.
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Literal, Mapping, Optional, TypedDict, Union, cast

__all__ = [
    "BroodClient",
    "BroodError",
    "Event",
    "sim",
    "command",
    "external",
]

Json = Dict[str, Any]
TurnState = Literal["busy", "idle"]
ReleaseReason = Literal["busy", "failed"]
Mode = Literal["background", "sync"]


class BroodError(Exception):
    """Any failure of a request: an error reply of API.md, or no usable reply at all.

    ``status`` is the HTTP status (0 when no reply came: the server could not be reached or the
    connection broke); ``code`` is the API's snake_case code (``invalid_request``,
    ``unknown_session``, ``claim_lost``, …; ``connection_failed`` or ``bad_reply`` when the
    client made it up because the server gave none); ``message`` says what is wrong.
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status: int = status
        self.code: str = code
        self.message: str = message

    def __repr__(self) -> str:
        return f"BroodError(status={self.status!r}, code={self.code!r}, message={self.message!r})"


# --- Request shapes ---------------------------------------------------------------------------


class Task(TypedDict, total=False):
    """One task of a delegate request: ``goal`` and ``runner`` are required."""

    goal: str
    runner: Json
    group: str
    timeout_ms: int
    stall_ms: int
    rerun_on_recovery: bool


def sim(ms: int = 0, outcome: str = "ok", summary: Optional[str] = None) -> Json:
    """A ``sim`` runner: waits ``ms`` and ends with ``outcome`` (ok | fail | panic | hang)."""
    runner: Json = {"kind": "sim", "ms": ms, "outcome": outcome}
    if summary is not None:
        runner["summary"] = summary
    return runner


def command(argv: List[str], env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None) -> Json:
    """A ``command`` runner (refused with 403 unless the server allows commands)."""
    runner: Json = {"kind": "command", "argv": list(argv)}
    if env is not None:
        runner["env"] = dict(env)
    if cwd is not None:
        runner["cwd"] = cwd
    return runner


def external(queue: str = "default") -> Json:
    """An ``external`` runner: an outside worker polls ``queue`` for it."""
    return {"kind": "external", "queue": queue}


# --- Reply shapes -----------------------------------------------------------------------------


class Session(TypedDict):
    """The reply of ``PUT /v1/sessions/{id}``."""

    session_id: str
    wake_capable: bool
    turn: TurnState
    max_concurrent_children: int


class Counts(TypedDict, total=False):
    """How many of a session's items are in each state."""

    queued: int
    running: int
    ready: int
    backing_off: int
    claimed: int
    delivered: int


class SessionState(TypedDict, total=False):
    """The reply of ``GET /v1/sessions/{id}``: its turn, its counts and its calls."""

    session_id: str
    turn: TurnState
    wake_capable: bool
    max_concurrent_children: int
    counts: Counts
    calls: List[Json]


class Turn(TypedDict):
    """The reply of ``POST /v1/sessions/{id}/turn``."""

    session_id: str
    turn: TurnState


class Item(TypedDict):
    """One item of an envelope (or of a sync reply's ``results``)."""

    kind: Literal["result", "failure_notice"]
    dedup_key: str
    delivery_attempt: int
    call_id: str
    set: int
    unit_id: str
    group: Optional[str]
    child_id: str
    task_index: int
    of: int
    status: str
    summary: Optional[str]
    error: Optional[str]
    recovered: bool


class Delegation(TypedDict, total=False):
    """The reply of a delegate: 202 background (``units``, ``note``) or 200 sync (``results``)."""

    call_id: str
    set: int
    mode: Mode
    units: List[Json]
    note: str
    forced_sync_reason: Optional[str]
    results: List[Item]
    text: str


class Envelope(TypedDict):
    """A claim of everything that was ready at a boundary."""

    claim_id: str
    lease_expires_at: int
    items: List[Item]
    text: str


class Acked(TypedDict):
    """The reply of an ack."""

    delivered: int


class Work(TypedDict):
    """A child handed to an external worker by ``POST /v1/workers/poll``."""

    child_id: str
    goal: str
    token: str
    lease_ms: int


class Cancelled(TypedDict):
    """The reply of a cancel."""

    cancelled: List[str]
    already_finished: int


class DeadLetter(TypedDict, total=False):
    """An item that ran out of delivery attempts."""

    child_id: str
    session_id: str
    call_id: str
    kind: str
    reason: str
    attempts: int
    dead_at: int


class DeadLetters(TypedDict):
    """The reply of ``GET /v1/dead-letters``."""

    items: List[DeadLetter]


class SessionList(TypedDict):
    """One page of ``GET /v1/sessions``; ``next`` is the ``after`` of the next page, or None."""

    sessions: List[Json]
    next: Optional[str]


class Redriven(TypedDict):
    """The reply of ``POST /v1/dead-letters/redrive``."""

    redriven: int


@dataclass(frozen=True)
class Event:
    """One server-sent event: its ``event`` name (``message`` when none was sent), its
    ``data`` (the ``data:`` lines joined with newlines) and its ``id`` (None when none)."""

    event: str
    data: str
    id: Optional[str] = None

    def json(self) -> Any:
        """The data parsed as JSON; raises :class:`BroodError` (``bad_reply``) if it is not."""
        try:
            return json.loads(self.data)
        except ValueError as e:
            raise BroodError(200, "bad_reply", f"event {self.event!r} carries data that is not JSON: {e}") from e


# --- The client -------------------------------------------------------------------------------


def _segment(value: str) -> str:
    """An id as one path segment (every reserved character escaped)."""
    return urllib.parse.quote(value, safe="")


def _drop_none(body: Mapping[str, Any]) -> Json:
    """A body without its unset fields, so the server applies its own defaults."""
    return {k: v for k, v in body.items() if v is not None}


class BroodClient:
    """A client of one brood server.

    ``base_url`` is the server's root (``http://127.0.0.1:7070``); ``api_key``, when given, is
    sent as ``Authorization: Bearer <key>`` on every request; ``timeout`` is the seconds one
    request may take (the event stream has its own, see :meth:`events`).
    """

    def __init__(self, base_url: str, api_key: Optional[str] = None, timeout: float = 30) -> None:
        self.base_url: str = base_url.rstrip("/")
        self.api_key: Optional[str] = api_key
        self.timeout: float = timeout

    def __repr__(self) -> str:
        keyed = "with a key" if self.api_key else "without a key"
        return f"BroodClient({self.base_url!r}, {keyed})"

    # -- transport --

    def _headers(self, accept: str = "application/json") -> Dict[str, str]:
        headers = {"Accept": accept}
        if self.api_key is not None:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _open(
        self, method: str, path: str, body: Optional[Json], accept: str, timeout: Optional[float]
    ) -> http.client.HTTPResponse:
        """Sends one request; answers the open response of a 2xx, raises BroodError otherwise."""
        data: Optional[bytes] = None
        headers = self._headers(accept)
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.base_url + path, data=data, headers=headers, method=method)
        try:
            return cast(http.client.HTTPResponse, urllib.request.urlopen(request, timeout=timeout))
        except urllib.error.HTTPError as e:
            with e:
                raise _error_of(e.code, e.read()) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise BroodError(0, "connection_failed", f"{method} {self.base_url}{path}: {reason}") from e

    def _request(self, method: str, path: str, body: Optional[Json] = None) -> Optional[Any]:
        """One JSON request: the parsed reply, or None for a 204 (or an empty body)."""
        response = self._open(method, path, body, "application/json", self.timeout)
        with response:
            try:
                raw = response.read()
            except (OSError, socket.timeout) as e:
                raise BroodError(0, "connection_failed", f"{method} {path}: the reply broke off: {e}") from e
            if response.status == 204 or not raw.strip():
                return None
            try:
                return json.loads(raw)
            except ValueError as e:
                raise BroodError(response.status, "bad_reply", f"{method} {path}: the reply is not JSON: {e}") from e

    def _json(self, method: str, path: str, body: Optional[Json] = None) -> Any:
        """A request whose success always carries a JSON body."""
        reply = self._request(method, path, body)
        if reply is None:
            raise BroodError(204, "bad_reply", f"{method} {path}: the reply has no body")
        return reply

    def _text(self, path: str, accept: str) -> str:
        response = self._open("GET", path, None, accept, self.timeout)
        with response:
            return response.read().decode("utf-8", errors="replace")

    # -- sessions --

    def put_session(
        self,
        session_id: str,
        wake_url: Optional[str] = None,
        addressable: Optional[bool] = None,
        max_concurrent_children: Optional[int] = None,
    ) -> Session:
        """``PUT /v1/sessions/{id}``: creates or updates a session. A ``wake_url`` (plain
        http) or ``addressable=True`` makes it wake-capable."""
        body = _drop_none(
            {"wake_url": wake_url, "addressable": addressable, "max_concurrent_children": max_concurrent_children}
        )
        return cast(Session, self._json("PUT", f"/v1/sessions/{_segment(session_id)}", body))

    def get_session(self, session_id: str) -> SessionState:
        """``GET /v1/sessions/{id}``: the session's turn, counts and calls."""
        return cast(SessionState, self._json("GET", f"/v1/sessions/{_segment(session_id)}"))

    def set_turn(self, session_id: str, state: TurnState) -> Turn:
        """``POST /v1/sessions/{id}/turn``: ``busy`` while the session works, ``idle`` between
        turns (it is woken only while idle)."""
        return cast(Turn, self._json("POST", f"/v1/sessions/{_segment(session_id)}/turn", {"state": state}))

    def list_sessions(self, limit: Optional[int] = None, after: Optional[str] = None) -> SessionList:
        """``GET /v1/sessions?limit=&after=``: one page of sessions in ascending id order."""
        query = urllib.parse.urlencode(_drop_none({"limit": limit, "after": after}))
        return cast(SessionList, self._json("GET", "/v1/sessions" + (f"?{query}" if query else "")))

    # -- delegation --

    def delegate(
        self,
        session_id: str,
        tasks: List[Task],
        mode: Optional[Mode] = None,
        independent_completions: Optional[bool] = None,
    ) -> Delegation:
        """``POST /v1/sessions/{id}/delegate``: starts children for ``tasks`` (each a dict
        with ``goal`` and ``runner``, see :func:`sim`). Background by default (202); sync, or
        background forced to sync for a session that is not wake-capable, answers the results
        (200)."""
        body = _drop_none({"tasks": list(tasks), "mode": mode, "independent_completions": independent_completions})
        return cast(Delegation, self._json("POST", f"/v1/sessions/{_segment(session_id)}/delegate", body))

    def get_call(self, call_id: str) -> Json:
        """``GET /v1/calls/{call_id}``: one call, as in a session's ``calls``."""
        return cast(Json, self._json("GET", f"/v1/calls/{_segment(call_id)}"))

    # -- boundaries and claims --

    def boundary(self, session_id: str, consumer: str, lease_ms: Optional[int] = None) -> Optional[Envelope]:
        """``POST /v1/sessions/{id}/boundary``: claims everything ready as one envelope, or
        answers None (204) when nothing is ready. Ack or release the claim within ``lease_ms``."""
        body = _drop_none({"consumer": consumer, "lease_ms": lease_ms})
        path = f"/v1/sessions/{_segment(session_id)}/boundary"
        return cast(Optional[Envelope], self._request("POST", path, body))

    def ack(self, claim_id: str) -> Acked:
        """``POST /v1/claims/{id}/ack``: the envelope was delivered. Acking again answers the
        same; a lost claim raises 409 ``claim_lost``."""
        return cast(Acked, self._json("POST", f"/v1/claims/{_segment(claim_id)}/ack"))

    def release(self, claim_id: str, reason: ReleaseReason, retry_after_ms: Optional[int] = None) -> Json:
        """``POST /v1/claims/{id}/release``: hands the items back (``busy``: not an attempt;
        ``failed``: an attempt, with backoff), ready again after ``retry_after_ms`` at least."""
        body = _drop_none({"reason": reason, "retry_after_ms": retry_after_ms})
        return cast(Json, self._json("POST", f"/v1/claims/{_segment(claim_id)}/release", body))

    # -- external workers --

    def poll_work(
        self,
        worker: str,
        queue: Optional[str] = None,
        wait_ms: Optional[int] = None,
        lease_ms: Optional[int] = None,
    ) -> Optional[Work]:
        """``POST /v1/workers/poll``: a child to run, or None (204) when none came within
        ``wait_ms``."""
        body = _drop_none({"worker": worker, "queue": queue, "wait_ms": wait_ms, "lease_ms": lease_ms})
        return cast(Optional[Work], self._request("POST", "/v1/workers/poll", body))

    def heartbeat(self, child_id: str, token: str, progress: Optional[str] = None) -> Json:
        """``POST /v1/children/{id}/heartbeat``: renews the lease; a stale token raises 409."""
        body = _drop_none({"token": token, "progress": progress})
        return cast(Json, self._json("POST", f"/v1/children/{_segment(child_id)}/heartbeat", body))

    def complete(
        self,
        child_id: str,
        token: str,
        status: Literal["succeeded", "failed"],
        summary: Optional[str] = None,
        error: Optional[str] = None,
    ) -> Json:
        """``POST /v1/children/{id}/complete``: the worker's result; a stale token raises 409."""
        body: Json = {"token": token, "status": status, "summary": summary, "error": error}
        return cast(Json, self._json("POST", f"/v1/children/{_segment(child_id)}/complete", _drop_none(body)))

    # -- lifecycle --

    def cancel_call(self, call_id: str, reason: Optional[str] = None) -> Cancelled:
        """``POST /v1/calls/{id}/cancel``: cancels every unfinished child of the call."""
        path = f"/v1/calls/{_segment(call_id)}/cancel"
        return cast(Cancelled, self._json("POST", path, _drop_none({"reason": reason})))

    def cancel_unit(self, unit_id: str, reason: Optional[str] = None) -> Cancelled:
        """``POST /v1/units/{id}/cancel``: cancels every unfinished child of the unit."""
        path = f"/v1/units/{_segment(unit_id)}/cancel"
        return cast(Cancelled, self._json("POST", path, _drop_none({"reason": reason})))

    def cancel_child(self, child_id: str, reason: Optional[str] = None) -> Cancelled:
        """``POST /v1/children/{id}/cancel``: cancels the child and its nested descendants."""
        path = f"/v1/children/{_segment(child_id)}/cancel"
        return cast(Cancelled, self._json("POST", path, _drop_none({"reason": reason})))

    # -- events and operations --

    def events(self, session_id: str, timeout: Optional[float] = None) -> Iterator[Event]:
        """``GET /v1/sessions/{id}/events``: the session's server-sent events as they come
        (``child``, ``ready``, ``wake``, ``failure_notice``, ``claim``, ``cancel``). The
        iterator ends when the server closes the stream; ``timeout`` (None: wait forever) is
        the most seconds to wait for the next line. Close the generator to stop listening.
        The request is made at the first ``next()``, so an error reply is raised there."""
        response = self._open(
            "GET", f"/v1/sessions/{_segment(session_id)}/events", None, "text/event-stream", timeout
        )
        with response:
            lines = (raw.decode("utf-8", errors="replace") for raw in response)
            try:
                yield from parse_events(lines)
            except (OSError, socket.timeout) as e:
                raise BroodError(0, "connection_failed", f"the event stream of {session_id!r} broke off: {e}") from e

    def dead_letters(self, session_id: Optional[str] = None) -> DeadLetters:
        """``GET /v1/dead-letters[?session_id=]``: items that ran out of delivery attempts."""
        query = urllib.parse.urlencode(_drop_none({"session_id": session_id}))
        return cast(DeadLetters, self._json("GET", "/v1/dead-letters" + (f"?{query}" if query else "")))

    def redrive(
        self,
        child_ids: Optional[List[str]] = None,
        session_id: Optional[str] = None,
        all_: bool = False,
        limit: Optional[int] = None,
    ) -> Redriven:
        """``POST /v1/dead-letters/redrive``: makes dead letters ready again, chosen by
        ``child_ids``, ``session_id`` or ``all_`` (the API's ``"all": true``), at most ``limit``."""
        body = _drop_none(
            {"child_ids": child_ids, "session_id": session_id, "all": True if all_ else None, "limit": limit}
        )
        return cast(Redriven, self._json("POST", "/v1/dead-letters/redrive", body))

    def healthz(self) -> Json:
        """``GET /healthz``: answers when the ledger is open and the actors answer; raises
        (503 ``unhealthy``) otherwise."""
        return cast(Json, self._json("GET", "/healthz"))

    def metrics(self) -> str:
        """``GET /metrics``: the Prometheus text."""
        return self._text("/metrics", "text/plain")

    def openapi(self) -> Json:
        """``GET /v1/openapi.json``: the OpenAPI 3.1 document of this API."""
        return cast(Json, self._json("GET", "/v1/openapi.json"))

    def ui(self) -> str:
        """``GET /ui``: the web view's HTML."""
        return self._text("/ui", "text/html")


def parse_events(lines: Iterator[str]) -> Iterator[Event]:
    """Server-sent events from the stream's lines (the text/event-stream format): ``event:``,
    ``data:`` and ``id:`` fields, an empty line ending each event, ``:`` comments skipped."""
    name = ""
    data: List[str] = []
    last_id: Optional[str] = None
    for line in lines:
        line = line.rstrip("\r\n")
        if not line:
            if data:
                yield Event(event=name or "message", data="\n".join(data), id=last_id)
            name, data = "", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            last_id = value
        # `retry:` and unknown fields are ignored, as the format says.
    if data:
        yield Event(event=name or "message", data="\n".join(data), id=last_id)


def _error_of(status: int, raw: bytes) -> BroodError:
    """The BroodError of an error reply: API.md's ``{"error": {"code", "message"}}``, or a
    ``http_<status>`` code with the body as its message when the body is not in that shape."""
    text = raw.decode("utf-8", errors="replace")
    try:
        body: Union[Json, Any] = json.loads(text)
        error = body["error"]
        return BroodError(status, str(error["code"]), str(error["message"]))
    except (ValueError, TypeError, KeyError):
        return BroodError(status, f"http_{status}", text.strip() or f"the server answered {status} with no body")
