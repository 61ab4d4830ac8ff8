"""Abuse detection in the real local fleet, over gRPC on loopback: the simulated cloud reports a
session's usage with its health, the cluster flags and stops a miner, and the flag reaches every
front replica on its capacity stream, which records it once and blocks the user until an operator
lifts the block. A dry run records and blocks nobody; a legitimate training batch is left alone."""

from __future__ import annotations

import asyncio
import time

import pytest
import yaml

from conftest import TIME_SCALE, fleet_config, quick_warm_up, warm_fleet
from provisioner import client as api
from provisioner.agent.usage import Usage
from provisioner.client.credentials import local_ca
from provisioner.common.clock import RealClock
from provisioner.config import load_fleet
from provisioner.cli.serve import start_front
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import types_pb2 as pb

ENDED = (pb.SESSION_STATE_STOPPED, pb.SESSION_STATE_FAILED)
TRAINING = Usage((100,), ("python3.11",), ("bash", "jupyter-lab", "python3.11"), ())


def with_abuse(tmp_path, **abuse):
    fleet_config(tmp_path, quick_warm_up)
    path = tmp_path / "clusters" / "fleet.yaml"
    data = yaml.safe_load(path.read_text())
    data["abuse"] = abuse
    path.write_text(yaml.safe_dump(data))
    return load_fleet(tmp_path / "clusters")


def seconds(ts) -> float:
    return ts.ToNanoseconds() / 1e9


async def until(check, timeout: float = 10.0, what: str = ""):
    """Polls `check` (async) until it returns something true; returns that."""
    deadline = time.monotonic() + timeout
    while not (found := await check()):
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.05)
    return found


async def test_a_miner_is_stopped_and_its_user_blocked_at_every_front_until_unblocked(tmp_path):
    async with warm_fleet(with_abuse(tmp_path), tmp_path / "data") as fleet:
        second = await start_front(load_fleet(tmp_path / "clusters"), RealClock(TIME_SCALE), fleet.data_dir,
                                   address="127.0.0.1:0",
                                   cluster_addresses={c.config.name: c.address for c in fleet.fleet.clusters})
        token, ca = fleet.token("local-operator"), local_ca(fleet.data_dir)
        try:
            await second.fleet.wait_until_ready(timeout_s=10.0)
            s = await fleet.running(await fleet.create(user_id="mal"))
            # What each front replica hears from the session's cluster.
            heard: list[list[str]] = [[], []]
            for front, log in zip((fleet.fleet.front, second), heard):
                client = front.fleet.clients[s.cluster]
                client.on_flags = _spy(client.on_flags, log)
            cluster = fleet.cluster(s.cluster).runtime
            marked_at = cluster.clock.now()
            cluster.backend.mark_miner(s.vm_id, seed=3)

            end = (await fleet.watch_until(s.id, *ENDED, timeout=20))[-1]
            assert end.state == pb.SESSION_STATE_STOPPED
            stopping = next(h for h in end.history if h.state == "stopping")
            assert stopping.reason == "stopped for abuse: miner_program"
            assert seconds(stopping.time) - marked_at <= 600  # within 10 model minutes
            print(f"miner stopped {seconds(stopping.time) - marked_at:.1f} model s after it was marked")

            async with api.AsyncClient(fleet.front_address, token=token, ca=ca) as one, \
                    api.AsyncClient(second.address, token=token, ca=ca) as other:
                await until(_async(lambda: all(heard)), what="both front replicas hear the flag")
                store = fleet.fleet.front.store
                await until(_async(lambda: store.blocks.user_block("mal")), what="the user is blocked")
                for c in (one, other):
                    with pytest.raises(api.UserBlocked):
                        await c.create_session(user_id="mal", accelerator="gpu-p100", image="gpu:latest")
                assert heard[0] == [s.id] and heard[1] == [s.id]  # each replica heard it, once
                (decision,) = store.blocks.abuse_decisions("mal", 10)  # recorded once
                assert decision[0] == s.id and decision[2] == "miner_program" and decision[5] is True
                shown = await fleet.admin.GetUserBlock(admin_pb.GetUserBlockRequest(user_id="mal"))
                assert shown.block.blocked_by == "detector" and shown.block.reason.startswith("miner_program: ")
                assert [d.session_id for d in shown.decisions] == [s.id]

                await fleet.admin.UnblockUser(admin_pb.UnblockUserRequest(user_id="mal"))
                made = [await c.create_session(user_id="mal", accelerator="gpu-p100", image="gpu:latest")
                        for c in (one, other)]  # placed again, at both replicas
                assert all(m.cluster and m.state is not api.SessionState.FAILED for m in made)
                assert store.blocks.user_block("mal") is None  # the flag, sent again, does not block again
        finally:
            await second.stop(0.5)


async def test_a_dry_run_records_the_flag_and_stops_or_blocks_nobody(tmp_path):
    async with warm_fleet(with_abuse(tmp_path, dry_run=True), tmp_path / "data") as fleet:
        s = await fleet.create(user_id="mal")
        # The front's first try to record the flag fails (its store, say): the stream ends, and the
        # next one sends the flag again.
        client = fleet.fleet.front.fleet.clients[s.cluster]
        tries = []

        async def fails_once(decisions):
            tries.append([d.session_id for d in decisions])
            if len(tries) == 1:
                raise RuntimeError("the store is down")
            return await apply(decisions)

        apply, client.on_flags = client.on_flags, fails_once
        fleet.cluster(s.cluster).runtime.backend.mark_miner(s.vm_id, seed=5)

        async def decided():
            shown = await fleet.admin.GetUserBlock(admin_pb.GetUserBlockRequest(user_id="mal"))
            return shown if shown.decisions else None

        shown = await until(decided, what="the decision is recorded")
        assert not shown.HasField("block")
        (d,) = shown.decisions
        assert d.session_id == s.id and d.dry_run and list(d.rules) == ["miner_program"]
        assert tries[:2] == [[s.id], [s.id]]
        now = (await fleet.sessions.GetSession(_get(s.id))).session
        assert now.state == pb.SESSION_STATE_RUNNING
        await fleet.running(await fleet.create(user_id="mal"))


async def test_a_training_batch_at_full_gpu_is_left_alone_and_an_unknown_program_is_not(tmp_path):
    # A 15-minute window (3 s of wall time) instead of the hour: the same rule, sooner.
    async with warm_fleet(with_abuse(tmp_path, batch_busy_window_s=900), tmp_path / "data") as fleet:
        training = await fleet.create(user_id="ann", kind=pb.SESSION_KIND_BATCH)
        other = await fleet.create(user_id="mal", kind=pb.SESSION_KIND_BATCH)
        clusters = {s.id: fleet.cluster(s.cluster).runtime for s in (training, other)}
        started = clusters[training.id].clock.now()
        clusters[training.id].backend.set_usage(training.vm_id, TRAINING)
        clusters[other.id].backend.set_usage(other.vm_id, Usage((100,), ("hashcat",), ("hashcat",), ()))

        end = (await fleet.watch_until(other.id, *ENDED, timeout=30))[-1]
        assert "stopped for abuse: unknown_gpu_program" in [h.reason for h in end.history]
        rt = clusters[training.id]
        await until(_async(lambda: rt.clock.now() - started > 1200), what="20 model minutes")
        now = (await fleet.sessions.GetSession(_get(training.id))).session
        assert now.state == pb.SESSION_STATE_RUNNING and rt.core.sessions[training.id].abuse is None
        assert fleet.fleet.front.store.blocks.abuse_decisions("ann", 10) == []
        assert fleet.fleet.front.store.blocks.abuse_decisions("mal", 10)[0][0] == other.id


def _spy(apply, log: list[str]):
    async def spy(decisions):
        log.extend(d.session_id for d in decisions)
        return await apply(decisions)
    return spy


def _get(session_id: str) -> s_pb.GetSessionRequest:
    return s_pb.GetSessionRequest(session_id=session_id)


def _async(check):
    async def wrapped():
        return check()
    return wrapped
