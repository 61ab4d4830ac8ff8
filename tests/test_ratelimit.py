"""Rate limits on creates: the pure token buckets, then enforced by a real fleet over gRPC."""

from __future__ import annotations

import grpc
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from provisioner import client as api
from provisioner.client.credentials import local_ca
from provisioner.client.errors import from_rpc_error
from provisioner.config import load_fleet
from provisioner.rules.ratelimit import TokenBuckets, take_all

from conftest import fleet_config, warm_fleet


def test_a_bucket_allows_its_burst_then_one_call_per_refill():
    b = TokenBuckets(rate_per_s=2.0, burst=3)
    for _ in range(3):
        assert b.wait_s("u", 100.0) == 0
        b.take("u", 100.0)
    assert b.wait_s("u", 100.0) == pytest.approx(0.5)
    assert b.wait_s("u", 100.25) == pytest.approx(0.25)
    assert b.wait_s("u", 100.5) == 0
    assert b.wait_s("other", 100.0) == 0  # keys are apart
    assert b.wait_s("u", 1000.0) == 0 and b._tokens("u", 1000.0) == 3  # refills no further than the burst


def test_a_call_refused_by_one_limit_spends_nothing_of_the_others():
    users, callers = TokenBuckets(1.0, 1), TokenBuckets(1.0, 5)
    assert take_all([(users, "u"), (callers, "svc")], 0.0) == (0.0, -1)
    assert take_all([(users, "u"), (callers, "svc")], 0.0) == (pytest.approx(1.0), 0)
    assert callers._tokens("svc", 0.0) == 4
    assert take_all([(users, "v"), (callers, "svc")], 0.0) == (0.0, -1)


def test_full_buckets_are_forgotten_past_the_key_limit():
    b = TokenBuckets(rate_per_s=1.0, burst=1, max_keys=2)
    b.take("a", 0.0)
    b.take("b", 0.0)
    b.take("c", 10.0)  # a and b have long refilled
    assert set(b._buckets) == {"c"}
    assert b.wait_s("a", 10.0) == 0


@given(st.lists(st.floats(0, 0.5), min_size=1, max_size=200), st.floats(0.5, 20), st.integers(1, 10))
def test_never_more_than_the_burst_plus_the_refill(gaps, rate, burst):
    b, now, taken = TokenBuckets(rate, burst), 0.0, 0
    for gap in gaps:
        now += gap
        if b.wait_s("u", now) == 0:
            b.take("u", now)
            taken += 1
        else:
            assert b.wait_s("u", now) <= 1 / rate + 1e-9
    assert taken <= burst + rate * now + 1e-6


def with_rate_limits(tmp_path, **limits):
    fleet_config(tmp_path)
    path = tmp_path / "clusters" / "fleet.yaml"
    data = yaml.safe_load(path.read_text())
    data["rate_limits"].update(limits)
    path.write_text(yaml.safe_dump(data))
    return load_fleet(tmp_path / "clusters")


async def test_creates_over_the_users_or_the_callers_rate_are_refused_with_a_retry_delay(tmp_path):
    config = with_rate_limits(tmp_path, creates_per_user_per_s=0.01, create_burst_per_user=2,
                              creates_per_caller_per_s=0.01, create_burst_per_caller=4)
    async with warm_fleet(config, tmp_path / "data") as fleet:
        for i in range(2):
            await fleet.create(user_id="hasty", request_id=f"h-{i}")
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await fleet.create(user_id="hasty", request_id="h-2")
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        err = from_rpc_error(e.value)
        # The client library reads the delay from RetryInfo: about 100 s for one token at 0.01/s.
        assert type(err) is api.ResourceExhausted and err.reason == "RATE_LIMITED"
        assert 90 < err.retry_after.total_seconds() <= 100
        assert "user 'hasty' may make 0.01 a second after a burst of 2" in err.message
        # Another user has a bucket of its own; the refused create spent nothing of the caller's.
        for user in ("patient", "calm"):
            await fleet.create(user_id=user, request_id="r")
        # The caller (the local operator's service token) has made its 4 now, for every user.
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await fleet.create(user_id="fresh", request_id="r")
        err = from_rpc_error(e.value)
        assert err.reason == "RATE_LIMITED" and "caller 'local-operator'" in err.message
        # Another caller (a user with its own token) is not held back.
        async with api.AsyncClient(fleet.front_address, token=fleet.token("solo"), ca=local_ca(fleet.data_dir)) as c:
            await c.create_session(user_id="solo", accelerator="gpu-p100", image="gpu:latest")


async def test_reads_that_ask_every_cluster_are_limited_per_user_and_caller(tmp_path):
    """A user polling ListSessions or GetQuota in loops makes every cluster work for each call:
    past its burst it is refused with a retry delay, and other users' reads go on."""
    from provisioner.v1 import session_service_pb2 as s_pb
    from provisioner.v1 import session_service_pb2_grpc as s_grpc

    config = with_rate_limits(tmp_path, reads_per_user_per_s=0.01, read_burst_per_user=3)
    async with warm_fleet(config, tmp_path / "data") as fleet:
        async with fleet.front_channel(fleet.token("mal")) as ch:
            stub = s_grpc.SessionServiceStub(ch)
            for _ in range(2):
                await stub.ListSessions(s_pb.ListSessionsRequest(), timeout=10)
            await stub.GetQuota(s_pb.GetQuotaRequest(), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.ListSessions(s_pb.ListSessionsRequest(), timeout=10)
            err = from_rpc_error(e.value)
            assert err.reason == "RATE_LIMITED" and "user 'mal'" in err.message and err.retry_after.total_seconds() > 90
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.GetQuota(s_pb.GetQuotaRequest(), timeout=10)
        await fleet.sessions.ListSessions(s_pb.ListSessionsRequest(user_id="bob"), timeout=10)  # bob reads on
