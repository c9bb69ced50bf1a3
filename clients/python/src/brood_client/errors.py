"""The exceptions of the client: one base, :class:`BroodError`, and a subclass per kind of refusal.

Every failure of a request is a :class:`BroodError` carrying the HTTP ``status``, the server's
snake_case ``code`` and its ``message`` (the body ``{"error": {"code", "message"}}`` of every
refusal). Match on the subclass for the class of failure and on ``code`` for the reason:

- :class:`InvalidRequest` (400), :class:`Unauthorized` (401), :class:`Forbidden` (403),
  :class:`NotFound` (404), :class:`PayloadTooLarge` (413), :class:`Unavailable` (503);
- :class:`Conflict` (409): ``claim_lost``, ``stale_token``, ``child_ended``,
  ``idempotency_conflict``, … — a state the request no longer matches;
- :class:`ConnectionFailed` (``status`` 0): no reply came — the server could not be reached,
  the connection broke, or the timeout ran out (``code`` ``connection_failed`` or ``timeout``);
- :class:`BadReply`: a reply that is not what the API promises (not JSON, a field missing).
"""

from __future__ import annotations

import json
from typing import Dict, Type

__all__ = [
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
    "error_from_reply",
]


class BroodError(Exception):
    """A request that failed: ``status`` (HTTP, 0 when no reply came), ``code``, ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, message={self.message!r})"


class InvalidRequest(BroodError):
    """400: the request is malformed or out of bounds; it changed nothing."""


class Unauthorized(BroodError):
    """401: no API key, or a wrong one."""


class Forbidden(BroodError):
    """403: the server does not allow this (a runner kind, a key scoped to other sessions, …)."""


class NotFound(BroodError):
    """404: no such session, call, unit, child or claim (``unknown_session``, …)."""


class Conflict(BroodError):
    """409: the request no longer matches the state: ``claim_lost`` (the claim expired or was
    released), ``stale_token`` (a worker's lease ran out), ``child_ended`` (the child ended
    otherwise), ``idempotency_conflict`` (the key was used with another body)."""


class PayloadTooLarge(BroodError):
    """413: the body is over the server's limit."""


class Unavailable(BroodError):
    """503: the server cannot do it now (``draining``, ``ledger_unavailable``, ``not_recorded``);
    the same request may succeed later."""


class ConnectionFailed(BroodError):
    """No reply came (``status`` 0): ``code`` is ``connection_failed`` or ``timeout``. Whether
    the server acted on the request is unknown, so only a request that is safe to repeat
    should be sent again."""


class BadReply(BroodError):
    """The server answered something the API does not promise (not JSON, a field missing)."""


_BY_STATUS: Dict[int, Type[BroodError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    503: Unavailable,
}


def error_from_reply(status: int, body: bytes) -> BroodError:
    """The error of a refusal with ``status`` and ``body``: its ``code`` and ``message`` when the
    body is the API's error shape, otherwise ``http_<status>`` and the body as the message."""
    cls = _BY_STATUS.get(status, BroodError)
    text = body.decode("utf-8", errors="replace")
    try:
        error = json.loads(text)["error"]
        return cls(status, str(error["code"]), str(error["message"]))
    except (ValueError, TypeError, KeyError):
        return cls(status, f"http_{status}", text.strip() or f"the server answered {status} with no body")
