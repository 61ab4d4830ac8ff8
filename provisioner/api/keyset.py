"""Keyset pages of session lists, at a cluster and across clusters.

Sessions are listed newest first: by the key (creation time in nanoseconds, id), descending. A
page resumes after the key of the last row it has given, so a page costs a page wherever the
rows come from (an index in memory, an index of the store), and sessions made between two pages
neither shift nor repeat the rows of the next one (they sort before the position).

Each source of rows (the cluster's memory, its store; each cluster, for the front) answers "the
rows after P" with a `Part`: up to a page of rows, and `more_after`, the key of the last row it
examined when it stopped before its end (None: nothing after its rows). `merge` makes one page of
several parts: only rows that every unfinished source has walked past may be given, so the page
is a prefix of the merged order, and each source's next position follows from it.

Tokens are opaque to callers but not secret: a forged position only moves within what the caller
may list anyway (a cluster filters by user before paging). They are validated strictly, and a
front's token names the query it belongs to, so a token from another query is refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import json
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence, TypeVar

from provisioner.model.errors import InvalidArgument

T = TypeVar("T")
Key = tuple[int, str]  # (creation time in ns, session id); lists run from the greatest key down

_ID = re.compile(r"[a-z]([a-z0-9-]{0,38}[a-z0-9])?\.s-[0-9a-f]{4,64}")
_MAX_NS = 253_402_300_799 * 10**9  # the last second of year 9999 (what Timestamp allows)
MAX_TOKEN_CHARS = 8192  # a front's token carries a position per cluster


@dataclass(frozen=True)
class Part:
    rows: list  # in list order (greatest key first), each after the position asked for
    more_after: Key | None  # the source may hold rows after this key; None: none after `rows`


def merge(parts: Sequence[Part], key_of: Callable[[T], Key], limit: int) -> tuple[list[T], list[Key | None]]:
    """One page of at most `limit` rows from the parts, and where each source goes on from (None:
    it has nothing left). A row is given only if no unfinished source may hold a row before it."""
    cut = max((p.more_after for p in parts if p.more_after is not None), default=None)
    merged = heapq.merge(*(p.rows for p in parts), key=key_of, reverse=True)
    taken = []
    for row in merged:
        if len(taken) == limit or (cut is not None and key_of(row) < cut):
            break
        taken.append(row)
    # Every row of every source down to `last` is given (or does not exist), so a source with rows
    # left resumes after `last`; one whose rows were all given resumes where it stopped walking.
    last = key_of(taken[-1]) if taken else cut
    positions = []
    for p in parts:
        given_all = not p.rows or (taken and key_of(p.rows[-1]) >= key_of(taken[-1]))
        positions.append(p.more_after if given_all else last)
    return taken, positions


# ---- a cluster's token: one position --------------------------------------------------------

def encode_position(position: Key) -> str:
    return base64.urlsafe_b64encode(f"{position[0]}.{position[1]}".encode()).decode().rstrip("=")


def decode_position(token: str, field: str = "page_token") -> Key | None:
    """The position a cluster's token names ("" is the start); INVALID_ARGUMENT if it names none."""
    if not token:
        return None
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("ascii")
        ns, session_id = text.split(".", 1)
        position = (int(ns), session_id)
    except (ValueError, UnicodeDecodeError, binascii.Error):
        raise InvalidArgument(f"{field} is not a page token this service issued", field=field) from None
    _check_position(position, field)
    return position


def _check_position(position: Key, field: str) -> None:
    ns, session_id = position
    if not (0 <= ns <= _MAX_NS) or not _ID.fullmatch(session_id):
        raise InvalidArgument(f"{field} is not a page token this service issued", field=field)


# ---- a front's token: a position per cluster, for one query ----------------------------------

def query_fingerprint(*parts: object) -> str:
    """What names a query (user, filters...): a token is good only for the query it came from."""
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:16]


def encode_positions(query: str, positions: dict[str, Key | None]) -> str:
    """A front's next-page token: each unfinished cluster's position (None: from its start); a
    finished one is left out."""
    body = {"q": query, "p": {name: list(p) if p else None for name, p in sorted(positions.items())}}
    return base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_positions(token: str, query: str, clusters: Iterable[str],
                     field: str = "page_token") -> dict[str, Key | None] | None:
    """The clusters a front's token says to go on with, each from its position (None: from its
    start); None without a token (the first page). INVALID_ARGUMENT for a token that is
    malformed, names a cluster the listing does not cover, or belongs to another query."""
    if not token:
        return None
    bad = InvalidArgument(f"{field} is not a page token this service issued", field=field)
    if len(token) > MAX_TOKEN_CHARS:
        raise bad
    try:
        body = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if set(body) != {"q", "p"} or not isinstance(body["p"], dict):
            raise bad
        named = {name: None if v is None else _position_of(v) for name, v in body["p"].items()}
    except (ValueError, TypeError, KeyError, AttributeError, binascii.Error):
        raise bad from None
    if body["q"] != query:
        raise InvalidArgument(f"{field} belongs to another listing (a different user, cluster or filter); "
                              "start again without a token", field=field)
    if not set(named) <= set(clusters):
        raise bad
    for position in named.values():
        if position is not None:
            _check_position(position, field)
    return named


def _position_of(value: object) -> Key:
    if not (isinstance(value, list) and len(value) == 2 and type(value[0]) is int and isinstance(value[1], str)):
        raise ValueError("not a position")
    return value[0], value[1]
