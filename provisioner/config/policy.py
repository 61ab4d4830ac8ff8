"""The fleet's policy settings in clusters/fleet.yaml: quotas, rate limits, abuse detection,
priority classes and preemption (sections of FleetSettings, in fleet.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, model_validator

from provisioner.config.base import Name, _At, _Model

SessionKindName = Literal["interactive", "batch"]


class QuotaConfig(_Model):
    gpu_hours_per_week: NonNegativeFloat = 30.0  # weighted GPU-hours per user and week
    # One number for each kind alike, or per kind ({interactive: 4, batch: 2}); kinds count apart.
    max_active_sessions_per_user: NonNegativeInt | dict[SessionKindName, NonNegativeInt] = 4
    min_budget_to_start_s: NonNegativeFloat = 60.0  # a create with less GPU time left is refused
    reset_weekday: Annotated[int, Field(ge=0, le=6)] = 0  # 0 is Monday
    reset_hour_utc: Annotated[int, Field(ge=0, le=23)] = 0
    # GPU-seconds count accelerator_count x this weight, by accelerator type (default 1.0).
    accelerator_weights: dict[str, NonNegativeFloat] = {}

    def max_active(self, kind: str) -> int:
        cap = self.max_active_sessions_per_user
        if isinstance(cap, dict):
            return cap.get(kind, QuotaConfig.model_fields["max_active_sessions_per_user"].default)
        return cap

    def weight(self, accelerator: str) -> float:
        return self.accelerator_weights.get(accelerator, 1.0)

    def with_override(self, override: dict[str, Any]) -> QuotaConfig:
        """These quotas with what operators set for one user: `gpu_hours_per_week` and
        `max_active_sessions_per_user` ({kind: cap}, each kind over this config's)."""
        update = dict(override)
        if caps := update.get("max_active_sessions_per_user"):
            update["max_active_sessions_per_user"] = {k: self.max_active(k) for k in get_args(SessionKindName)} | caps
        return self.model_copy(update=update)


class RateLimitConfig(_Model):
    """Token buckets at each front (wall time), per user and per calling identity (a service
    acting for many users is one caller): on CreateSession, and on the reads that ask every
    cluster (ListSessions, GetQuota), whose cost one caller must not make everyone's."""

    creates_per_user_per_s: PositiveFloat = 5.0
    create_burst_per_user: Annotated[int, Field(ge=1)] = 20
    creates_per_caller_per_s: PositiveFloat = 1000.0
    create_burst_per_caller: Annotated[int, Field(ge=1)] = 2000
    reads_per_user_per_s: PositiveFloat = 10.0
    read_burst_per_user: Annotated[int, Field(ge=1)] = 50
    reads_per_caller_per_s: PositiveFloat = 500.0
    read_burst_per_caller: Annotated[int, Field(ge=1)] = 1000
    # Wall seconds a refusal for the rate, or for a credential that does not check out, is held
    # before it is answered, so a refused caller cannot spend the front on refusals (common/pacing.py).
    refusal_pause_s: Annotated[float, Field(ge=0, le=5)] = 0.25


# Process names of GPU miners, as their binaries ship (`gminer` ships as `miner`, too common to list).
MINER_PROGRAMS = ("xmrig", "xmr-stak", "t-rex", "nbminer", "lolminer", "ethminer", "phoenixminer", "gminer",
                  "nanominer", "teamredminer", "srbminer-multi", "bzminer", "rigel", "ccminer", "cpuminer",
                  "minerd", "kawpowminer", "onezerominer", "wildrig")
# Ports mining pools commonly serve stratum on.
POOL_PORTS = (3333, 4444, 5555, 6666, 7777, 9999, 14433, 14444, 45560, 45700)
# What a notebook's GPU work normally runs as (a version suffix matches: python3.11); PyTorch
# names its launched workers' main thread pt_main_thread.
KNOWN_GPU_PROGRAMS = ("python", "jupyter", "ipykernel", "torchrun", "pt_main_thread", "accelerate", "deepspeed",
                      "julia", "r", "rscript")


def _program_names(names: tuple[str, ...]) -> tuple[str, ...]:
    for i, n in enumerate(names):
        if not n or n != n.lower() or "/" in n or n in names[:i]:
            raise _At(f"[{i}]", f"expected a distinct lower-case program name without a path, got {n!r}")
    return names


ProgramNames = Annotated[tuple[str, ...], AfterValidator(_program_names)]


class AbuseConfig(_Model):
    """Abuse detection (`provisioner/rules/abuse.py`): what flags a session; see its rules there."""

    dry_run: bool = False  # flagged sessions are only reported: none is stopped, no user blocked
    gpu_busy_pct: Annotated[int, Field(ge=1, le=100)] = 90  # the busiest GPU at this or more is busy
    idle_busy_window_s: PositiveFloat = 2700.0  # interactive: busy this long with no touch
    batch_busy_window_s: PositiveFloat = 3600.0  # batch: busy this long by a program not known
    max_sample_gap_s: PositiveFloat = 300.0  # reports further apart break a run
    miner_programs: ProgramNames = MINER_PROGRAMS
    pool_ports: tuple[Annotated[int, Field(ge=1, le=65535)], ...] = POOL_PORTS
    pool_connection_min_s: NonNegativeFloat = 120.0  # 0: one report with the connection suffices
    known_gpu_programs: ProgramNames = KNOWN_GPU_PROGRAMS

    @model_validator(mode="after")
    def _check(self) -> AbuseConfig:
        for i, port in enumerate(self.pool_ports):
            if port in self.pool_ports[:i]:
                raise _At(f"pool_ports[{i}]", f"port {port} listed twice")
        for field in ("idle_busy_window_s", "batch_busy_window_s"):
            if getattr(self, field) < self.max_sample_gap_s:
                raise _At(field, f"must be >= max_sample_gap_s ({self.max_sample_gap_s}), got {getattr(self, field)}")
        if clash := sorted(set(self.miner_programs) & set(self.known_gpu_programs)):
            raise _At("known_gpu_programs", f"also listed as miners: {', '.join(clash)}")
        return self


class PriorityClassConfig(_Model):
    rank: NonNegativeInt  # higher is more important: lower ranks are preempted first
    preemptible: bool = False  # may be stopped, after the grace period, for a session within its owner's share


class PriorityConfig(_Model):
    """Priority classes and preemption (`provisioner/decide/preemption_rules.py`). A user's sessions in a pool
    are guaranteed `share_gpus_per_user` GPUs; beyond it a session borrows idle GPUs, and a
    preemptible one may be stopped for a session within its owner's share. A share of 0 guarantees
    nothing, so nothing is preempted."""

    classes: dict[Name, PriorityClassConfig] = {"interactive": PriorityClassConfig(rank=100),
                                                "batch": PriorityClassConfig(rank=10, preemptible=True)}
    # The class of each session kind; a kind left out gets the class of its own name.
    kinds: dict[SessionKindName, str] = {"interactive": "interactive", "batch": "batch"}
    grace_period_s: NonNegativeFloat = 120.0  # from the warning to the stop: the notebook may checkpoint
    share_gpus_per_user: NonNegativeInt = 2  # in every pool, unless set for the pool below
    pool_share_gpus_per_user: dict[Name, NonNegativeInt] = {}  # pool name -> its own share

    @model_validator(mode="after")
    def _check(self) -> PriorityConfig:
        if not self.classes:
            raise _At("classes", "at least one class is needed")
        for kind in get_args(SessionKindName):
            name = self.class_of(kind)
            if name not in self.classes:
                raise _At(f"kinds.{kind}", f"no class {name!r}; classes: {', '.join(sorted(self.classes))}")
        if self.classes[self.class_of("interactive")].preemptible:
            raise _At(f"classes.{self.class_of('interactive')}.preemptible",
                      "interactive sessions are never preempted: their class cannot be preemptible")
        return self

    def class_of(self, kind: str) -> str:
        return self.kinds.get(kind, kind)

    def share_gpus(self, pool: str) -> int:
        return self.pool_share_gpus_per_user.get(pool, self.share_gpus_per_user)
