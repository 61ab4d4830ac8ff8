"""The request limits (api/limits.py): every field of every request has a rule, and the rules
refuse what they should and nothing our own code produces."""

from __future__ import annotations

import math

import pytest
from google.protobuf.descriptor import FieldDescriptor

from provisioner.api import limits
from provisioner.api.limits import check_request
from provisioner.decide.ids import IdSource
from provisioner.api.keyset import encode_positions
from provisioner.model.errors import InvalidArgument, quote
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import session_service_pb2 as session_pb
from provisioner.v1 import types_pb2 as pb


def test_every_request_field_that_needs_a_rule_has_one():
    missing = [f"{desc.full_name}.{field.name}" for desc in limits.request_messages() for field in desc.fields
               if limits.needs_rule(field) and (desc.full_name, field.name) not in limits.RULES]
    assert missing == []


def test_every_rule_names_a_request_field():
    fields = {(desc.full_name, field.name) for desc in limits.request_messages() for field in desc.fields}
    assert sorted(set(limits.RULES) - fields) == []


def test_walk_reaches_nested_messages_of_every_service():
    names = {desc.full_name for desc in limits.request_messages()}
    assert {"provisioner.v1.SessionSpec", "provisioner.v1.PoolPolicy", "provisioner.v1.CreateSessionRequest",
            "provisioner.v1.SetPoolPolicyRequest", "provisioner.v1.WatchCapacityRequest"} <= names


def _spec(**kw) -> pb.SessionSpec:
    base = dict(request_id="req-1f3a", user_id="alice@example.com", notebook_id="nb/42", accelerator="gpu-p100",
                image="gpu:v154", region_hint="us-central1", kind=pb.SESSION_KIND_BATCH)
    return pb.SessionSpec(**{**base, **kw})


def test_ordinary_requests_pass():
    ids = IdSource("europe-west4", seed=1)
    sid = ids.session()
    token = encode_positions("3f2a", {"us-central1": (1_790_000_000_123_456_789, sid), "asia-east1": None})
    requests = [
        session_pb.CreateSessionRequest(spec=_spec()),
        session_pb.CreateSessionRequest(spec=_spec(image="gpu:latest", request_id="0c4f7a0e-2b1d-4c8e-9f00-1a2b3c4d5e6f")),
        session_pb.CreateSessionRequest(spec=_spec(image="gpu")),
        session_pb.GetSessionRequest(session_id=sid),
        session_pb.ListSessionsRequest(user_id="bob", states=[pb.SESSION_STATE_RUNNING], page_size=10_000,
                                       page_token=token),
        session_pb.WatchSessionRequest(session_id=sid, after_revision=12),
        session_pb.StopSessionRequest(session_id=sid, reason="done for today, thanks!"),
        session_pb.GetQuotaRequest(user_id="svc+notebooks.prod-1"),
        admin_pb.SetPoolPolicyRequest(cluster="us-central1", pool="gpu-p100", policy=pb.PoolPolicy(
            min_vms=0, max_vms=40, headroom_fraction=0.3, autoscaler="predictive", recycle=False)),
        admin_pb.PrewarmImageRequest(cluster="us-central1", pool="gpu-t4x2", image="gpu:v160", count=3),
        admin_pb.ListVmsRequest(states=[pb.VM_STATE_WARM, pb.VM_STATE_ASSIGNED]),
        admin_pb.EvictVmRequest(cluster="asia-east1", vm_id=ids.vm("gpu-t4x2"), reason="bad GPU"),
        cluster_pb.AllocateRequest(spec=_spec(), commit_by={"seconds": 1_900_000_000, "nanos": 5}),
        cluster_pb.GetRequest(request_id="req-9", user_id="alice"),
        cluster_pb.WatchCapacityRequest(min_interval_s=0.5),
        cluster_pb.DiscardRequest(request_id="req-9", reason="placed elsewhere"),
    ]
    for request in requests:
        check_request(request)


def test_long_ids_of_every_kind_fit():
    ids = IdSource("a" * 40, seed=2)
    check_request(session_pb.GetSessionRequest(session_id=ids.session()))
    check_request(admin_pb.EvictVmRequest(vm_id=ids.vm("b" * 40)))


BAD = [
    # (request, the field the error names)
    (session_pb.CreateSessionRequest(spec=_spec(notebook_id="x" * 2_000_000)), "spec.notebook_id"),
    (session_pb.CreateSessionRequest(spec=_spec(user_id="a/b")), "spec.user_id"),
    (session_pb.CreateSessionRequest(spec=_spec(user_id="u" * 129)), "spec.user_id"),
    (session_pb.CreateSessionRequest(spec=_spec(request_id="has space")), "spec.request_id"),
    (session_pb.CreateSessionRequest(spec=_spec(request_id="a/b")), "spec.request_id"),
    (session_pb.CreateSessionRequest(spec=_spec(request_id="caf\u00e9")), "spec.request_id"),
    (session_pb.CreateSessionRequest(spec=_spec(image="GPU:v1")), "spec.image"),
    (session_pb.CreateSessionRequest(spec=_spec(image="gpu:v1:v2")), "spec.image"),
    (session_pb.CreateSessionRequest(spec=_spec(accelerator="gpu_p100")), "spec.accelerator"),
    (session_pb.CreateSessionRequest(spec=_spec(region_hint="us-central1\x00")), "spec.region_hint"),
    (session_pb.CreateSessionRequest(spec=_spec(kind=7)), "spec.kind"),
    (session_pb.CreateSessionRequest(spec=_spec(max_runtime={"seconds": -1})), "spec.max_runtime"),
    (session_pb.CreateSessionRequest(spec=_spec(max_runtime={"seconds": 10**12})), "spec.max_runtime"),
    (session_pb.GetSessionRequest(session_id="us-central1.s-" + "0" * 16_000), "session_id"),
    (session_pb.GetSessionRequest(session_id="us-central1.vm-1"), "session_id"),
    (session_pb.GetSessionRequest(session_id="../../etc/passwd"), "session_id"),
    (session_pb.ListSessionsRequest(user_id="bob", page_size=-1), "page_size"),
    (session_pb.ListSessionsRequest(user_id="bob", page_token="eyJxIjo=/../x"), "page_token"),
    (session_pb.ListSessionsRequest(user_id="bob", page_token="A" * 8193), "page_token"),
    (session_pb.ListSessionsRequest(user_id="bob", states=[99]), "states"),
    (session_pb.ListSessionsRequest(user_id="bob", states=[1] * 33), "states"),
    (session_pb.WatchSessionRequest(session_id="us-central1.s-00ff00ff00", after_revision=-3), "after_revision"),
    (session_pb.StopSessionRequest(session_id="us-central1.s-00ff00ff00", reason="r" * 513), "reason"),
    (session_pb.StopSessionRequest(session_id="us-central1.s-00ff00ff00", reason="line\nbreak"), "reason"),
    # What a terminal or a line splitter acts on: CSI and NEL (C1), ESC, a line separator, a bidi override.
    *[(session_pb.StopSessionRequest(session_id="us-central1.s-00ff00ff00", reason=f"done{c}2J"), "reason")
      for c in ("\x9b", "\x85", "\x1b[", "\u2028", "\u202e")],
    (admin_pb.BlockUserRequest(user_id="mal", reason="mining\u2029forged line"), "reason"),
    (admin_pb.SetPoolPolicyRequest(cluster="us-central1", pool="gpu-p100",
                                   policy=pb.PoolPolicy(headroom_fraction=math.inf)), "policy.headroom_fraction"),
    (admin_pb.SetPoolPolicyRequest(cluster="us-central1", pool="gpu-p100",
                                   policy=pb.PoolPolicy(headroom_fraction=math.nan)), "policy.headroom_fraction"),
    (admin_pb.SetPoolPolicyRequest(cluster="us-central1", pool="gpu-p100",
                                   policy=pb.PoolPolicy(min_vms=-1)), "policy.min_vms"),
    (admin_pb.SetPoolPolicyRequest(cluster="us-central1", pool="gpu-p100",
                                   policy=pb.PoolPolicy(max_vms=2_000_000_000)), "policy.max_vms"),
    (admin_pb.SetPoolPolicyRequest(cluster="us-central1", pool="gpu-p100",
                                   policy=pb.PoolPolicy(autoscaler="magic")), "policy.autoscaler"),
    (admin_pb.DrainClusterRequest(cluster="US-CENTRAL1"), "cluster"),
    (admin_pb.PrewarmImageRequest(cluster="us-central1", pool="gpu-p100", image="gpu:v1", count=-2), "count"),
    (admin_pb.ListVmsRequest(states=[-1]), "states"),
    (admin_pb.EvictVmRequest(vm_id="Vm_1"), "vm_id"),
    (cluster_pb.AllocateRequest(spec=_spec(), commit_by={"seconds": -1}), "commit_by"),
    (cluster_pb.AllocateRequest(spec=_spec(), commit_by={"seconds": 10**15}), "commit_by"),
    (cluster_pb.GetRequest(request_id="\x7f"), "request_id"),
    (cluster_pb.WatchCapacityRequest(min_interval_s=1e-300), "min_interval_s"),
    (cluster_pb.WatchCapacityRequest(min_interval_s=-math.inf), "min_interval_s"),
    (cluster_pb.WatchCapacityRequest(min_interval_s=1e9), "min_interval_s"),
]


@pytest.mark.parametrize("request_, field", BAD, ids=[f"{type(r).__name__}-{f}" for r, f in BAD])
def test_bad_requests_are_refused_naming_the_field(request_, field):
    with pytest.raises(InvalidArgument) as info:
        check_request(request_)
    assert info.value.field == field
    assert len(info.value.message) < 250  # never the whole value


def test_enum_checks_cover_every_known_value():
    for value in pb.SessionState.values():
        check_request(session_pb.ListSessionsRequest(user_id="u", states=[value]))
    field = session_pb.ListSessionsRequest.DESCRIPTOR.fields_by_name["states"]
    assert field.type == FieldDescriptor.TYPE_ENUM


def test_quote_keeps_short_values_and_cuts_long_ones():
    assert quote("gpu-h100") == "'gpu-h100'"
    long = quote("x" * 20_000)
    assert long.startswith("'" + "x" * 64 + "'...") and "20000 characters" in long and len(long) < 100
    # Escaped, so the message is valid UTF-8 whatever came in.
    assert quote("a\x00\ud800") == "'a\\x00\\ud800'"
    quote("\ud800" * 100).encode()
