"""front/retry.py: which failed calls to a cluster are tried again, and how often."""

from __future__ import annotations

import grpc
import pytest

from provisioner.api.status import RemoteError
from provisioner.front import retry


class Flaky:
    """An RPC that fails with `codes` in turn, then answers "ok"."""

    def __init__(self, *codes: grpc.StatusCode):
        self.codes, self.calls = list(codes), 0

    async def __call__(self, request, timeout=None):
        self.calls += 1
        if self.codes:
            code = self.codes.pop(0)
            raise grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=code.name)
        return "ok"


async def test_an_ambiguous_failure_is_tried_again():
    rpc = Flaky(grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert await retry.call(rpc, None, timeout=5.0) == "ok"
    assert rpc.calls == 3


async def test_a_definite_failure_is_not():
    rpc = Flaky(grpc.StatusCode.NOT_FOUND)
    with pytest.raises(RemoteError) as raised:
        await retry.call(rpc, None, timeout=5.0)
    assert raised.value.code is grpc.StatusCode.NOT_FOUND
    assert rpc.calls == 1


async def test_tries_are_bounded_and_the_last_failure_is_raised():
    rpc = Flaky(grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    with pytest.raises(RemoteError) as raised:
        await retry.call(rpc, None, timeout=5.0, tries=3)
    assert raised.value.code is grpc.StatusCode.CANCELLED
    assert rpc.calls == 3
    once = Flaky(grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(RemoteError):
        await retry.call(once, None, tries=1)
    assert once.calls == 1


async def test_no_try_starts_past_the_deadline(monkeypatch):
    monkeypatch.setattr(retry, "backoff", lambda try_no, rng: 10.0)  # every wait would overrun
    rpc = Flaky(grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(RemoteError):
        await retry.call(rpc, None, timeout=1.0)
    assert rpc.calls == 1
