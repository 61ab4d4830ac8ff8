"""A session or VM as a core has it now, for tests that hold one across steps: the core's replies
and reads are frozen values as of their step, so a test that waits for a session to run holds a
Live, which finds the record's current value by id at each read."""

from __future__ import annotations

from typing import Callable


class Live:
    """Reads its record's value as it is now (`now(id)`, None once the core let go of it: then the
    last value it found, or the one it was made from)."""

    __slots__ = ("id", "_now", "_last")

    def __init__(self, record, now: Callable[[str], object]):
        self.id, self._now, self._last = record.id, now, record

    def current(self):
        value = self._now(self.id)
        if value is None:
            return self._last
        self._last = value
        return value

    def __getattr__(self, name: str):
        return getattr(self.current(), name)

    def __eq__(self, other: object) -> bool:
        return self.current() == (other.current() if isinstance(other, Live) else other)

    __hash__ = None

    def __repr__(self) -> str:
        return f"Live({self.current()!r})"


def follow(rt) -> Callable[[object], Live]:
    """For a cluster runtime: each session as its core has it now, else as its last durable step
    left it (after it left memory)."""
    seen: dict[str, object] = {}
    rt.observers.append(lambda sessions, restored: seen.update((s.id, s) for s in sessions))
    return lambda record: Live(record, lambda i: rt.core.sessions.get(i) or rt.core.vms.get(i) or seen.get(i))
