"""A background job that callers ask for without waiting on it: asks that arrive while it runs
make one more run after it, not one each."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

log = logging.getLogger(__name__)


class Coalesced:
    def __init__(self, job: Callable[[], Awaitable[object]], what: str):
        """`what` names the job in the log when a run fails (the next ask runs it again)."""
        self.job, self.what = job, what
        self._task: asyncio.Task | None = None
        self._again = False

    def soon(self) -> None:
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            self._again = False
            try:
                await self.job()
            except Exception:  # noqa: BLE001 - the store or a cluster away: the next ask tries again
                log.exception("could not %s", self.what)
            if not self._again:
                return

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
