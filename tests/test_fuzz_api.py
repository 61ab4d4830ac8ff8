"""A fuzzer over every RPC of SessionService, AdminService and ClusterService, against the real
local fleet over gRPC: the front's port and each cluster's own.

Requests are random messages (empty, huge, unicode and control-character strings, ids of real and
made-up things, out-of-range and non-finite numbers, unknown enum values, long repeated fields),
raw bytes (garbage, truncated and corrupted messages, invalid UTF-8, wrong wire types, deep
nesting, 4 MB+ bodies), 1 ms deadlines, calls without credentials or with a bad token, and
streams opened and cancelled. Whatever comes in: no call ends UNKNOWN or INTERNAL, no error
message is longer than a short quote of the input would make it, nothing logs a traceback, and
afterwards the fleet still takes a session from create to running to stop.

The default suite sends a few hundred requests; the `long` test sends 5,000 (more, and another
seed, from the environment: see LONG_COUNT). With `-s` each run prints the requests sent per RPC
and the codes that came back.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import traceback
from collections import Counter
from dataclasses import dataclass

import grpc
import pytest

from fuzz_inputs import ANONYMOUS, OPERATOR, PLAINTEXT, TIMEOUT_S, USER, Case, Gen, wire_len, wire_tag, all_rpcs, cases
from provisioner.client.credentials import local_ca
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import cluster_service_pb2_grpc as cluster_grpc
from provisioner.v1 import session_service_pb2 as session_pb
from provisioner.v1 import types_pb2 as pb

# A deeper run: PROVISIONER_FUZZ_REQUESTS=50000 PROVISIONER_FUZZ_SEED=7 pytest -m long tests/test_fuzz_api.py -s
SEED = int(os.environ.get("PROVISIONER_FUZZ_SEED", "20241112"))
SHORT_COUNT = 400
LONG_COUNT = int(os.environ.get("PROVISIONER_FUZZ_REQUESTS", "5000"))
CONCURRENCY = 24
STREAM_READ_S = 0.2  # how long a fuzzed stream is followed before it is cancelled
# Longest error message accepted: a sentence plus a quoted prefix of the input (errors.quote).
MAX_DETAILS = 512
NEVER = {"UNKNOWN", "INTERNAL"}
LIVE = [pb.SESSION_STATE_QUEUED, pb.SESSION_STATE_PROVISIONING, pb.SESSION_STATE_PULLING_IMAGE,
        pb.SESSION_STATE_RUNNING]

async def send(channel: grpc.aio.Channel, case: Case) -> tuple[str, str]:
    """(code name, details) of the call; a stream still open after STREAM_READ_S is cancelled
    and reported as OPEN."""
    rpc = case.rpc
    try:
        if not rpc.streaming:
            await channel.unary_unary(rpc.path)(case.body, timeout=case.timeout, metadata=case.metadata)
            return "OK", ""
        call = channel.unary_stream(rpc.path)(case.body, timeout=case.timeout, metadata=case.metadata)
        try:
            async with asyncio.timeout(STREAM_READ_S):
                received = 0
                async for _ in call:
                    received += 1
                    if received == 2:
                        break
        except TimeoutError:
            pass
        if call.done():
            code = await call.code()
            return code.name, await call.details() or ""
        call.cancel()
        return "OPEN", ""
    except grpc.aio.AioRpcError as err:
        return err.code().name, err.details() or ""
    except Exception as err:  # the case itself is broken: fail the run instead of losing a worker
        return f"CLIENT {type(err).__name__}", str(err)


@dataclass
class Tally:
    sent: Counter
    codes: Counter
    by_rpc: dict
    longest_details: str = ""
    offenders: list | None = None

    def add(self, case: Case, code: str, details: str) -> None:
        sender = "peer" if case.sender == USER and case.rpc.where != "front" else case.sender
        name = case.rpc.name + ("" if sender == OPERATOR else f" ({sender})")
        self.sent[case.rpc.name] += 1
        self.codes[code] += 1
        self.by_rpc.setdefault(name, Counter())[code] += 1
        if len(details) > len(self.longest_details):
            self.longest_details = details
        if code in NEVER or code.startswith("CLIENT") or len(details) > MAX_DETAILS:
            self.offenders.append((case.rpc.name, code, details[:300], case.body[:80], len(case.body)))

    def report(self, seconds: float) -> str:
        lines = [f"fuzz: {sum(self.sent.values())} requests in {seconds:.1f} s; codes: "
                 + ", ".join(f"{c} {n}" for c, n in self.codes.most_common())]
        for name in sorted(self.by_rpc):
            lines.append(f"  {name:42} {sum(self.by_rpc[name].values()):5}  "
                         + ", ".join(f"{c} {n}" for c, n in self.by_rpc[name].most_common()))
        lines.append(f"  longest error message: {len(self.longest_details)} characters")
        return "\n".join(lines)


async def good_values(handle) -> dict[str, list]:
    """Valid values by field name, naming real things (sessions, VMs, clusters, pools), so that
    fuzzed requests also reach the code behind the first checks."""
    sessions = [await handle.create(user_id="fuzz-owner", kind=kind) for kind in (1, 2)]
    vms = (await handle.admin.ListVms(admin_pb.ListVmsRequest(), timeout=TIMEOUT_S)).vms
    clusters = [c.config.name for c in handle.fleet.clusters]
    pools = sorted({p.name for c in handle.fleet.clusters for p in c.config.pools})
    return {
        "session_id": [s.id for s in sessions], "request_id": [s.spec.request_id for s in sessions] + ["fuzz-1"],
        "user_id": ["fuzz-owner", "fuzz-other"], "notebook_id": ["nb-1"], "cluster": clusters,
        "region_hint": ["us-central1", "europe-west4", "asia-east1"], "pool": pools, "accelerator": pools,
        "image": ["gpu:v154", "gpu:latest", "gpu", "gpu:v101"], "vm_id": [vm.id for vm in vms[:4]],
        "reason": ["fuzzed"], "autoscaler": ["fixed", "headroom", "predictive"], "identity": ["fuzz-owner"],
        "rpc": ["DrainCluster"], "outcome": ["ok", "denied"], "page_token": ["", "50"],
        "kind": [1, 2], "page_size": [0, 1, 500], "count": [1, 2], "after_revision": [0, 1, 3],
        "min_vms": [0, 1, 2], "max_vms": [5, 10], "headroom_fraction": [0.0, 0.3], "min_interval_s": [0.1],
        "states": [1, 4], "region_required": [False, True], "recycle": [True, False],
    }


async def fuzz(handle, count: int, seed: int = SEED) -> Tally:
    clusters = [c.config.name for c in handle.fleet.clusters]
    ca = grpc.ssl_channel_credentials(local_ca(handle.data_dir).read_bytes())
    channels = {
        ("front", OPERATOR): handle.channel,
        ("front", USER): handle.front_channel(handle.token("fuzz-owner")),
        ("front", ANONYMOUS): grpc.aio.secure_channel(handle.front_address, ca),
        ("front", PLAINTEXT): grpc.aio.insecure_channel(handle.front_address),
    }
    for i, name in enumerate(clusters):
        other = clusters[(i + 1) % len(clusters)]
        channels[name, OPERATOR] = handle.cluster_channel(name)
        channels[name, USER] = handle.cluster_channel(name, as_process=f"cluster-{other}")
        channels[name, ANONYMOUS] = grpc.aio.secure_channel(handle.cluster(name).address, ca, options=[
            ("grpc.ssl_target_name_override", handle.security.cluster_name(name))])
        channels[name, PLAINTEXT] = grpc.aio.insecure_channel(handle.cluster(name).address)
    owned = [c for c in channels.values() if c is not handle.channel]

    gen = Gen(seed, await good_values(handle))
    tally = Tally(Counter(), Counter(), {}, offenders=[])
    queue: asyncio.Queue = asyncio.Queue(maxsize=CONCURRENCY)

    async def worker():
        while (case := await queue.get()) is not None:
            channel = channels[case.rpc.where, case.sender]
            tally.add(case, *await send(channel, case))

    workers = [asyncio.create_task(worker()) for _ in range(CONCURRENCY)]
    try:
        for case in cases(gen, all_rpcs(clusters), count):
            await queue.put(case)
        for _ in workers:
            await queue.put(None)
        await asyncio.gather(*workers)
    finally:
        for w in workers:
            w.cancel()
        for channel in owned:
            await channel.close()
    return tally


async def restore(handle) -> None:
    """Undoes what fuzzed operator calls did: undrains, puts each pool's policy back as its
    config says, and stops the sessions fuzzed creates made."""
    for proc in handle.fleet.clusters:
        await handle.admin.UndrainCluster(admin_pb.UndrainClusterRequest(cluster=proc.config.name), timeout=TIMEOUT_S)
        for p in proc.config.pools:
            await handle.admin.SetPoolPolicy(admin_pb.SetPoolPolicyRequest(
                cluster=proc.config.name, pool=p.name, reset=True), timeout=TIMEOUT_S)
        channel = handle.cluster_channel(proc.config.name)
        try:
            stub = cluster_grpc.ClusterServiceStub(channel)
            live = await stub.List(cluster_pb.ListRequest(states=LIVE, page_size=500), timeout=TIMEOUT_S)
            for s in live.sessions:
                await stub.Stop(cluster_pb.StopRequest(session_id=s.id, reason="fuzz over"), timeout=TIMEOUT_S)
        finally:
            await channel.close()


async def serves_a_session(handle) -> None:
    session = await handle.create(user_id="after-fuzz", region_hint="us-central1")
    await handle.watch_until(session.id, pb.SESSION_STATE_RUNNING, timeout=30)
    resp = await handle.sessions.StopSession(session_pb.StopSessionRequest(session_id=session.id), timeout=TIMEOUT_S)
    assert resp.session.state in (pb.SESSION_STATE_STOPPING, pb.SESSION_STATE_STOPPED)
    await handle.watch_until(session.id, pb.SESSION_STATE_STOPPED, timeout=30)


def tracebacks(caplog) -> list[str]:
    """Each logged traceback: its logger, message and the last lines of its exception."""
    out = []
    for r in caplog.records:
        if r.exc_info or "Traceback" in r.getMessage():
            tail = "".join(traceback.format_exception(*r.exc_info)[-3:]) if r.exc_info else ""
            out.append(f"{r.name}: {r.getMessage()[:300]}\n{tail[-600:]}")
    return out


async def run(handle, caplog, count: int) -> None:
    caplog.set_level(logging.WARNING)
    started = time.monotonic()
    tally = await fuzz(handle, count)
    print("\n" + tally.report(time.monotonic() - started))
    assert sum(tally.sent.values()) == count
    assert len(tally.sent) == len(all_rpcs([c.config.name for c in handle.fleet.clusters]))  # every RPC, everywhere
    assert tally.offenders == []
    await restore(handle)
    await serves_a_session(handle)
    assert tracebacks(caplog) == []


async def test_the_reported_inputs_are_refused_with_short_errors(local_fleet, caplog):
    """What the issue found: 2 MB notebook ids stored (that user's lists then failed for good),
    16 KB ids echoed into error details, garbage bytes answered UNKNOWN."""
    caplog.set_level(logging.WARNING)
    handle = local_fleet
    with pytest.raises(grpc.aio.AioRpcError) as big:
        await handle.create(user_id="nb-user", notebook_id="n" * 2_000_000)
    assert big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # over the 64 KiB request limit
    with pytest.raises(grpc.aio.AioRpcError) as long_nb:
        await handle.create(user_id="nb-user", notebook_id="n" * 4_000)
    assert long_nb.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "spec.notebook_id" in long_nb.value.details()
    listed = await handle.sessions.ListSessions(session_pb.ListSessionsRequest(user_id="nb-user"), timeout=TIMEOUT_S)
    assert list(listed.sessions) == []

    for session_id in ("us-central1.s-" + "f" * 16_000, "x" * 4_096, "us-central1\x00.s-00"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await handle.sessions.GetSession(session_pb.GetSessionRequest(session_id=session_id), timeout=TIMEOUT_S)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(err.value.details()) < 200
        assert sum(len(v) for _, v in err.value.trailing_metadata() or ()) < 2_000

    garbage = handle.channel.unary_unary("/provisioner.v1.SessionService/GetSession")
    for body in (b"\xff" * 50, wire_len(1, b"\xed\xa0\x80"), wire_tag(1, 0) + b"\xff" * 11):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await garbage(body, timeout=TIMEOUT_S)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert tracebacks(caplog) == []


async def test_fuzz_every_rpc_short(local_fleet, caplog):
    await run(local_fleet, caplog, SHORT_COUNT)


@pytest.mark.long
async def test_fuzz_every_rpc_long(local_fleet, caplog):
    await run(local_fleet, caplog, LONG_COUNT)


def test_generator_is_deterministic_and_varied():
    rpcs = all_rpcs(["us-central1"])
    good = {"cluster": ["us-central1"], "session_id": ["us-central1.s-00ff00ff00"]}
    first = [(c.rpc.path, c.body, c.timeout) for c in cases(Gen(7, good), rpcs, 300)]
    again = [(c.rpc.path, c.body, c.timeout) for c in cases(Gen(7, good), rpcs, 300)]
    assert first == again
    assert {p for p, _, _ in first} == {r.path for r in rpcs}
    assert len({b for _, b, _ in first}) > len(first) // 2
    assert any(t == 0.001 for _, _, t in first)
