"""A session's event stream (``GET /v1/sessions/{id}/events``, server-sent events), typed.

Each :class:`Event` has the stream's ``name`` for it, its ``id``, the session, ``seq`` and
``at``, and ``data``, its body as a model: :class:`ChildEvent` (``child``: a child's status
changed), :class:`ReadyEvent` (``ready``: the count of ready items changed, also the first event
of every stream; ``wake``: the session was woken), :class:`FailureNoticeEvent`
(``failure_notice``), :class:`ClaimEvent` (``claim``), :class:`CancelEvent` (``cancel``),
:class:`DroppedEvent` (``dropped``), or the parsed JSON itself for a name this client does not
know.

The stream ends when the server closes it: when it stops, or after a ``dropped`` event, sent to
a reader that fell too far behind (it missed events). Reconnecting is the caller's to do: open
the stream again; it opens with a ``ready`` event giving the count ready at that moment, and the
session's state (:meth:`brood_client.Client.get_session`) says what was missed::

    while running:
        try:
            with client.events(session_id) as stream:
                for event in stream:
                    handle(event)          # "dropped" comes last, then the loop ends
        except ConnectionFailed:
            time.sleep(1)                  # the server went away; try again
        resync(client.get_session(session_id))

A quiet stream carries a keep-alive comment every 15 s, so a read timeout of a minute (the
default) notices a connection that died silently; it is raised as
:class:`~brood_client.ConnectionFailed` with code ``timeout``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import (
    Any,
    AsyncContextManager,
    AsyncIterator,
    Callable,
    ContextManager,
    Dict,
    Iterator,
    List,
    Optional,
    Type,
    Union,
)

import httpx

from ._endpoints import transport_failure
from .errors import BadReply, error_from_reply
from .models import Model

__all__ = [
    "Event",
    "ChildEvent",
    "ReadyEvent",
    "FailureNoticeEvent",
    "ClaimEvent",
    "CancelEvent",
    "DroppedEvent",
    "EventStream",
    "AsyncEventStream",
    "SseDecoder",
]

#: The fields every event's data carries beside its body: they go to :class:`Event` itself.
_ENVELOPE = frozenset({"session_id", "seq", "at"})


@dataclass(frozen=True)
class ChildEvent(Model):
    """``child``: a child's ``status`` changed (``output`` and ``attempts`` when it ended)."""

    _skip = _ENVELOPE
    child_id: str
    call_id: str
    task_index: int
    status: str
    traceparent: Optional[str] = None
    output: Any = None
    attempts: Optional[int] = None


@dataclass(frozen=True)
class ReadyEvent(Model):
    """``ready`` (the count of ready items changed) and ``wake`` (the session was woken)."""

    _skip = _ENVELOPE
    ready: int


@dataclass(frozen=True)
class FailureNoticeEvent(Model):
    """``failure_notice``: a child failed while its unit is incomplete."""

    _skip = _ENVELOPE
    child_id: str
    call_id: str
    status: str
    error: Optional[str] = None


@dataclass(frozen=True)
class ClaimEvent(Model):
    """``claim``: a claim of ``items`` items was ``claimed``, ``acked``, ``released`` or
    ``expired``."""

    _skip = _ENVELOPE
    claim_id: str
    change: str
    items: int


@dataclass(frozen=True)
class CancelEvent(Model):
    """``cancel``: the call, unit or child (``kind``) ``id`` was cancelled, ending ``cancelled``."""

    _skip = _ENVELOPE
    kind: str
    id: str
    cancelled: List[str] = field(default_factory=list)
    reason: Optional[str] = None


@dataclass(frozen=True)
class DroppedEvent(Model):
    """``dropped``: the last event of a stream whose reader fell behind (``reason`` ``lagged``)
    and ``missed`` events. Reconnect and read the session's state."""

    _skip = _ENVELOPE
    reason: str
    missed: int = 0


_BODIES: Dict[str, Type[Model]] = {
    "child": ChildEvent,
    "ready": ReadyEvent,
    "wake": ReadyEvent,
    "failure_notice": FailureNoticeEvent,
    "claim": ClaimEvent,
    "cancel": CancelEvent,
    "dropped": DroppedEvent,
}

EventBody = Union[ChildEvent, ReadyEvent, FailureNoticeEvent, ClaimEvent, CancelEvent, DroppedEvent, Any]


@dataclass(frozen=True)
class Event:
    """One event of a session's stream: its ``name``, its ``id`` (its ``seq`` as text; none on
    ``dropped``), the ``session_id``, ``seq`` and ``at`` of its data, and ``data``, its body
    (one of the models above, or the parsed JSON for a name this client does not know)."""

    name: str
    data: EventBody
    id: Optional[str] = None
    session_id: Optional[str] = None
    seq: Optional[int] = None
    at: Optional[int] = None

    @classmethod
    def parse(cls, name: str, data: str, event_id: Optional[str]) -> "Event":
        """The event named ``name`` whose ``data`` is ``data`` (JSON text)."""
        try:
            parsed = json.loads(data)
        except ValueError as e:
            raise BadReply(200, "bad_reply", f"event {name!r} carries data that is not JSON: {e}") from e
        if not isinstance(parsed, dict):
            return cls(name=name, data=parsed, id=event_id)
        body: EventBody = parsed
        body_type = _BODIES.get(name)
        if body_type is not None:
            try:
                body = body_type.from_dict(parsed)
            except (ValueError, TypeError) as e:
                raise BadReply(200, "bad_reply", f"event {name!r}: {e}") from e
        return cls(name=name, data=body, id=event_id, session_id=parsed.get("session_id"),
                   seq=parsed.get("seq"), at=parsed.get("at"))


class SseDecoder:
    """The text/event-stream format, a line at a time: ``event:``, ``data:`` and ``id:`` fields,
    a blank line ending each event, ``:`` comments (the keep-alives) skipped. An event's ``id``
    is the one it was sent with (brood sends none with ``dropped``), not the last one seen."""

    def __init__(self) -> None:
        self._name = ""
        self._data: List[str] = []
        self._id: Optional[str] = None

    def feed(self, line: str) -> Optional[Event]:
        """Takes one line (without its line break); answers the event it completes, if any."""
        if not line:
            if not self._data:
                self._name, self._id = "", None
                return None
            event = Event.parse(self._name or "message", "\n".join(self._data), self._id)
            self._name, self._data, self._id = "", [], None
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._name = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        # `retry:` and unknown fields are ignored, as the format says.
        return None


class EventStream:
    """A session's events as an iterator of :class:`Event` (see the module's notes).

    Opened by :meth:`brood_client.Client.events`; the request is made on ``with`` or at the
    first ``next()``, so a refusal (404 ``unknown_session``) is raised there. Close it (or
    leave the ``with`` block) to stop listening.
    """

    def __init__(self, open_stream: Callable[[], ContextManager[httpx.Response]], where: str) -> None:
        self._open_stream = open_stream
        self._where = where
        self._context: Optional[ContextManager[httpx.Response]] = None
        self._lines: Optional[Iterator[str]] = None
        self._closed = False
        self._decoder = SseDecoder()

    def _open(self) -> Iterator[str]:
        if self._lines is None:
            context = self._open_stream()
            try:
                response = context.__enter__()
            except httpx.TransportError as e:
                raise transport_failure(self._where, e) from e
            self._context = context
            if response.status_code != 200:
                try:
                    body = response.read()
                except httpx.TransportError:
                    body = b""
                self.close()
                raise error_from_reply(response.status_code, body)
            self._lines = response.iter_lines()
        return self._lines

    def __enter__(self) -> "EventStream":
        self._open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> "EventStream":
        return self

    def __next__(self) -> Event:
        if self._closed:
            raise StopIteration
        lines = self._open()
        try:
            for line in lines:
                event = self._decoder.feed(line)
                if event is not None:
                    return event
        except httpx.TransportError as e:
            self.close()
            raise transport_failure(self._where, e) from e
        self.close()
        raise StopIteration

    def close(self) -> None:
        """Closes the connection; the iterator ends."""
        self._closed = True
        context, self._context = self._context, None
        if context is not None:
            context.__exit__(None, None, None)


class AsyncEventStream:
    """The asyncio twin of :class:`EventStream`: ``async with`` and ``async for``; opened by
    :meth:`brood_client.AsyncClient.events`."""

    def __init__(self, open_stream: Callable[[], AsyncContextManager[httpx.Response]], where: str) -> None:
        self._open_stream = open_stream
        self._where = where
        self._context: Optional[AsyncContextManager[httpx.Response]] = None
        self._lines: Optional[AsyncIterator[str]] = None
        self._closed = False
        self._decoder = SseDecoder()

    async def _open(self) -> AsyncIterator[str]:
        if self._lines is None:
            context = self._open_stream()
            try:
                response = await context.__aenter__()
            except httpx.TransportError as e:
                raise transport_failure(self._where, e) from e
            self._context = context
            if response.status_code != 200:
                try:
                    body = await response.aread()
                except httpx.TransportError:
                    body = b""
                await self.aclose()
                raise error_from_reply(response.status_code, body)
            self._lines = response.aiter_lines()
        return self._lines

    async def __aenter__(self) -> "AsyncEventStream":
        await self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> "AsyncEventStream":
        return self

    async def __anext__(self) -> Event:
        if self._closed:
            raise StopAsyncIteration
        lines = await self._open()
        try:
            async for line in lines:
                event = self._decoder.feed(line)
                if event is not None:
                    return event
        except httpx.TransportError as e:
            await self.aclose()
            raise transport_failure(self._where, e) from e
        await self.aclose()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Closes the connection; the iterator ends."""
        self._closed = True
        context, self._context = self._context, None
        if context is not None:
            await context.__aexit__(None, None, None)
