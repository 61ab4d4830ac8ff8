"""Names for sessions and VMs. Pure: the randomness is given."""

from __future__ import annotations

import base64
import random
import secrets

MAX_NAME = 63


class IdSource:
    """Session and VM ids. Live clusters draw them from the OS's CSPRNG, so an id cannot be
    guessed from another; a seeded source (replays, tests) names things the same way each run."""

    def __init__(self, cluster: str, seed: int | None = None):
        self.cluster = cluster
        self._rng = random.SystemRandom() if seed is None else random.Random(seed)
        # Secrets come from a stream of their own, so drawing them never shifts the ids a seeded
        # source hands out (replays name things as before).
        self._secrets = None if seed is None else random.Random(f"{seed}/secrets")

    def _suffix(self) -> str:
        return f"{self._rng.getrandbits(40):010x}"

    def session(self) -> str:
        # The id names its home cluster, so the front routes Get/Stop/Watch without a lookup.
        return f"{self.cluster}.s-{self._suffix()}"

    def secret(self) -> str:
        """A session's secret: 32 random bytes, URL-safe base64 (from the OS's CSPRNG, live)."""
        if self._secrets is None:
            return secrets.token_urlsafe(32)
        return base64.urlsafe_b64encode(self._secrets.randbytes(32)).rstrip(b"=").decode()

    def vm(self, pool: str) -> str:
        """GCE instance names: lowercase letters, digits and dashes, at most 63 characters. A long
        cluster and pool name is shortened, never the random suffix: cut, it would collide."""
        suffix = self._suffix()
        prefix = f"{self.cluster}-{pool}"[:MAX_NAME - len(suffix) - 1].rstrip("-")
        return f"{prefix}-{suffix}"
