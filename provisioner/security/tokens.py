"""Bearer tokens (JWT): verifying them into a Caller, and minting dev tokens for the local fleet.

Each configured issuer names how its signatures are checked: a public key file (the local fleet's
own key, made by `up`), or the issuer's published keys (JWKS), as for Google-signed OIDC ID
tokens of service accounts. Roles never come from the token: the config maps identities to roles,
per issuer. A verified token is remembered until it expires, so a client that reuses its token
costs one signature check, not one per call.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from provisioner.model.errors import Unauthenticated, Unavailable
from provisioner.security.auth import Caller

ALGORITHMS = ["ES256", "RS256"]
LEEWAY_S = 30.0  # clock skew allowed between the minting and the verifying machine
CACHE_SIZE = 10_000
REFUSAL_KEPT_S = 300.0  # how long a refused token is answered from memory
NOT_YET_VALID = "the token is not valid yet"  # the one refusal that time may lift
NOT_A_JWT = "the bearer token is not a JWT"
JWKS_REFRESH_S = 3600.0
LOCAL_ISSUER, LOCAL_AUDIENCE = "provisioner-local", "provisioner"
KEY_FILE, PUBLIC_KEY_FILE = "token-key.pem", "token-key.pub.pem"


GOOGLE_ISSUERS = ("https://accounts.google.com", "accounts.google.com")


def spellings(issuer: str) -> tuple[str, ...]:
    """The `iss` values that name this issuer: Google's has two."""
    return GOOGLE_ISSUERS if issuer in GOOGLE_ISSUERS else (issuer,)


@dataclass(frozen=True)
class Issuer:
    """One trusted token issuer (see config.IssuerConfig)."""

    issuer: str
    audience: str
    identity_claim: str
    default_roles: frozenset[str]
    roles: dict[str, frozenset[str]]
    public_key: object | None = None  # a loaded public key, or
    jwks_url: str | None = None  # where the issuer publishes its keys

    def caller(self, claims: dict) -> Caller:
        identity = claims.get(self.identity_claim)
        if not isinstance(identity, str) or not identity:
            raise Unauthenticated(f"the token has no {self.identity_claim!r} claim")
        return Caller(identity, self.roles.get(identity, self.default_roles), f"token {self.issuer}")


class TokenVerifier:
    def __init__(self, issuers: list[Issuer], wall: Callable[[], float] = time.time):
        # Google signs ID tokens as either spelling of its issuer: one trusted is both.
        self.issuers = {spelling: i for i in issuers for spelling in spellings(i.issuer)}
        self.wall = wall  # token lifetimes are wall-clock times, whatever the fleet's model clock
        # Read on the event loop, written by verifications in worker threads: one lock for both.
        self._verified: OrderedDict[str, tuple[Caller, float]] = OrderedDict()
        # Tokens refused lately, with why and until when (wall time): a repeated one costs a lookup.
        self._refused: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._lock = threading.Lock()
        # Each fetches its issuer's keys on first use, and again on an unknown key id at most every
        # 30 s (the client's cooldown), so forged key ids cannot make the front hammer the issuer.
        self._jwks = {i.issuer: jwt.PyJWKClient(i.jwks_url, cache_keys=True, lifespan=JWKS_REFRESH_S, timeout=10)
                      for i in issuers if i.jwks_url}

    def cached(self, token: str) -> Caller | None:
        """The caller of a token verified before and not expired yet; no signature check."""
        with self._lock:
            hit = self._verified.get(token)
            if hit is None:
                return None
            caller, expires = hit
            if self.wall() >= expires + LEEWAY_S:
                del self._verified[token]
                return None
            return caller

    def verify_here(self, token: str) -> Caller | None:
        """`verify`, where it needs no fetch of an issuer's keys and so may run on the event loop:
        a token seen before (verified or refused), one that is no JWT or names an untrusted
        issuer, and one of an issuer with a key file. None: call `verify` off the loop. Without
        this, every call with a token that does not check out (anyone can send them, as fast as
        they like) took a trip through a worker thread and back."""
        if (caller := self.cached(token)) is not None:
            return caller
        with self._lock:
            refused = self._refused.get(token)
        if refused is not None and self.wall() < refused[1]:
            raise Unauthenticated(refused[0])
        try:
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            self._remember_refusal(token, NOT_A_JWT)
            raise Unauthenticated(NOT_A_JWT) from None
        issuer = self.issuers.get(unverified.get("iss")) if isinstance(unverified, dict) else None
        return self.verify(token) if issuer is None or issuer.public_key is not None else None

    def verify(self, token: str) -> Caller:
        """The caller a token names, or Unauthenticated saying why not. May fetch an issuer's
        keys (blocking): call it off the event loop unless `verify_here` answered."""
        if (caller := self.cached(token)) is not None:
            return caller
        try:
            return self._verify(token)
        except Unauthenticated as e:
            if e.message != NOT_YET_VALID:  # the rest stays refused
                self._remember_refusal(token, e.message)
            raise

    def _verify(self, token: str) -> Caller:
        try:
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            raise Unauthenticated(NOT_A_JWT) from None
        issuer = self.issuers.get(unverified.get("iss")) if isinstance(unverified, dict) else None
        if issuer is None:
            raise Unauthenticated("the token's issuer is not trusted here")
        try:
            key = issuer.public_key if issuer.public_key is not None else self._jwks_key(issuer, token)
            # Lifetimes are checked below against the injected wall clock.
            claims = jwt.decode(token, key, algorithms=ALGORITHMS, audience=issuer.audience,
                                issuer=list(spellings(issuer.issuer)),
                                options={"verify_exp": False, "verify_nbf": False, "verify_iat": False,
                                         "require": ["exp", "iss", "aud"]})
        except jwt.PyJWTError as e:
            raise Unauthenticated(f"the token was refused: {e}") from None
        now = self.wall()
        expires = float(claims["exp"]) if isinstance(claims["exp"], (int, float)) else 0.0
        if now >= expires + LEEWAY_S:
            raise Unauthenticated("the token has expired")
        starts = max((claims[c] for c in ("nbf", "iat") if isinstance(claims.get(c), (int, float))), default=0.0)
        if now + LEEWAY_S < starts:
            raise Unauthenticated(NOT_YET_VALID)
        caller = issuer.caller(claims)
        self._remember(token, caller, expires)
        return caller

    def _remember_refusal(self, token: str, why: str) -> None:
        with self._lock:
            self._refused[token] = (why, self.wall() + REFUSAL_KEPT_S)
            self._refused.move_to_end(token)
            while len(self._refused) > CACHE_SIZE:
                self._refused.popitem(last=False)

    def _remember(self, token: str, caller: Caller, expires: float) -> None:
        with self._lock:
            self._verified[token] = (caller, expires)
            while len(self._verified) > CACHE_SIZE:
                self._verified.popitem(last=False)

    def _jwks_key(self, issuer: Issuer, token: str):
        try:
            return self._jwks[issuer.issuer].get_signing_key_from_jwt(token).key
        except jwt.PyJWKClientConnectionError as e:
            raise Unavailable(f"cannot fetch the keys of issuer {issuer.issuer}: {e}") from None


# ---- the local fleet's own issuer ---------------------------------------------------------

def ensure_local_key(directory: Path) -> None:
    """The local fleet's token signing key (ES256), made once. Who holds it can mint any identity:
    it stays in the data dir, readable by its owner only."""
    from provisioner.security.pki import key_pem, locked, write_file

    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    private, public = directory / KEY_FILE, directory / PUBLIC_KEY_FILE
    with locked(directory / ".lock"):  # processes sharing a data dir start together
        if private.exists() and public.exists():
            return
        key = ec.generate_private_key(ec.SECP256R1())
        write_file(private, key_pem(key), private=True)
        write_file(public, key.public_key().public_bytes(serialization.Encoding.PEM,
                                                         serialization.PublicFormat.SubjectPublicKeyInfo))


def mint(private_key_pem: bytes, subject: str, *, ttl_s: float = 3600.0, issuer: str = LOCAL_ISSUER,
         audience: str = LOCAL_AUDIENCE, now: float | None = None) -> str:
    """A signed dev token for `subject`."""
    now = time.time() if now is None else now  # wall time: every verifier checks `exp` against its own
    key = serialization.load_pem_private_key(private_key_pem, None)
    claims = {"iss": issuer, "aud": audience, "sub": subject, "iat": int(now), "exp": int(now + ttl_s),
              "jti": uuid.uuid4().hex}
    return jwt.encode(claims, key, algorithm="ES256")


def load_public_key(path: Path):
    try:
        return serialization.load_pem_public_key(path.read_bytes())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load the public key {path}: {e}") from None
