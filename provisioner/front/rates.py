"""The front's rate limits: creates, and reads that ask every cluster (a list, a quota), per user
and per caller, refused before the call does anything else (token buckets,
provisioner/rules/ratelimit.py); a refusal is answered after a pause (common/pacing.py)."""

from __future__ import annotations

from typing import Callable

from opentelemetry import trace

from provisioner.common.pacing import Pacer
from provisioner.rules import ratelimit
from provisioner.config.policy import RateLimitConfig
from provisioner.model.errors import RateLimited, quote


class Rates:
    def __init__(self, limits: RateLimitConfig, now: Callable[[], float], pacer: Pacer | None = None):
        """`now` runs at wall speed, like a deadline: the retry delay a refusal gives is for
        clients to wait out. `pacer` holds each refusal before it is answered."""
        self.limits, self.now, self.pacer = limits, now, pacer or Pacer(0)
        r = limits
        self.user_creates = ratelimit.TokenBuckets(r.creates_per_user_per_s, r.create_burst_per_user)
        self.caller_creates = ratelimit.TokenBuckets(r.creates_per_caller_per_s, r.create_burst_per_caller)
        self.user_reads = ratelimit.TokenBuckets(r.reads_per_user_per_s, r.read_burst_per_user)
        self.caller_reads = ratelimit.TokenBuckets(r.reads_per_caller_per_s, r.read_burst_per_caller)

    async def create(self, user_id: str, caller: str) -> None:
        """Refuses a create over the user's or the caller's rate."""
        r = self.limits
        await self._take("creates", [(self.user_creates, user_id, r.creates_per_user_per_s, r.create_burst_per_user),
                                     (self.caller_creates, caller, r.creates_per_caller_per_s,
                                      r.create_burst_per_caller)])

    async def read(self, user_id: str, caller: str) -> None:
        """Refuses a read that asks every cluster over the rate of the user it reads ("": every
        user's) or of its caller."""
        r = self.limits
        await self._take("reads", [(self.user_reads, user_id or "*", r.reads_per_user_per_s, r.read_burst_per_user),
                                   (self.caller_reads, caller, r.reads_per_caller_per_s, r.read_burst_per_caller)])

    async def _take(self, what: str, limits: list[tuple[ratelimit.TokenBuckets, str, float, int]]) -> None:
        wait, which = ratelimit.take_all([(buckets, key) for buckets, key, _, _ in limits], self.now())
        if wait:
            _, key, rate, burst = limits[which]
            who = f"{('user', 'caller')[which]} {quote(key)}"
            trace.get_current_span().add_event("rate limited", {"rate.limit": ("user", "caller")[which]})
            await self.pacer.pause()  # the caller's next try waits too
            raise RateLimited(f"too many {what}: {who} may make {rate:g} a second after a burst of {burst}; "
                              f"retry in {wait:.2f} s", retry_after_s=wait)
