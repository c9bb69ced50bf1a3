"""The shapes of brood's HTTP API as dataclasses: what a request sends and what a reply holds.

Requests: :class:`Task` (one task of a delegate), its runner (:class:`SimRunner`,
:class:`CommandRunner`, :class:`ExternalRunner`, or a plain mapping for a runner kind an
embedder registered) and its :class:`RetryPolicy`. Each has ``to_dict()``, the JSON it is sent
as; fields left ``None`` are not sent, so the server applies its defaults.

Replies: every other class here. Each is built by ``from_dict()``, which is tolerant: a field
the server added that this client does not know is kept in ``extra`` (a mapping) rather than
refused, and a field the server does not send yet is ``None``. A field the API always sends
that is missing raises :class:`ValueError`.

Times are milliseconds since the Unix epoch; durations are milliseconds.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from types import MappingProxyType
from typing import Any, ClassVar, Dict, FrozenSet, List, Mapping, Optional, Type, TypeVar, Union

__all__ = [
    "Model",
    "RetryPolicy",
    "SimRunner",
    "CommandRunner",
    "ExternalRunner",
    "Runner",
    "Task",
    "Session",
    "Counts",
    "LiveClaim",
    "Unit",
    "Child",
    "Call",
    "SessionDetail",
    "SessionSummary",
    "SessionPage",
    "TurnState",
    "Item",
    "Envelope",
    "Delegation",
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
]

M = TypeVar("M", bound="Model")

_MODEL = "brood_model"
_MANY = "brood_many"


def _one(model: Type["Model"], default: Any = None) -> Any:
    """A field holding one ``model`` (``None`` when absent)."""
    return field(default=default, metadata={_MODEL: model})


def _many(model: Type["Model"]) -> Any:
    """A field holding a list of ``model`` (empty when absent)."""
    return field(default_factory=list, metadata={_MODEL: model, _MANY: True})


class Model:
    """The base of the reply models: :meth:`from_dict`, and ``extra`` for unknown fields."""

    #: The reply's fields this client does not know (fields the server added since).
    extra: Mapping[str, Any] = MappingProxyType({})
    #: Fields parsed apart from the model's own (set by a subclass that takes them elsewhere).
    _skip: ClassVar[FrozenSet[str]] = frozenset()

    @classmethod
    def from_dict(cls: Type[M], data: Mapping[str, Any]) -> M:
        """The model of the JSON object ``data``; unknown fields go to ``extra``."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
        values: Dict[str, Any] = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name not in data:
                if f.default is MISSING and f.default_factory is MISSING:
                    raise ValueError(f"{cls.__name__}: the reply has no `{f.name}`")
                continue
            value = data[f.name]
            model = f.metadata.get(_MODEL)
            if model is not None and value is not None:
                value = [model.from_dict(v) for v in value] if f.metadata.get(_MANY) else model.from_dict(value)
            values[f.name] = value
        made = cls(**values)
        known = {f.name for f in fields(cls)} | cls._skip  # type: ignore[arg-type]
        extra = {k: v for k, v in data.items() if k not in known}
        if extra:
            object.__setattr__(made, "extra", MappingProxyType(extra))
        return made


def _compact(values: Mapping[str, Any]) -> Dict[str, Any]:
    """``values`` without the ``None`` ones, so the server applies its defaults."""
    return {k: v for k, v in values.items() if v is not None}


# --- Requests ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How often a child that ended ``failed`` or ``timed_out`` is run again before its result
    is published: ``max_attempts`` (1 to 20, default 1: no retry), waiting ``backoff_ms``
    doubling up to ``max_backoff_ms`` between attempts."""

    max_attempts: Optional[int] = None
    backoff_ms: Optional[int] = None
    max_backoff_ms: Optional[int] = None

    def to_dict(self) -> Dict[str, Any]:
        """The JSON of the policy."""
        return _compact({"max_attempts": self.max_attempts, "backoff_ms": self.backoff_ms,
                         "max_backoff_ms": self.max_backoff_ms})


@dataclass(frozen=True)
class SimRunner:
    """A simulated child: works ``ms`` milliseconds, then ends as ``outcome`` says (``ok``,
    ``fail``, ``panic`` or ``hang``), reporting ``summary``."""

    ms: Optional[int] = None
    outcome: Optional[str] = None
    summary: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        """The JSON of the runner spec."""
        return _compact({"kind": "sim", "ms": self.ms, "outcome": self.outcome, "summary": self.summary})


@dataclass(frozen=True)
class CommandRunner:
    """A local program ``argv`` with extra ``env`` in ``cwd`` (refused with 403 unless the
    server allows commands). The task's ``input`` is written to its stdin as JSON."""

    argv: List[str]
    env: Optional[Dict[str, str]] = None
    cwd: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        """The JSON of the runner spec."""
        return _compact({"kind": "command", "argv": list(self.argv), "env": self.env, "cwd": self.cwd})


@dataclass(frozen=True)
class ExternalRunner:
    """A child run by an outside worker that polls ``queue`` (the server's default: ``default``);
    see :class:`brood_client.Worker`."""

    queue: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        """The JSON of the runner spec."""
        return _compact({"kind": "external", "queue": self.queue})


#: A runner spec: one of the classes above, or a mapping with a ``kind`` (a runner an
#: embedder registered), sent as it is.
Runner = Union[SimRunner, CommandRunner, ExternalRunner, Mapping[str, Any]]


@dataclass(frozen=True)
class Task:
    """One task of a delegate: what the child should do (``goal``) and how it runs (``runner``).

    Optional: ``group`` (the tasks of one group go out together), ``timeout_ms`` (the child
    ends ``timed_out`` after this long), ``stall_ms`` (… after this long without a heartbeat),
    ``rerun_on_recovery`` (it may run again when it was running at a crash), ``input`` (any
    JSON value handed to the child; ``None`` is none) and ``retry`` (a :class:`RetryPolicy`).
    """

    goal: str
    runner: Runner
    group: Optional[str] = None
    timeout_ms: Optional[int] = None
    stall_ms: Optional[int] = None
    rerun_on_recovery: Optional[bool] = None
    input: Any = None
    retry: Optional[RetryPolicy] = None

    def to_dict(self) -> Dict[str, Any]:
        """The JSON of the task."""
        runner = self.runner if isinstance(self.runner, Mapping) else self.runner.to_dict()
        return _compact({
            "goal": self.goal,
            "runner": dict(runner),
            "group": self.group,
            "timeout_ms": self.timeout_ms,
            "stall_ms": self.stall_ms,
            "rerun_on_recovery": self.rerun_on_recovery,
            "input": self.input,
            "retry": self.retry.to_dict() if self.retry is not None else None,
        })


# --- Sessions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Session(Model):
    """A session's settings (the reply of ``PUT /v1/sessions/{id}``). ``turn`` is ``idle`` or
    ``busy``; a session is woken only when ``wake_capable`` and idle."""

    session_id: str
    wake_capable: bool
    turn: str
    addressable: Optional[bool] = None
    max_concurrent_children: Optional[int] = None
    max_delivery_attempts: Optional[int] = None


@dataclass(frozen=True)
class Counts(Model):
    """How many of a session's children and items are in each state."""

    queued: int = 0
    running: int = 0
    ready: int = 0
    backing_off: int = 0
    claimed: int = 0
    delivered: int = 0


@dataclass(frozen=True)
class LiveClaim(Model):
    """A claim not yet acked or released: who holds it, how many items, until when."""

    claim_id: str
    consumer: str
    items: int
    lease_expires_at: int


@dataclass(frozen=True)
class Unit(Model):
    """A completion unit of a call: the indexes of its ``tasks`` (and its ``group``, when the
    tasks named one); its results go out together."""

    unit_id: str
    tasks: List[int] = field(default_factory=list)
    group: Optional[str] = None


@dataclass(frozen=True)
class Child(Model):
    """A child of a call: its ``status`` (``queued``, ``running``, ``succeeded``, ``failed``,
    ``timed_out``, ``interrupted``, ``cancelled``, ``unknown``), when it ran, where its result is
    (``delivery``: ``undelivered``, ``delivered``, ``dead_letter``), the first line of its
    summary, its ``output`` and the execution ``attempts`` made."""

    child_id: str
    task_index: int
    status: str
    started_at: Optional[int] = None
    finished_at: Optional[int] = None
    delivery: Optional[str] = None
    delivery_attempt: Optional[int] = None
    summary: Optional[str] = None
    output: Any = None
    attempts: Optional[int] = None


@dataclass(frozen=True)
class Call(Model):
    """A call (one delegate): its ordinal ``set`` in the session, the ``mode`` it ran in, its
    units and children. ``session_id`` and ``forced_sync_reason`` come with
    ``GET /v1/calls/{id}``."""

    call_id: str
    set: int
    mode: str
    created_at: Optional[int] = None
    units: List[Unit] = _many(Unit)
    children: List[Child] = _many(Child)
    session_id: Optional[str] = None
    forced_sync_reason: Optional[str] = None


@dataclass(frozen=True)
class SessionDetail(Model):
    """A session's whole state (``GET /v1/sessions/{id}``): settings, counts, calls, live claims.
    ``calls_next`` is the ``after`` of the next page of calls, when more follow."""

    session_id: str
    turn: str
    wake_capable: bool
    addressable: Optional[bool] = None
    max_concurrent_children: Optional[int] = None
    max_delivery_attempts: Optional[int] = None
    counts: Counts = _one(Counts, Counts())
    parent_child_id: Optional[str] = None
    calls: List[Call] = _many(Call)
    calls_next: Optional[str] = None
    claims: List[LiveClaim] = _many(LiveClaim)


@dataclass(frozen=True)
class SessionSummary(Model):
    """A session in a listing; ``parent_child_id`` names the child of a nested session."""

    session_id: str
    turn: str
    wake_capable: bool
    counts: Counts = _one(Counts, Counts())
    parent_child_id: Optional[str] = None


@dataclass(frozen=True)
class SessionPage(Model):
    """A page of sessions in ascending id order; ``next`` is the ``after`` of the next page."""

    sessions: List[SessionSummary] = _many(SessionSummary)
    next: Optional[str] = None


@dataclass(frozen=True)
class TurnState(Model):
    """A session's turn after ``POST /v1/sessions/{id}/turn``."""

    session_id: str
    turn: str


# --- Delegation, boundaries, claims -----------------------------------------------------------


@dataclass(frozen=True)
class Item(Model):
    """One item of an envelope or of a sync delegate's results.

    ``kind`` is ``result`` or ``failure_notice`` (a child failed while its unit is incomplete);
    ``dedup_key`` is stable across deliveries of the item; ``delivery_attempt`` counts claims of
    it that expired or were released ``failed``. ``status``, ``summary``, ``error`` and
    ``output`` say how the child ended, ``attempts`` how many times it ran."""

    kind: str
    dedup_key: str
    delivery_attempt: int
    call_id: str
    set: int
    unit_id: str
    child_id: str
    task_index: int
    of: int
    status: str
    group: Optional[str] = None
    summary: Optional[str] = None
    error: Optional[str] = None
    recovered: bool = False
    output: Any = None
    attempts: Optional[int] = None


@dataclass(frozen=True)
class Envelope(Model):
    """What a boundary claimed: the ``items`` and the ``text`` a model reads. Ack the claim
    (:meth:`Client.ack`) once they are delivered, or release it, before ``lease_expires_at``.
    ``more`` is true when ready items were left for the next boundary (``max_items``,
    ``max_bytes``)."""

    claim_id: str
    lease_expires_at: int
    items: List[Item] = _many(Item)
    text: str = ""
    more: Optional[bool] = None


@dataclass(frozen=True)
class Delegation(Model):
    """The reply of a delegate. In the background (``mode == "background"``, 202): the
    ``units`` made and a ``note``; results come at the session's boundaries. Sync (200, also a
    background call forced to sync with ``forced_sync_reason``): the ``results`` and their
    ``text``, already counted as delivered."""

    call_id: str
    set: int
    mode: str
    units: List[Unit] = _many(Unit)
    note: Optional[str] = None
    forced_sync_reason: Optional[str] = None
    results: List[Item] = _many(Item)
    text: Optional[str] = None


@dataclass(frozen=True)
class Acked(Model):
    """An ack: the items the claim delivered (the same when acked again)."""

    delivered: int


@dataclass(frozen=True)
class Released(Model):
    """A release: the claim's items are ready again (after any backoff)."""

    claim_id: str
    released: bool = True


@dataclass(frozen=True)
class Cancelled(Model):
    """A cancel: the children this request cancelled, and how many had already ended."""

    cancelled: List[str] = field(default_factory=list)
    already_finished: int = 0


@dataclass(frozen=True)
class DeadLetter(Model):
    """An item that ran out of delivery attempts."""

    child_id: str
    session_id: str
    call_id: str
    reason: str
    attempts: int
    dead_at: int
    kind: Optional[str] = None


@dataclass(frozen=True)
class DeadLetters(Model):
    """The dead letters of the server, or of one session."""

    items: List[DeadLetter] = _many(DeadLetter)


@dataclass(frozen=True)
class Redriven(Model):
    """A redrive: how many items are ready again."""

    redriven: int


@dataclass(frozen=True)
class Health(Model):
    """``/healthz`` or ``/readyz`` answered 200: ``status`` (``ok``) and what the server adds."""

    status: str
    sessions: Optional[int] = None
    failed_sessions: Optional[int] = None


# --- External workers -------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkItem(Model):
    """A child handed to an outside worker: its ``goal`` and ``input``, the ``token`` to send
    with every heartbeat and the completion, and the ``lease_ms`` a heartbeat renews. Also its
    ``session_id`` and ``call_id``, the execution ``attempt`` (1 for the first run) and
    ``deadline_at`` (when it times out, or ``None``)."""

    child_id: str
    goal: str
    token: str
    lease_ms: int
    input: Any = None
    session_id: Optional[str] = None
    call_id: Optional[str] = None
    attempt: Optional[int] = None
    deadline_at: Optional[int] = None


@dataclass(frozen=True)
class Heartbeat(Model):
    """A heartbeat: the lease runs ``lease_ms`` from now."""

    child_id: str
    lease_ms: int


@dataclass(frozen=True)
class Completion(Model):
    """A completion as recorded (the same when the same completion is sent again)."""

    child_id: str
    status: str
    summary: Optional[str] = None
    error: Optional[str] = None
    output: Any = None
