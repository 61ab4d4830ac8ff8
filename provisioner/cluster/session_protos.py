"""Each session's proto made once per revision, and parsed into every answer that carries it.

Building a session's proto field by field in Python costs about ten times parsing it in
protobuf's C code, and the same sessions are answered again and again: a notebook polling its
session, every front's budget sweep listing every live one. A session's revision grows with every
change of it that is kept (decide/core.py), which Watch already relies on, so a proto made at a
revision stays right until the next, unless the session moved in the queue meanwhile (its place is
a live value, not a change kept): a proto is kept for a revision and a place. Only the read time
differs from one answer to the next.
They are kept serialized: a parse costs what a copy does, and 20,000 protos kept as messages
took 60 MB, as bytes 5 MB.
"""

from __future__ import annotations

from collections import OrderedDict

from provisioner.api import convert
from provisioner.model.records import Session
from provisioner.v1 import types_pb2 as pb

# Protos kept: more than a large cluster's live sessions, so a sweep's full list finds them all.
MAX_KEPT = 20_000


class SessionProtos:
    def __init__(self, max_kept: int = MAX_KEPT):
        self.max_kept = max_kept
        # Oldest made first. An OrderedDict: a dict whose first entry is deleted over and over
        # walks the holes they leave to find the next first one.
        self._kept: OrderedDict[tuple[str, bool], tuple[tuple[int, int], bytes]] = OrderedDict()

    def fill(self, out: pb.Session, s: Session, now: float, brief: bool = False) -> None:
        """Sets `out` to `s` read at `now` (`brief`: without the history and notices)."""
        key = (s.id, brief)
        kept = self._kept.get(key)
        version = (s.revision, s.queue_position)
        if kept is None or kept[0] != version:
            kept = version, self._made(s, brief, version)
            self._kept.pop(key, None)
            self._kept[key] = kept
            if len(self._kept) > self.max_kept:
                self._kept.popitem(last=False)
        out.ParseFromString(kept[1])
        if now:  # as convert.timestamp: zero is no time
            out.read_time.FromNanoseconds(int(now * 1e9))

    def _made(self, s: Session, brief: bool, version: tuple[int, int]) -> bytes:
        full = self._kept.get((s.id, False))
        if brief and full is not None and full[0] == version:  # a session answered whole, then listed
            out = pb.Session.FromString(full[1])
            out.ClearField("history")
            out.ClearField("notices")
            return out.SerializeToString()
        return convert.session_to_pb(s, 0.0, brief).SerializeToString()
