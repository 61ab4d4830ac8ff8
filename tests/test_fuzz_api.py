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
import random
import struct
import time
import traceback
from collections import Counter
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor as F
from google.protobuf.message import Message

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
TIMEOUT_S = 10.0
# Longest error message accepted: a sentence plus a quoted prefix of the input (errors.quote).
MAX_DETAILS = 512
NEVER = {"UNKNOWN", "INTERNAL"}
LIVE = [pb.SESSION_STATE_QUEUED, pb.SESSION_STATE_PROVISIONING, pb.SESSION_STATE_PULLING_IMAGE,
        pb.SESSION_STATE_RUNNING]

INT32 = [0, 1, -1, 2, 3, 10, 50, 499, 500, 501, 1000, 65_535, 2**31 - 1, -2**31]
INT64 = INT32 + [2**53, 2**62, 2**63 - 1, -2**63]
REALS = [0.0, -0.0, 0.5, 1.0, 3.0, 100.0, 100.5, -1.0, 1e-300, 5e-324, 1e308, float("inf"), float("-inf"),
         float("nan")]
# Strings that have hurt parsers somewhere.
NASTY = ["%s%n%x", "{0}", "' OR '1'='1", "../../etc/passwd", "\\", "*", "null", "-1", "1e309", "NaN",
         "9" * 30, "0" * 10, ".", "..s-", "us-central1.s-", "us-central1.s-" + "f" * 64, "a" * 41 + ".s-00",
         "Bearer x", "gpu:", ":v1", "gpu:latest:latest", "GPU:V154", " gpu:v154", "gpu-p100 ", "\ufeffalice",
         "alice/bob", "alice\x00", "\u202egnp.exe", "\u200b", "\U0001f600" * 3, "caf\u00e9", "\uffff", "\U0010ffff"]
UNICODE = [0x00, 0x01, 0x09, 0x0A, 0x1B, 0x7F, 0x85, 0xA0, 0xE9, 0x300, 0x5D0, 0x202E, 0x200B, 0x2028, 0xFEFF,
           0xFFFD, 0xFFFF, 0x1F600, 0x10FFFF, 0x41, 0x61, 0x2E, 0x2F, 0x3A]
LONG_LENGTHS = [41, 64, 65, 129, 257, 513, 4_096, 16_384, 70_000]
HUGE = 2_000_000
# Invalid UTF-8 where a string goes: a UTF-8-encoded surrogate, stray bytes, an overlong NUL,
# a code point above U+10FFFF.
BAD_UTF8 = [b"\xed\xa0\x80", b"\xff", b"a\x80b", b"\xc0\x80", b"\xf4\x90\x80\x80", b"\xed\xbf\xbf" * 100]


@dataclass(frozen=True)
class Rpc:
    where: str  # "front" or a cluster's name
    path: str  # /package.Service/Method
    request: type[Message]
    streaming: bool

    @property
    def name(self) -> str:
        return f"{self.where}:{self.path.rsplit('.', 1)[-1]}"


def all_rpcs(clusters: list[str]) -> list[Rpc]:
    services = {"front": [(session_pb, "SessionService"), (admin_pb, "AdminService")]}
    for name in clusters:
        services[name] = [(cluster_pb, "ClusterService"), (admin_pb, "AdminService")]
    out = []
    for where, defs in services.items():
        for module, service in defs:
            for m in module.DESCRIPTOR.services_by_name[service].methods:
                out.append(Rpc(where, f"/{m.containing_service.full_name}/{m.name}",
                               message_factory.GetMessageClass(m.input_type), m.server_streaming))
    return out


# ---- what gets sent ------------------------------------------------------------------------

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _tag(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _len(number: int, body: bytes) -> bytes:
    return _tag(number, 2) + _varint(len(body)) + body


class Gen:
    """Deterministic for a seed: the same cases in the same order every run."""

    def __init__(self, seed: int, good: dict[str, list]):
        self.rng = random.Random(seed)
        self.good = good  # field name -> values that name real things
        self.known = [v for values in good.values() for v in values if isinstance(v, str) and v]

    def text(self) -> str:
        r = self.rng
        kind = r.randrange(10)
        if kind == 0:
            return ""
        if kind in (1, 2):
            return r.choice(self.known)
        if kind == 3:  # a real value, bent
            v = r.choice(self.known)
            return r.choice([v.upper(), v[: r.randrange(len(v) + 1)], v + r.choice(NASTY), v + "/" + v, v * 30,
                             v.replace("-", "_"), v + "\n", "\x00" + v])
        if kind == 4:
            return "".join(chr(r.randrange(0x20, 0x7F)) for _ in range(r.randint(1, 40)))
        if kind == 5:
            return "".join(chr(r.choice(UNICODE)) for _ in range(r.randint(1, 30)))
        if kind == 6:
            return r.choice("xa.-\u00e9\U0001f600") * r.choice(LONG_LENGTHS)
        if kind == 7 and r.random() < 0.04:
            return "x" * HUGE
        return r.choice(NASTY)

    def number(self, field) -> int | float | bool:
        r = self.rng
        t = field.type
        if t == F.TYPE_BOOL:
            return r.random() < 0.5
        if t in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
            return r.choice(REALS) if r.random() < 0.8 else r.uniform(-1e6, 1e6)
        if t == F.TYPE_ENUM:
            known = [v.number for v in field.enum_type.values]
            return r.choice(known + [len(known), 99, -1, 2**31 - 1, -2**31])
        if t in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64):
            return r.choice(INT64) if r.random() < 0.8 else r.randint(-2**63, 2**63 - 1)
        return r.choice(INT32) if r.random() < 0.8 else r.randint(-2**31, 2**31 - 1)

    def message(self, cls: type[Message], depth: int = 0) -> Message:
        msg = cls()
        self._fill(msg, depth)
        return msg

    def near_valid(self, cls: type[Message]) -> Message:
        """A request naming real things, with one or two fields (maybe none) fuzzed: these get
        past the first checks into the code behind them."""
        msg = cls()
        self._fill(msg, 0, good=True)
        fields = [f for f in cls.DESCRIPTOR.fields if f.type != F.TYPE_MESSAGE]
        for field in self.rng.sample(fields, min(len(fields), self.rng.choice([0, 1, 1, 2]))):
            msg.ClearField(field.name)
            value = self.text() if field.type == F.TYPE_STRING else self.number(field)
            if field.is_repeated:
                getattr(msg, field.name).append(value)
            else:
                setattr(msg, field.name, value)
        return msg

    def _fill(self, msg: Message, depth: int, good: bool = False) -> None:
        r = self.rng
        for field in msg.DESCRIPTOR.fields:
            if good:
                if field.type == F.TYPE_MESSAGE and field.message_type.full_name.startswith("provisioner."):
                    getattr(msg, field.name).SetInParent()
                    self._fill(getattr(msg, field.name), depth + 1, good)
                elif field.name in self.good and field.containing_oneof is None and r.random() < 0.9:
                    value = r.choice(self.good[field.name])
                    if field.is_repeated:
                        getattr(msg, field.name).append(value)
                    else:
                        setattr(msg, field.name, value)
                continue
            if r.random() < 0.4:
                continue
            n = r.choice([1, 1, 2, 3, 33, 1_000]) if field.is_repeated else 1
            for _ in range(n):
                if field.type == F.TYPE_MESSAGE:
                    if depth > 3:
                        break
                    sub = getattr(msg, field.name).add() if field.is_repeated else getattr(msg, field.name)
                    sub.SetInParent()
                    self._fill(sub, depth + 1)
                    continue
                value = self.text() if field.type == F.TYPE_STRING else self.number(field)
                if field.is_repeated:
                    getattr(msg, field.name).append(value)
                else:
                    setattr(msg, field.name, value)

    def raw(self, cls: type[Message]) -> bytes:
        """Bytes that are not a valid message of `cls` (or barely are)."""
        r = self.rng
        desc = cls.DESCRIPTOR
        strings = [f for f in desc.fields if f.type == F.TYPE_STRING]
        kind = r.randrange(10)
        if kind == 0:
            return r.randbytes(r.randint(1, 300))
        if kind in (1, 2):
            valid = self.message(cls).SerializeToString()
            if not valid:
                return b"\x0a"
            if kind == 1:
                return valid[: r.randrange(len(valid))] or b"\x12"
            out = bytearray(valid)
            for _ in range(r.randint(1, 4)):
                out[r.randrange(len(out))] ^= 1 << r.randrange(8)
            return bytes(out)
        if kind == 3:  # invalid UTF-8 in a string field, maybe inside a nested message
            bad = r.choice(BAD_UTF8)
            if strings:
                return _len(r.choice(strings).number, bad)
            nested = [f for f in desc.fields if f.type == F.TYPE_MESSAGE and f.message_type.fields]
            if nested:
                outer = r.choice(nested)
                inner = [f for f in outer.message_type.fields if f.type == F.TYPE_STRING]
                return _len(outer.number, _len(inner[0].number if inner else 1, bad))
            return _len(1, bad)
        if kind == 4:  # a known field number with the wrong wire type
            number = r.choice([f.number for f in desc.fields] or [1])
            return r.choice([_tag(number, 5) + b"\x00\x00\x80\x7f", _tag(number, 1) + b"\xff" * 8,
                             _tag(number, 0) + b"\x01", _len(number, b"\x08\x01")])
        if kind == 5:  # a length running past the end
            return _tag(r.randint(1, 5), 2) + _varint(r.choice([1_000, 2**31, 2**63])) + b"abc"
        if kind == 6:  # an over-long varint
            return _tag(r.randint(1, 5), 0) + b"\xff" * 11
        if kind == 7:  # deeply nested groups
            depth = r.choice([50, 101, 5_000])
            return _tag(99, 3) * depth + _tag(99, 4) * depth
        if kind == 8:  # unknown fields, fixed32/fixed64/double specials
            return (_tag(1_000, 1) + struct.pack("<d", float("nan")) + _tag(1_001, 5) + b"\xff\xff\xff\xff"
                    + _len(1_002, b"z" * r.choice([10, 100_000])))
        return b""  # the empty message: every field at its default


# Who sends a case. At the front: the local operator (service and admin), a user's token, no
# token (or a made-up one in the metadata) over TLS, or plaintext to the TLS port. At a cluster:
# the front's certificate, another cluster's, no certificate, or plaintext.
OPERATOR, USER, ANONYMOUS, PLAINTEXT = "operator", "user", "anonymous", "plaintext"
BAD_TOKENS = ["", "x", "Bearer", "Bearer ", "Bearer e30.e30.", "Basic YWxpY2U6", "bearer  x y",
              "Bearer " + "a" * 8_000, "Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJyb290In0.",
              "Bearer eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJmdXp6In0.AAAA"]

# Trace context and baggage are parsed from every call's metadata (telemetry).
BAD_METADATA = [("traceparent", "00-zz-yy-01"), ("traceparent", "00-" + "0" * 32 + "-" + "0" * 16 + "-01"),
                ("traceparent", "ff-" + "a" * 32 + "-" + "b" * 16 + "-ff-extra"), ("tracestate", "=,=,=" * 100),
                ("baggage", "k=%ZZ;;;,=,%"), ("baggage", "a=" + "b" * 7_000), ("x-custom", ""),
                ("x-bin", b"\x7f" * 10), ("weird-bin", b"\x00\xff\xfe")]


@dataclass
class Case:
    rpc: Rpc
    body: bytes
    timeout: float
    sender: str
    metadata: tuple[tuple[str, str], ...] = ()


def cases(gen: Gen, rpcs: list[Rpc], count: int):
    r = gen.rng
    for i in range(count):
        rpc = rpcs[i % len(rpcs)] if i < len(rpcs) else r.choice(rpcs)
        roll = r.random()
        if roll < 0.3:
            body = gen.near_valid(rpc.request).SerializeToString()
        elif roll < 0.6:
            body = gen.message(rpc.request).SerializeToString()
        elif roll < 0.93:
            body = gen.raw(rpc.request)
        elif roll < 0.96:
            body = _len(1, b"y" * (4 * 1024 * 1024 + r.randint(1, 500_000)))  # past every receive limit
        else:
            body = b""
        roll = r.random()
        sender = OPERATOR if roll < 0.8 else USER if roll < 0.88 else ANONYMOUS if roll < 0.96 else PLAINTEXT
        metadata = ()
        if sender == ANONYMOUS and r.random() < 0.7:
            metadata = (("authorization", r.choice(BAD_TOKENS)),)
        if r.random() < 0.1:
            metadata += (r.choice(BAD_METADATA),)
        # 1 ms ends most calls before they start; a few ms some while they are served; 20-100 ms
        # some mid-way (placement, forwarding).
        timeout = r.choice([0.001, r.uniform(0.001, 0.01), 0.02, 0.1]) if r.random() < 0.1 else TIMEOUT_S
        yield Case(rpc, body, timeout, sender, metadata)


# ---- sending -------------------------------------------------------------------------------

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
    for body in (b"\xff" * 50, _len(1, b"\xed\xa0\x80"), _tag(1, 0) + b"\xff" * 11):
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
