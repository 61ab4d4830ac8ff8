"""Abuse detection: is a session mining (or otherwise misusing a GPU)? Pure: a function of the
agent's reports for one session, the session's touches and the thresholds, with no clock and
no I/O. The caller decides what a flag does (and honours `dry_run`).

Rules, each with its evidence:

- `miner_program`: a process of the session, or one using its GPU, is named like a known miner
  (`miner_programs`). One report suffices.
- `pool_connection`: the session keeps an outbound connection to a public address on a mining
  pool's port (`pool_ports`) through reports spanning `pool_connection_min_s`.
- `busy_without_activity` (interactive sessions): the busiest GPU at `gpu_busy_pct` or more in
  every report spanning `idle_busy_window_s`, with no touch in between. A touch is activity
  the notebook backend sees (a user's edit, a cell running), so a notebook training while its
  user is away is touched and not flagged; a program started in the background with the
  notebook closed is not.
- `unknown_gpu_program` (batch sessions): a batch runs unattended, so its lack of touches says
  nothing and the rule above does not apply to it. What it asks instead is who keeps the GPU
  busy: a GPU at `gpu_busy_pct` or more in every report spanning `batch_busy_window_s` while the
  same process, not one of `known_gpu_programs` (python, jupyter, torchrun...), uses it. A
  training batch runs in the notebook's kernel (python) and is never flagged by it.

A run of reports is only judged when no two consecutive ones are more than `max_sample_gap_s`
apart: a gap (an agent that did not answer) breaks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Literal, Sequence

from provisioner.agent.usage import Usage
from provisioner.model.abuse_record import Finding, Verdict

if TYPE_CHECKING:
    from provisioner.config.policy import AbuseConfig

Kind = Literal["interactive", "batch"]


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # when the cluster read it, on the cluster's clock
    usage: Usage


def matches(name: str, programs: Iterable[str]) -> str:
    """The entry of `programs` that a process name is, or is a version or variant of (`xmrig`
    matches `xmrig`, `XMRig.exe`, `xmrig-6.21`, `python` matches `python3.11`, not `pythonx`);
    "" if none."""
    n = name.lower().removesuffix(".exe")
    for p in programs:
        if n == p or (n.startswith(p) and n[len(p)] in "-_. 0123456789"):
            return p
    return ""


def judge(samples: Sequence[Sample], touches: Sequence[float], kind: Kind, cfg: AbuseConfig) -> Verdict:
    """One session's verdict from its usage reports (in any order), the times of its touches
    (on the same clock as the reports' `at`) and its kind."""
    samples = sorted(samples, key=lambda s: s.at)
    found = [_miner_program(samples, cfg), _pool_connection(samples, cfg)]
    if kind == "interactive":
        found.append(_busy_without_activity(samples, sorted(touches), cfg))
    else:
        found.append(_unknown_gpu_program(samples, cfg))
    return Verdict(tuple(f for f in found if f is not None))


def _miner_program(samples: Sequence[Sample], cfg: AbuseConfig) -> Finding | None:
    first_seen: dict[str, float] = {}  # each name once: reports repeat the same few
    for s in samples:
        for name in (*s.usage.gpu_processes, *s.usage.processes):
            first_seen.setdefault(name, s.at)
    for name, at in first_seen.items():
        if known := matches(name, cfg.miner_programs):
            return Finding("miner_program", f"process {name!r} is the miner {known}", at, at, 1, process=name)
    return None


def _pool_connection(samples: Sequence[Sample], cfg: AbuseConfig) -> Finding | None:
    candidates = sorted({c for s in samples for c in s.usage.connections if c.port in cfg.pool_ports and c.is_public})
    for c in candidates:
        if run := _sustained(samples, lambda s, c=c: c in s.usage.connections, cfg.pool_connection_min_s,
                             cfg.max_sample_gap_s):
            first, last, n = run
            return Finding("pool_connection", f"connected to {c} (a mining pool port) for {last - first:.0f} s",
                           first, last, n, connection=c)
    return None


def _busy_without_activity(samples: Sequence[Sample], touches: Sequence[float], cfg: AbuseConfig) -> Finding | None:
    # A run breaks at a touch: it starts again with the first report after it.
    touch_at = iter(touches)
    next_touch = next(touch_at, None)
    runs: list[list[Sample]] = [[]]
    for s in samples:
        broken = False
        while next_touch is not None and next_touch <= s.at:
            broken, next_touch = True, next(touch_at, None)
        if broken:
            runs.append([])
        runs[-1].append(s)
    for run in runs:
        if hit := _sustained(run, lambda s: s.usage.gpu_busiest_pct >= cfg.gpu_busy_pct, cfg.idle_busy_window_s,
                             cfg.max_sample_gap_s):
            first, last, n = hit
            return Finding("busy_without_activity",
                           f"GPU at {cfg.gpu_busy_pct}% or more for {last - first:.0f} s with no activity", first, last, n)
    return None


def _unknown_gpu_program(samples: Sequence[Sample], cfg: AbuseConfig) -> Finding | None:
    busy = [s for s in samples if s.usage.gpu_busiest_pct >= cfg.gpu_busy_pct]
    names = sorted({n for s in busy for n in s.usage.gpu_processes if not matches(n, cfg.known_gpu_programs)})
    for name in names:
        if hit := _sustained(samples, lambda s, n=name: s.usage.gpu_busiest_pct >= cfg.gpu_busy_pct
                             and n in s.usage.gpu_processes, cfg.batch_busy_window_s, cfg.max_sample_gap_s):
            first, last, n = hit
            return Finding("unknown_gpu_program",
                           f"GPU at {cfg.gpu_busy_pct}% or more for {last - first:.0f} s, used by {name!r}, "
                           "not a known notebook program", first, last, n, process=name)
    return None


def _sustained(samples: Sequence[Sample], holds: Callable[[Sample], bool], min_span_s: float,
               max_gap_s: float) -> tuple[float, float, int] | None:
    """The first run of consecutive reports that all hold, no two more than max_gap_s apart,
    spanning at least min_span_s: (its first report's time, its last's, how many)."""
    start: Sample | None = None
    prev: Sample | None = None
    count = 0
    for s in samples:
        if not holds(s) or (prev is not None and s.at - prev.at > max_gap_s):
            start, count = None, 0
        if holds(s):
            if start is None:
                start = s
            count += 1
            if s.at - start.at >= min_span_s:
                return start.at, s.at, count
        prev = s
    return None
