"""What the API fuzzer sends (tests/test_fuzz_api.py): every RPC of the three services, and random
requests for each: random messages of the RPC's own type, raw bytes, and nasty values where fields
go."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor as F
from google.protobuf.message import Message

from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import session_service_pb2 as session_pb
TIMEOUT_S = 10.0

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

def wire_varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def wire_tag(number: int, wire: int) -> bytes:
    return wire_varint(number << 3 | wire)


def wire_len(number: int, body: bytes) -> bytes:
    return wire_tag(number, 2) + wire_varint(len(body)) + body


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
                return wire_len(r.choice(strings).number, bad)
            nested = [f for f in desc.fields if f.type == F.TYPE_MESSAGE and f.message_type.fields]
            if nested:
                outer = r.choice(nested)
                inner = [f for f in outer.message_type.fields if f.type == F.TYPE_STRING]
                return wire_len(outer.number, wire_len(inner[0].number if inner else 1, bad))
            return wire_len(1, bad)
        if kind == 4:  # a known field number with the wrong wire type
            number = r.choice([f.number for f in desc.fields] or [1])
            return r.choice([wire_tag(number, 5) + b"\x00\x00\x80\x7f", wire_tag(number, 1) + b"\xff" * 8,
                             wire_tag(number, 0) + b"\x01", wire_len(number, b"\x08\x01")])
        if kind == 5:  # a length running past the end
            return wire_tag(r.randint(1, 5), 2) + wire_varint(r.choice([1_000, 2**31, 2**63])) + b"abc"
        if kind == 6:  # an over-long varint
            return wire_tag(r.randint(1, 5), 0) + b"\xff" * 11
        if kind == 7:  # deeply nested groups
            depth = r.choice([50, 101, 5_000])
            return wire_tag(99, 3) * depth + wire_tag(99, 4) * depth
        if kind == 8:  # unknown fields, fixed32/fixed64/double specials
            return (wire_tag(1_000, 1) + struct.pack("<d", float("nan")) + wire_tag(1_001, 5) + b"\xff\xff\xff\xff"
                    + wire_len(1_002, b"z" * r.choice([10, 100_000])))
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
            body = wire_len(1, b"y" * (4 * 1024 * 1024 + r.randint(1, 500_000)))  # past every receive limit
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
