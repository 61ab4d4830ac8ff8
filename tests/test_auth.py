"""The pure parts of security: the authorization table, and token verification with an injected
wall clock."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from provisioner.model.errors import Unauthenticated
from provisioner.security.auth import (ADMIN, ANONYMOUS, FRONT, FRONT_POLICY, SERVICE, USER, Caller, Rule,
                                       authorize, with_admin_service, with_cluster_service)
from provisioner.security.tokens import Issuer, TokenVerifier, mint
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import types_pb2 as pb

S = "/provisioner.v1.SessionService/"
POLICY = with_cluster_service(with_admin_service(FRONT_POLICY, Rule.ADMIN, ["DrainCluster", "ListPools"]), ["Allocate"])


def caller(identity: str, *roles: str) -> Caller:
    return Caller(identity, frozenset(roles), "test")


CREATE_FOR_BOB = s_pb.CreateSessionRequest(spec=pb.SessionSpec(user_id="bob"))
CREATE_UNNAMED = s_pb.CreateSessionRequest(spec=pb.SessionSpec())


@pytest.mark.parametrize("who, method, request_, allowed, code, owner", [
    (ANONYMOUS, S + "GetSession", s_pb.GetSessionRequest(), False, "UNAUTHENTICATED", ""),
    (caller("alice", USER), S + "GetSession", s_pb.GetSessionRequest(), True, "", "alice"),
    (caller("alice", USER), S + "CreateSession", CREATE_UNNAMED, True, "", "alice"),
    (caller("alice", USER), S + "CreateSession", CREATE_FOR_BOB, False, "PERMISSION_DENIED", ""),
    (caller("alice", USER), S + "ListSessions", s_pb.ListSessionsRequest(user_id="bob"), False, "PERMISSION_DENIED", ""),
    (caller("alice", USER), S + "ListSessions", s_pb.ListSessionsRequest(user_id="alice"), True, "", "alice"),
    (caller("alice", USER), "/provisioner.v1.AdminService/DrainCluster", None, False, "PERMISSION_DENIED", ""),
    (caller("nb", SERVICE), S + "CreateSession", CREATE_FOR_BOB, True, "", ""),
    (caller("nb", SERVICE), S + "StopSession", s_pb.StopSessionRequest(), True, "", ""),
    (caller("nb", SERVICE), "/provisioner.v1.AdminService/ListPools", None, False, "PERMISSION_DENIED", ""),
    (caller("ops", ADMIN), S + "GetSession", s_pb.GetSessionRequest(), True, "", ""),
    (caller("ops", ADMIN), S + "ListSessions", s_pb.ListSessionsRequest(user_id="bob"), True, "", ""),
    (caller("ops", ADMIN), S + "StopSession", s_pb.StopSessionRequest(), False, "PERMISSION_DENIED", ""),
    (caller("ops", ADMIN), "/provisioner.v1.AdminService/DrainCluster", None, True, "", ""),
    (caller("ops", ADMIN, USER), S + "StopSession", s_pb.StopSessionRequest(), True, "", "ops"),
    (caller("front", FRONT), "/provisioner.v1.ClusterService/Allocate", None, True, "", ""),
    (caller("ops", ADMIN, SERVICE), "/provisioner.v1.ClusterService/Allocate", None, False, "PERMISSION_DENIED", ""),
    (caller("nobody"), S + "GetSession", s_pb.GetSessionRequest(), False, "PERMISSION_DENIED", ""),
    (caller("ops", ADMIN), "/provisioner.v1.AdminService/NotInTheTable", None, False, "PERMISSION_DENIED", ""),
])
def test_the_roles_table(who, method, request_, allowed, code, owner):
    d = authorize(POLICY, who, method, request_)
    assert (d.allowed, d.code, d.owner) == (allowed, code, owner)


def _issuer(key, **kw) -> Issuer:
    return Issuer("provisioner-local", "provisioner", "sub", frozenset({USER}), {"ops": frozenset({ADMIN})},
                  public_key=key.public_key(), **kw)


def _pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def test_tokens_are_verified_with_the_injected_clock_and_remembered_until_they_expire():
    key = ec.generate_private_key(ec.SECP256R1())
    now = [1_000_000.0]
    verifier = TokenVerifier([_issuer(key)], wall=lambda: now[0])
    token = mint(_pem(key), "ops", ttl_s=600, now=now[0])
    assert verifier.verify(token) == Caller("ops", frozenset({ADMIN}), "token provisioner-local")
    assert verifier.cached(token) is not None
    assert verifier.verify(mint(_pem(key), "alice", now=now[0])).roles == {USER}  # the issuer's default
    now[0] += 600 + 31  # past expiry and the leeway
    assert verifier.cached(token) is None
    with pytest.raises(Unauthenticated, match="expired"):
        verifier.verify(token)


@pytest.mark.parametrize("make, reason", [
    (lambda key, other: mint(_pem(other), "ops", now=1_000_000.0), "refused"),
    (lambda key, other: mint(_pem(key), "ops", issuer="someone-else", now=1_000_000.0), "issuer"),
    (lambda key, other: mint(_pem(key), "ops", audience="another-service", now=1_000_000.0), "refused"),
    (lambda key, other: mint(_pem(key), "ops", now=1_000_000.0 + 3600), "not valid yet"),
    (lambda key, other: "a.b.c", "not a JWT"),
])
def test_bad_tokens_are_unauthenticated(make, reason):
    key, other = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    verifier = TokenVerifier([_issuer(key)], wall=lambda: 1_000_000.0)
    with pytest.raises(Unauthenticated, match=reason):
        verifier.verify(make(key, other))


def test_tokens_that_need_no_fetched_key_are_decided_on_the_spot_and_refusals_remembered(monkeypatch):
    """The event loop decides what needs no issuer's keys fetched (a flood of bad tokens then
    takes no worker thread), and a token refused once is refused from memory."""
    from provisioner.security import tokens

    key, other = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    now = [1_000_000.0]
    verifier = TokenVerifier([_issuer(key), Issuer("https://issuer.example", "aud", "sub", frozenset({USER}), {},
                                                   jwks_url="https://issuer.example/keys")], wall=lambda: now[0])
    assert verifier.verify_here(mint(_pem(key), "ops", now=now[0])).identity == "ops"
    assert verifier.verify_here(mint(_pem(key), "x", issuer="https://issuer.example", audience="aud",
                                     now=now[0])) is None  # its issuer's keys may need fetching: off the loop
    forged = mint(_pem(other), "ops", now=now[0])
    signature_checks = []
    real_decode = tokens.jwt.decode
    monkeypatch.setattr(tokens.jwt, "decode", lambda *a, **kw: signature_checks.append(1) or real_decode(*a, **kw))
    for token in ("not-a-token", forged):
        for _ in range(3):
            with pytest.raises(Unauthenticated):
                verifier.verify_here(token)
    assert len(signature_checks) == 1 + 3  # the garbage parsed once; the forgery parsed twice and checked, once
    now[0] += tokens.REFUSAL_KEPT_S + 1
    with pytest.raises(Unauthenticated):
        verifier.verify_here(forged)
    assert len(signature_checks) == 7  # checked again once the refusal is forgotten


@pytest.mark.parametrize("address, anywhere, refused", [
    ("127.0.0.1:0", False, False), ("localhost:0", False, False), ("[::1]:0", False, False),
    ("0.0.0.0:0", False, True), ("10.1.2.3:50051", False, True), ("front.internal:443", False, True),
    ("0.0.0.0:0", True, False),
])
def test_plaintext_is_for_loopback_unless_said_otherwise(address, anywhere, refused):
    from provisioner.security.tls import PlaintextRefused, check_plaintext

    if refused:
        with pytest.raises(PlaintextRefused, match="non-loopback"):
            check_plaintext(address, anywhere)
    else:
        check_plaintext(address, anywhere)


async def test_a_front_refuses_to_start_in_plaintext_on_a_public_address():
    from provisioner.api.guard import Guard, bearer_identity
    from provisioner.api.server import Server
    from provisioner.security.tls import PlaintextRefused

    guard = Guard({}, bearer_identity(TokenVerifier([])))
    with pytest.raises(PlaintextRefused):
        Server("0.0.0.0:0", lambda server: [], guard=guard, credentials=None)
