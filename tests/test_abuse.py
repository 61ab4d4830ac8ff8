"""The abuse detector, rule by rule with its evidence, and the `abuse` section of the fleet config."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.rules.abuse import Sample, judge, matches
from provisioner.agent.usage import Connection, Usage
from provisioner.config import ConfigError, FleetSettings, load_settings
from provisioner.config.policy import AbuseConfig

CFG = AbuseConfig()
POOL = Connection("45.9.148.21", 3333)
EVERY = 60.0  # the cluster reads a VM's health once a minute


def series(minutes: float, usage: Usage, start: float = 0.0) -> list[Sample]:
    return [Sample(start + i * EVERY, usage) for i in range(int(minutes * 60 / EVERY) + 1)]


def training(gpu: int = 100) -> Usage:
    return Usage((gpu,), ("python3",), ("bash", "jupyter-lab", "python3", "torchrun"),
                 (Connection("142.250.1.1", 443),))


def test_a_known_miner_name_flags_at_once_with_the_process_and_report():
    samples = series(3, training()) + [Sample(240.0, Usage((100,), ("xmrig-cuda",), ("bash", "xmrig-cuda")))]
    v = judge(samples, [], "interactive", CFG)
    assert v.flagged and v.rule == "miner_program"
    f = v.findings[0]
    assert (f.process, f.first_at, f.last_at, f.samples) == ("xmrig-cuda", 240.0, 240.0, 1)
    assert v.reason == "miner_program: process 'xmrig-cuda' is the miner xmrig"
    # Also under batch, and when only the process list (a CPU miner) shows it.
    assert judge([Sample(0.0, Usage((0,), (), ("T-Rex.exe",)))], [], "batch", CFG).rule == "miner_program"


def test_names_match_versions_and_variants_but_not_other_words():
    assert matches("xmrig", CFG.miner_programs) == "xmrig"
    assert matches("XMRig-6.21.0", CFG.miner_programs) == "xmrig"
    assert matches("python3.11", CFG.known_gpu_programs) == "python"
    assert matches("pythonminer", CFG.known_gpu_programs) == ""
    assert matches("xmrigger", CFG.miner_programs) == ""
    assert matches("miner", CFG.miner_programs) == ""


def test_a_persistent_connection_to_a_pool_port_flags_with_the_connection():
    usage = Usage((100,), ("python3",), ("python3",), (POOL,))
    assert not judge(series(1, usage), [], "batch", CFG).flagged  # 60 s: shorter than pool_connection_min_s
    v = judge(series(2, usage), [], "batch", CFG)
    assert v.rule == "pool_connection"
    f = v.findings[0]
    assert (f.connection, f.first_at, f.last_at, f.samples) == (POOL, 0.0, 120.0, 3)
    assert f.detail == "connected to 45.9.148.21:3333 (a mining pool port) for 120 s"
    assert judge(series(0, usage), [], "batch", AbuseConfig(pool_connection_min_s=0)).rule == "pool_connection"


def test_pool_ports_on_local_addresses_or_broken_by_gaps_do_not_flag():
    local = Usage((100,), (), ("python3",), (Connection("10.128.0.5", 3333), Connection("127.0.0.1", 5555)))
    assert not judge(series(30, local), [], "batch", CFG).flagged
    gappy = [Sample(t, Usage((5,), (), ("python3",), (POOL,))) for t in (0.0, 400.0, 800.0)]
    assert not judge(gappy, [], "batch", CFG).flagged  # 400 s apart: no run to judge


def test_an_interactive_session_busy_and_untouched_for_the_window_flags():
    miner = Usage((100,), ("kworker-x",), ("kworker-x",))  # a renamed miner, no pool port
    v = judge(series(45, miner), [], "interactive", CFG)
    assert v.rule == "busy_without_activity"
    f = v.findings[0]
    assert (f.first_at, f.last_at, f.samples) == (0.0, 2700.0, 46)
    assert not judge(series(44, miner), [], "interactive", CFG).flagged


def test_a_touch_restarts_the_window_and_a_dip_below_busy_breaks_it():
    busy = series(80, Usage((100,), ("python3",), ("python3",)))
    assert not judge(busy, [1500.0, 4000.0], "interactive", CFG).flagged  # never 45 min untouched
    v = judge(busy, [600.0], "interactive", CFG)
    assert v.rule == "busy_without_activity" and v.findings[0].first_at == 600.0  # from the touch on
    dipped = [Sample(s.at, Usage((40,)) if s.at == 1800.0 else s.usage) for s in series(60, busy[0].usage)]
    assert not judge(dipped, [], "interactive", CFG).flagged
    # The busiest GPU counts: one GPU of four mining is busy.
    assert judge(series(45, Usage((0, 100, 3, 0))), [], "interactive", CFG).flagged


def test_a_long_training_batch_at_full_gpu_is_not_flagged():
    # Twelve hours of full GPU in the kernel, no touches (a batch has none), normal processes.
    assert judge(series(720, training()), [], "batch", CFG).findings == ()
    # The same as an interactive session whose user keeps working: fine too.
    assert not judge(series(720, training()), [i * 600.0 for i in range(73)], "interactive", CFG).flagged


def test_a_batch_whose_gpu_is_kept_busy_by_an_unknown_program_flags():
    renamed = Usage((99,), ("python3", "syslogd"), ("python3", "syslogd"))
    v = judge(series(60, renamed), [], "batch", CFG)
    assert v.rule == "unknown_gpu_program"
    f = v.findings[0]
    assert (f.process, f.first_at, f.last_at, f.samples) == ("syslogd", 0.0, 3600.0, 61)
    assert not judge(series(59, renamed), [], "batch", CFG).flagged
    # Not applied to interactive sessions (they have the touch rule), nor to an idle GPU.
    assert not judge(series(60, renamed), [i * 600.0 for i in range(7)], "interactive", CFG).flagged
    assert not judge(series(60, Usage((20,), ("syslogd",))), [], "batch", CFG).flagged


def test_every_rule_that_fires_is_reported_in_order():
    usage = Usage((100,), ("xmrig",), ("xmrig",), (POOL,))
    v = judge(series(45, usage), [], "interactive", CFG)
    assert [f.rule for f in v.findings] == ["miner_program", "pool_connection", "busy_without_activity"]
    assert judge(list(reversed(series(45, usage))), [], "interactive", CFG) == v  # order of the input is free


normal = st.builds(
    Usage,
    st.lists(st.integers(0, 100), min_size=1, max_size=4).map(tuple),
    st.lists(st.sampled_from(["python3", "python3.11", "pt_main_thread", "torchrun"]), max_size=3).map(tuple),
    st.lists(st.sampled_from(["bash", "jupyter-lab", "python3", "tensorboard", "git"]), max_size=5).map(tuple),
    st.lists(st.sampled_from([Connection("142.250.1.1", 443), Connection("151.101.0.223", 80),
                              Connection("10.0.0.2", 3333), Connection("127.0.0.1", 5555)]), max_size=3).map(tuple),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 86_400), normal), max_size=60))
def test_a_batch_of_normal_programs_is_never_flagged(reports):
    """Whatever its GPU use and timing, a batch of notebook programs with no pool connection
    (a pool port on a private or loopback address is not one) is fine."""
    samples = [Sample(at, u) for at, u in reports]
    assert not judge(samples, [], "batch", CFG).flagged


# ---- config ----------------------------------------------------------------------------------

def _settings(tmp_path, text: str) -> FleetSettings:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return load_settings(path)


def test_the_defaults_are_sane_and_the_section_loads(tmp_path):
    s = _settings(tmp_path, "abuse: {dry_run: true, pool_ports: [3333, 14444], idle_busy_window_s: 1800}\n")
    assert s.abuse.dry_run and s.abuse.pool_ports == (3333, 14444) and s.abuse.idle_busy_window_s == 1800
    d = FleetSettings().abuse
    assert not d.dry_run and d.idle_busy_window_s < FleetSettings().sessions.idle_timeout_s
    assert {"xmrig", "t-rex", "nbminer", "lolminer", "ethminer", "phoenixminer", "gminer", "nanominer"} <= set(
        d.miner_programs)
    assert {3333, 4444, 5555, 7777, 14444, 45700} <= set(d.pool_ports)


@pytest.mark.parametrize("text, field, reason", [
    ("abuse: {gpu_busy_pct: 0}", "abuse.gpu_busy_pct", "greater than or equal to 1"),
    ("abuse: {pool_ports: [3333, 70000]}", "abuse.pool_ports[1]", "less than or equal to 65535"),
    ("abuse: {pool_ports: [3333, 3333]}", "abuse.pool_ports[1]", "listed twice"),
    ("abuse: {miner_programs: [xmrig, XMRig]}", "abuse.miner_programs[1]", "lower-case"),
    ("abuse: {miner_programs: [/usr/bin/xmrig]}", "abuse.miner_programs[0]", "without a path"),
    ("abuse: {known_gpu_programs: [python, xmrig]}", "abuse.known_gpu_programs", "also listed as miners: xmrig"),
    ("abuse: {max_sample_gap_s: 600, idle_busy_window_s: 300}", "abuse.idle_busy_window_s", "must be >= max_sample_gap_s"),
    ("abuse: {idle_busy_window_s: 3600}", "abuse.idle_busy_window_s", "must be < sessions.idle_timeout_s"),
    ("abuse: {dry_run: maybe}", "abuse.dry_run", "boolean"),
    ("abuse: {typo: 1}", "abuse.typo", "unknown field"),
])
def test_bad_settings_name_the_field(tmp_path, text, field, reason):
    with pytest.raises(ConfigError) as err:
        _settings(tmp_path, text + "\n")
    assert err.value.field == field and reason in err.value.reason, str(err.value)


def test_the_detector_imports_no_grpc_asyncio_or_io_library():
    """The cluster core calls it inside its pure state machine."""
    code = ("import sys, provisioner.rules.abuse; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'grpc', 'asyncio', 'sqlite3', 'google', 'opentelemetry', 'http', 'subprocess', 'yaml', 'pydantic'}"
            " or m == 'urllib.request'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
