"""The endpoints of the API as data: each function here says what one request sends and how its
reply is read, and both clients (:mod:`brood_client.client`, :mod:`brood_client.aio`) send
what it says. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Generic, Iterable, List, Mapping, Optional, TypeVar, Union, cast
from urllib.parse import quote

import httpx

from . import models
from .errors import BadReply, ConnectionFailed, error_from_reply
from .models import _compact

T = TypeVar("T")

#: A task as a :class:`~brood_client.models.Task` or as the JSON object the API reads.
TaskLike = Union[models.Task, Mapping[str, Any]]


@dataclass(frozen=True)
class Request(Generic[T]):
    """One request: what to send, and ``read`` to turn the reply's JSON into ``T``.

    ``body`` is sent as JSON unless it is ``None``; ``optional`` says a 204 is an answer
    (``None``); ``text`` that the reply is text, not JSON; ``wait`` is how many seconds the
    server may hold the request on purpose (a long poll), added to the read timeout;
    ``timeout``, when set, replaces the read timeout.
    """

    method: str
    path: str
    read: Callable[[Any], T]
    body: Any = None
    params: Dict[str, str] = field(default_factory=dict)
    headers: Dict[str, str] = field(default_factory=dict)
    optional: bool = False
    text: bool = False
    wait: float = 0.0
    timeout: Optional[float] = None

    def timeout_from(self, base: httpx.Timeout) -> httpx.Timeout:
        """The timeouts of this request, given the client's."""
        read = self.timeout if self.timeout is not None else base.read
        if read is not None:
            read += self.wait
        return httpx.Timeout(connect=base.connect, read=read, write=base.write, pool=base.pool)

    def failed(self, error: httpx.TransportError) -> ConnectionFailed:
        """The error of this request when no reply came."""
        return transport_failure(f"{self.method} {self.path}", error)

    def answer(self, response: httpx.Response) -> T:
        """The reply read as ``T`` (``None`` for a 204 when ``optional``); a refusal raised as
        its :class:`~brood_client.BroodError`."""
        status = response.status_code
        if not 200 <= status < 300:
            raise error_from_reply(status, response.content)
        where = f"{self.method} {self.path}"
        if status == 204 or not response.content:
            if self.optional:
                return cast(T, None)
            raise BadReply(status, "bad_reply", f"{where}: the reply has no body")
        if self.text:
            return cast(T, response.text)
        try:
            data = response.json()
        except ValueError as e:
            raise BadReply(status, "bad_reply", f"{where}: the reply is not JSON: {e}") from e
        try:
            return self.read(data)
        except (ValueError, TypeError, KeyError) as e:
            raise BadReply(status, "bad_reply", f"{where}: the reply is not as the API says: {e}") from e


def transport_failure(where: str, error: httpx.TransportError) -> ConnectionFailed:
    """A :class:`~brood_client.ConnectionFailed` for ``where``, from httpx's ``error``."""
    code = "timeout" if isinstance(error, httpx.TimeoutException) else "connection_failed"
    detail = str(error) or type(error).__name__
    return ConnectionFailed(0, code, f"{where}: {detail}")


def segment(value: str) -> str:
    """An id as one path segment, every reserved character escaped."""
    return quote(value, safe="")


def _params(values: Mapping[str, Any]) -> Dict[str, str]:
    """A query: the values set, as the API spells them (``true``/``false``)."""
    out: Dict[str, str] = {}
    for k, v in values.items():
        if v is not None:
            out[k] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return out


def _as_is(data: Any) -> Any:
    """A reply read as the JSON (or text) it is."""
    return data


# --- Sessions ---------------------------------------------------------------------------------


def put_session(
    session_id: str,
    wake_url: Optional[str],
    addressable: Optional[bool],
    max_concurrent_children: Optional[int],
) -> Request[models.Session]:
    body = _compact({"wake_url": wake_url, "addressable": addressable,
                     "max_concurrent_children": max_concurrent_children})
    return Request("PUT", f"/v1/sessions/{segment(session_id)}", models.Session.from_dict, body=body)


def get_session(
    session_id: str, delivered: Optional[bool], after: Optional[str], limit: Optional[int]
) -> Request[models.SessionDetail]:
    params = _params({"delivered": delivered, "after": after, "limit": limit})
    return Request("GET", f"/v1/sessions/{segment(session_id)}", models.SessionDetail.from_dict, params=params)


def list_sessions(limit: Optional[int], after: Optional[str]) -> Request[models.SessionPage]:
    params = _params({"limit": limit, "after": after})
    return Request("GET", "/v1/sessions", models.SessionPage.from_dict, params=params)


def set_turn(session_id: str, state: str) -> Request[models.TurnState]:
    return Request("POST", f"/v1/sessions/{segment(session_id)}/turn", models.TurnState.from_dict,
                   body={"state": state})


# --- Delegation, boundaries, claims -----------------------------------------------------------


def delegate(
    session_id: str,
    tasks: Iterable[TaskLike],
    mode: Optional[str],
    independent_completions: Optional[bool],
    idempotency_key: Optional[str],
    idempotency_header: Optional[str],
    traceparent: Optional[str],
    timeout: Optional[float],
) -> Request[models.Delegation]:
    body = _compact({
        "tasks": [t.to_dict() if isinstance(t, models.Task) else dict(t) for t in tasks],
        "mode": mode,
        "independent_completions": independent_completions,
        "idempotency_key": idempotency_key,
        "traceparent": traceparent,
    })
    headers = {"Idempotency-Key": idempotency_header} if idempotency_header is not None else {}
    return Request("POST", f"/v1/sessions/{segment(session_id)}/delegate", models.Delegation.from_dict,
                   body=body, headers=headers, timeout=timeout)


def get_call(call_id: str) -> Request[models.Call]:
    return Request("GET", f"/v1/calls/{segment(call_id)}", models.Call.from_dict)


def boundary(
    session_id: str,
    consumer: str,
    lease_ms: Optional[int],
    max_items: Optional[int],
    max_bytes: Optional[int],
    ack: Optional[str] = None,
) -> Request[Optional[models.Envelope]]:
    body = _compact({"consumer": consumer, "lease_ms": lease_ms, "max_items": max_items, "max_bytes": max_bytes,
                     "ack": ack})
    return Request("POST", f"/v1/sessions/{segment(session_id)}/boundary", models.Envelope.from_dict,
                   body=body, optional=True)


def ack(claim_id: str) -> Request[models.Acked]:
    return Request("POST", f"/v1/claims/{segment(claim_id)}/ack", models.Acked.from_dict)


def release(claim_id: str, reason: str, retry_after_ms: Optional[int]) -> Request[models.Released]:
    body = _compact({"reason": reason, "retry_after_ms": retry_after_ms})
    return Request("POST", f"/v1/claims/{segment(claim_id)}/release", models.Released.from_dict, body=body)


def cancel(what: str, target_id: str, reason: Optional[str]) -> Request[models.Cancelled]:
    """A cancel of a call, unit or child (``what`` is ``calls``, ``units`` or ``children``)."""
    body = {"reason": reason} if reason is not None else None
    return Request("POST", f"/v1/{what}/{segment(target_id)}/cancel", models.Cancelled.from_dict, body=body)


# --- Dead letters -----------------------------------------------------------------------------


def dead_letters(session_id: Optional[str]) -> Request[models.DeadLetters]:
    return Request("GET", "/v1/dead-letters", models.DeadLetters.from_dict, params=_params({"session_id": session_id}))


def redrive(
    child_ids: Optional[List[str]], session_id: Optional[str], all_: bool, limit: Optional[int]
) -> Request[models.Redriven]:
    body = _compact({"child_ids": child_ids, "session_id": session_id, "all": True if all_ else None, "limit": limit})
    return Request("POST", "/v1/dead-letters/redrive", models.Redriven.from_dict, body=body)


# --- External workers -------------------------------------------------------------------------


def poll_work(
    worker: str, queue: Optional[str], wait_ms: Optional[int], lease_ms: Optional[int]
) -> Request[Optional[models.WorkItem]]:
    body = _compact({"worker": worker, "queue": queue, "wait_ms": wait_ms, "lease_ms": lease_ms})
    return Request("POST", "/v1/workers/poll", models.WorkItem.from_dict, body=body, optional=True,
                   wait=(wait_ms or 0) / 1000)


def heartbeat(child_id: str, token: str, progress: Optional[str]) -> Request[models.Heartbeat]:
    body = _compact({"token": token, "progress": progress})
    return Request("POST", f"/v1/children/{segment(child_id)}/heartbeat", models.Heartbeat.from_dict, body=body)


def complete(
    child_id: str, token: str, status: str, summary: Optional[str], error: Optional[str], output: Any
) -> Request[models.Completion]:
    body = _compact({"token": token, "status": status, "summary": summary, "error": error, "output": output})
    return Request("POST", f"/v1/children/{segment(child_id)}/complete", models.Completion.from_dict, body=body)


def take_work(
    child_id: str, worker: str, lease_ms: int, take_id: Optional[str], answer_by_ms: Optional[int] = None
) -> Request[models.WorkItem]:
    body = _compact(
        {"child_id": child_id, "worker": worker, "lease_ms": lease_ms, "take_id": take_id, "answer_by_ms": answer_by_ms}
    )
    return Request("POST", "/v1/workers/take", models.WorkItem.from_dict, body=body)


def untake_work(child_id: str, take_id: str) -> Request[None]:
    return Request("POST", "/v1/workers/untake", _as_is, body={"child_id": child_id, "take_id": take_id},
                   optional=True)


# --- Operations -------------------------------------------------------------------------------


def healthz() -> Request[models.Health]:
    return Request("GET", "/healthz", models.Health.from_dict)


def readyz() -> Request[models.Health]:
    return Request("GET", "/readyz", models.Health.from_dict)


def openapi() -> Request[Dict[str, Any]]:
    return Request("GET", "/v1/openapi.json", _as_is)


def metrics() -> Request[str]:
    return Request("GET", "/metrics", _as_is, headers={"Accept": "text/plain"}, text=True)


def ui() -> Request[str]:
    return Request("GET", "/ui", _as_is, headers={"Accept": "text/html"}, text=True)


def events_path(session_id: str) -> str:
    """The path of a session's event stream (opened by the clients, not as a :class:`Request`)."""
    return f"/v1/sessions/{segment(session_id)}/events"
