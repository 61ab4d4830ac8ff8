"""One create at a time per user across every front replica sharing a store.

A create checks the user's quota and then places the session; two replicas doing that at once
for one user could both pass the check for the last slot or the last hours. So each create holds
the user's lease, a row in the shared store taken atomically, from before the check until the
placement has answered (the session is then in its cluster's records, where the next check
counts it). The holder renews it while it works; a holder that dies (SIGKILL) stops renewing
and its lease lapses after LEASE_S. Expiry is wall time, like a gRPC deadline: it is judged by
other processes, and the fleet's clock may be sped up.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable

from provisioner.errors import Unavailable, quote
from provisioner.store import Store

log = logging.getLogger(__name__)

LEASE_S = 5.0  # how long a holder that stopped renewing keeps the lease
RENEW_EVERY_S = 1.0
POLL_S = 0.01  # how often a waiting create asks again


class UserLeases:
    def __init__(self, store: Store, wall: Callable[[], float] = time.time):
        self.store = store
        self.wall = wall
        self._releasing: set[asyncio.Task] = set()

    @asynccontextmanager
    async def held(self, user_id: str, wait_s: float) -> AsyncIterator[None]:
        """Holds `user_id`'s lease, waiting at most `wait_s` for it, else Unavailable (retryable)."""
        holder = uuid.uuid4().hex
        give_up = self.wall() + wait_s
        # Writes go through the store's group commit: durable, and not on the event loop.
        while not await self.store.commit(self.store.try_user_lease, user_id, holder, self.wall() + LEASE_S,
                                          self.wall()):
            if self.wall() >= give_up:
                raise Unavailable(f"another create for user {quote(user_id)} is still being placed; retry",
                                  retry_after_s=POLL_S * 10)
            await asyncio.sleep(POLL_S)  # wall time, like the expiry
        renewing = asyncio.create_task(self._renew(user_id, holder))
        try:
            yield
        finally:
            renewing.cancel()
            # The create's answer does not wait for the release: its session is already in its
            # cluster's records, where the next check counts it. A task, so a create its caller
            # cancelled still frees the lease at once.
            release = asyncio.create_task(self._release(user_id, holder))
            self._releasing.add(release)
            release.add_done_callback(self._releasing.discard)

    async def _release(self, user_id: str, holder: str) -> None:
        try:
            await self.store.commit(self.store.release_user_lease, user_id, holder)
        except Exception:
            # The create's outcome stands; the lease lapses on its own after LEASE_S.
            log.exception("could not release the create lease of user %s", quote(user_id))

    async def flush(self) -> None:
        """Waits for the releases under way (before the store closes)."""
        await asyncio.gather(*self._releasing, return_exceptions=True)

    async def _renew(self, user_id: str, holder: str) -> None:
        while True:
            await asyncio.sleep(RENEW_EVERY_S)
            try:
                held = await self.store.commit(self.store.renew_user_lease, user_id, holder, self.wall() + LEASE_S)
            except Exception:
                log.exception("could not renew the create lease of user %s", quote(user_id))
                continue
            if not held:
                # Only if this front stalled for LEASE_S: another create of the user may run now.
                log.warning("the create lease of user %s lapsed while held", quote(user_id))
                return
