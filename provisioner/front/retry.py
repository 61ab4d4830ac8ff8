"""Which failures of a call to a cluster are worth repeating, and how: tenacity with exponential
backoff and full jitter, bounded in attempts and in time (never past the caller's deadline)."""

from __future__ import annotations

import grpc
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_random_exponential

from provisioner.api.status import RemoteError
# One backoff for every call to a cluster; placement's Allocate tries follow it too.
from provisioner.front.attempts import BACKOFF_S, MAX_BACKOFF_S, TRIES

# The call may or may not have taken effect: the request or its reply was lost, or it timed out.
AMBIGUOUS = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                       grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN})
# For a call whose caller gave no deadline.
DEFAULT_DEADLINE_S = 30.0


def ambiguous(err: BaseException) -> bool:
    return isinstance(err, RemoteError) and err.code in AMBIGUOUS


def retrying(budget_s: float, tries: int = TRIES) -> AsyncRetrying:
    """Repeats on ambiguous failures only; the last failure is raised as it was."""
    return AsyncRetrying(
        retry=retry_if_exception(ambiguous),
        stop=stop_after_attempt(tries) | stop_after_delay(max(0.0, budget_s)),
        wait=wait_random_exponential(multiplier=BACKOFF_S, max=MAX_BACKOFF_S),
        reraise=True,
    )


async def call(rpc, request, timeout: float | None = None, tries: int = TRIES):
    """An RPC to a cluster, made up to `tries` times on ambiguous failures (more than once only
    for idempotent calls); the last error status goes back to our caller unchanged."""
    async for try_ in retrying(timeout or DEFAULT_DEADLINE_S, tries):
        with try_:
            try:
                return await rpc(request, timeout=timeout)
            except grpc.aio.AioRpcError as err:
                raise RemoteError(err) from None
