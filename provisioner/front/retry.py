"""Which failures of a call to a cluster are worth repeating, and how: exponential backoff with
full jitter (the same as a create's Allocate tries, front/attempts.py), bounded in tries and in
time (never past the caller's deadline)."""

from __future__ import annotations

import asyncio
import random
import time

import grpc

from provisioner.api.status import RemoteError
from provisioner.front.attempts import TRIES, backoff

# The call may or may not have taken effect: the request or its reply was lost, or it timed out.
AMBIGUOUS = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                       grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN})
# For a call whose caller gave no deadline.
DEFAULT_DEADLINE_S = 30.0

_rng = random.Random()


def ambiguous(err: BaseException) -> bool:
    return isinstance(err, RemoteError) and err.code in AMBIGUOUS


async def call(rpc, request, timeout: float | None = None, tries: int = TRIES):
    """An RPC to a cluster, made up to `tries` times on ambiguous failures (more than once only
    for idempotent calls) while the next try would start within `timeout` (else 30 s) of the
    first; the last error status goes back to our caller unchanged."""
    # Wall time on purpose, as the call's own deadline is: the backoff waits out a network's blip.
    deadline = time.monotonic() + (timeout or DEFAULT_DEADLINE_S)
    try_no = 1
    while True:
        try:
            return await rpc(request, timeout=timeout)
        except grpc.aio.AioRpcError as err:
            failure = RemoteError(err)
        wait_s = backoff(try_no + 1, _rng)
        if try_no >= tries or not ambiguous(failure) or time.monotonic() + wait_s >= deadline:
            raise failure from None
        await asyncio.sleep(wait_s)
        try_no += 1
