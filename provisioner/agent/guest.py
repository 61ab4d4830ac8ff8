"""Guest attributes written within Compute Engine's rate: about 10 a minute per VM, and what is
written beyond it may be dropped without an error.

Writes that only refresh something (pull progress, usage) are coalesced: the latest value of each
key waits its turn, and they never use the last RESERVED writes of the minute, so that what must
get through (a command's `done-<id>`, readiness, health) always finds room. Those wait for room if
they must, never skip it. Deletes of old attributes count as writes and are coalesced too.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from provisioner.agent.metadata import Metadata, MetadataError
from provisioner.common.clock import Clock

log = logging.getLogger(__name__)

WINDOW_S = 60.0
WRITES_PER_MINUTE = 10
RESERVED = 3
MAX_VALUE = 4000  # a guest attribute's value holds at most 4 KB


class GuestWriter:
    def __init__(self, metadata: Metadata, clock: Clock, per_minute: int = WRITES_PER_MINUTE,
                 reserved: int = RESERVED):
        self.metadata, self.clock = metadata, clock
        self.per_minute, self.reserved = per_minute, reserved
        self._sent: deque[float] = deque()  # when each write of the last minute went
        self._pending: dict[str, str | None] = {}  # coalesced: key -> latest value (None: delete)
        self._last: dict[str, str] = {}  # as last written
        self._wake = asyncio.Event()

    def _room(self) -> int:
        now = self.clock.now()
        while self._sent and self._sent[0] <= now - WINDOW_S:
            self._sent.popleft()
        return self.per_minute - len(self._sent)

    async def _until_room(self, keep: int) -> None:
        while self._room() <= keep:
            await self.clock.sleep(self._sent[0] + WINDOW_S - self.clock.now() + 0.01)

    async def put(self, key: str, value: str, *, urgent: bool = False, only_if_changed: bool = False) -> None:
        """Writes one attribute: `urgent` ones now (or as soon as the rate allows), the others
        when there is room to spare, the latest value only."""
        value = value[:MAX_VALUE]
        if only_if_changed and self._last.get(key) == value and key not in self._pending:
            return
        if not urgent:
            self._pending[key] = value
            self._wake.set()
            return
        self._pending.pop(key, None)  # superseded
        await self._until_room(0)
        await self._write(key, value)

    def delete(self, key: str) -> None:
        self._last.pop(key, None)
        self._pending[key] = None
        self._wake.set()

    async def run(self) -> None:
        """Writes what is pending, within the rate, keeping the reserve free."""
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._until_room(self.reserved)
            if not self._pending:
                continue
            key = next(iter(self._pending))
            value = self._pending.pop(key)
            await self._write(key, value)

    async def _write(self, key: str, value: str | None) -> None:
        """One PUT (or DELETE), retried while the metadata server is unreachable."""
        delay = 0.5
        while True:
            self._sent.append(self.clock.now())
            try:
                if value is None:
                    await self.metadata.delete_guest(key)
                else:
                    await self.metadata.put_guest(key, value)
                    self._last[key] = value
                return
            except MetadataError as err:
                log.warning("writing guest attribute %s failed (%s); retrying", key, err)
                await self.clock.sleep(delay)
                delay = min(delay * 2, 30.0)
                await self._until_room(0)
