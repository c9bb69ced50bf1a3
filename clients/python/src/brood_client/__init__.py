"""A client of brood's HTTP API: delegate child tasks, collect their results at turn
boundaries, and run children as an outside worker.

- :class:`Client` (blocking) and :class:`AsyncClient` (asyncio): one method per endpoint,
  replies as the dataclasses of :mod:`brood_client.models`;
- :class:`Task`, :class:`SimRunner`, :class:`CommandRunner`, :class:`ExternalRunner`,
  :class:`RetryPolicy`: what a delegate sends;
- :class:`BroodError` and its subclasses (:mod:`brood_client.errors`): every failure;
- :meth:`Client.events`: a session's event stream, typed (:mod:`brood_client.events`);
- :class:`Worker` and :class:`AsyncWorker`: poll, run, heartbeat and complete the children of
  ``external`` runners (:mod:`brood_client.worker`).

A parent's loop::

    from brood_client import Client, SimRunner, Task

    with Client("http://127.0.0.1:7070") as brood:
        brood.put_session("chat-1", addressable=True)
        brood.delegate("chat-1", [Task("review PR 12", SimRunner(ms=50))])
        envelope = brood.boundary("chat-1", consumer="cli")   # at the end of a turn
        if envelope is not None:
            print(envelope.text)
            brood.ack(envelope.claim_id)
"""

from .aio import AsyncClient
from .client import Client
from .errors import (
    BadReply,
    BroodError,
    Conflict,
    ConnectionFailed,
    Forbidden,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    Unavailable,
)
from .events import (
    AsyncEventStream,
    CancelEvent,
    ChildEvent,
    ClaimEvent,
    DroppedEvent,
    Event,
    EventStream,
    FailureNoticeEvent,
    ReadyEvent,
)
from .models import (
    Acked,
    Call,
    Cancelled,
    Child,
    CommandRunner,
    Completion,
    Counts,
    DeadLetter,
    DeadLetters,
    Delegation,
    Envelope,
    ExternalRunner,
    Health,
    Heartbeat,
    Item,
    LiveClaim,
    Redriven,
    Released,
    RetryPolicy,
    Runner,
    Session,
    SessionDetail,
    SessionPage,
    SessionSummary,
    SimRunner,
    Task,
    TurnState,
    Unit,
    WorkItem,
)
from .worker import AsyncWorker, Done, Worker

__version__ = "0.1.0"

__all__ = [
    "Client",
    "AsyncClient",
    "Worker",
    "AsyncWorker",
    "Done",
    "Task",
    "RetryPolicy",
    "Runner",
    "SimRunner",
    "CommandRunner",
    "ExternalRunner",
    "Session",
    "SessionDetail",
    "SessionSummary",
    "SessionPage",
    "Counts",
    "LiveClaim",
    "TurnState",
    "Call",
    "Unit",
    "Child",
    "Delegation",
    "Item",
    "Envelope",
    "Acked",
    "Released",
    "Cancelled",
    "DeadLetter",
    "DeadLetters",
    "Redriven",
    "Health",
    "WorkItem",
    "Heartbeat",
    "Completion",
    "Event",
    "EventStream",
    "AsyncEventStream",
    "ChildEvent",
    "ReadyEvent",
    "FailureNoticeEvent",
    "ClaimEvent",
    "CancelEvent",
    "DroppedEvent",
    "BroodError",
    "InvalidRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "Conflict",
    "PayloadTooLarge",
    "Unavailable",
    "ConnectionFailed",
    "BadReply",
]
