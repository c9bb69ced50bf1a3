"""The holder hint (``follow_holder=True``): with several ``brood serve`` processes on one
database, an answer about one session names the process serving it in ``X-Brood-Holder``. A
client that follows the hint sends that session's next requests there, sparing each a hop
between processes. What both clients share: where each session was last said to be, and which
failures of a hinted address send the request to the base URL again. Nothing here does I/O.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Optional
from urllib.parse import unquote, urlsplit

import httpx

#: The header naming the process that serves the session an answer is about.
HOLDER = "X-Brood-Holder"

#: The most sessions whose holder is remembered; the least recently told is forgotten first.
REMEMBERED = 10_000


def session_of(path: str) -> Optional[str]:
    """The session a request path is about: ``/v1/sessions/{id}…``, or ``/v1/claims/{id}…``
    whose claim id names its session (``clm_<session id as hex>_<hex>``); ``None`` for any
    other path."""
    parts = path.split("/", 4)
    if len(parts) < 4 or parts[0] != "" or parts[1] != "v1" or not parts[3]:
        return None
    kind, ident = parts[2], unquote(parts[3])
    if kind == "sessions":
        return ident
    if kind == "claims":
        return claim_session(ident)
    return None


def claim_session(claim_id: str) -> Optional[str]:
    """The session a claim id names, or ``None`` when it is not one of brood's."""
    if not claim_id.startswith("clm_"):
        return None
    hex_id, sep, _ = claim_id[len("clm_"):].rpartition("_")
    if not sep:
        return None
    try:
        return bytes.fromhex(hex_id).decode("utf-8")
    except ValueError:
        return None


def address(value: Optional[str]) -> Optional[str]:
    """The root a hint names (``scheme://host:port``), or ``None`` unless it is a plain
    ``http://`` or ``https://`` address."""
    if not value:
        return None
    try:
        url = urlsplit(value.strip())
    except ValueError:
        return None
    if url.scheme not in ("http", "https") or not url.netloc or url.path not in ("", "/"):
        return None
    if url.query or url.fragment or "@" in url.netloc:
        return None
    return f"{url.scheme}://{url.netloc}"


def resend_at_base(error: httpx.TransportError) -> bool:
    """Whether a request that failed with ``error`` at a hinted address is sent again to the
    base URL: only when no connection was made, so the request cannot have reached a
    process. (After a read timeout it may have; that error is raised, and the next request
    goes to the base URL.)"""
    return isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout))


class Holders:
    """Where each session's holder is, as the last answer about the session named it. It may
    be shared between threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: "OrderedDict[str, str]" = OrderedDict()

    def url(self, path: str) -> Optional[str]:
        """The URL to send a request for ``path`` to, when its session's holder is known."""
        session = session_of(path)
        if session is None:
            return None
        with self._lock:
            root = self._at.get(session)
        return None if root is None else root + path

    def forget(self, path: str) -> None:
        """Forgets the holder of the session ``path`` is about."""
        session = session_of(path)
        if session is not None:
            with self._lock:
                self._at.pop(session, None)

    def learn(self, path: str, response: httpx.Response) -> None:
        """Remembers the holder the answer to a request for ``path`` named; forgets it after a
        503 (the process is not serving the session, or not now) or an answer that names
        none."""
        session = session_of(path)
        if session is None:
            return
        root = None if response.status_code == 503 else address(response.headers.get(HOLDER))
        with self._lock:
            if root is None:
                self._at.pop(session, None)
                return
            self._at[session] = root
            self._at.move_to_end(session)
            while len(self._at) > REMEMBERED:
                self._at.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._at)
