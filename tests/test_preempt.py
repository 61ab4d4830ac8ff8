"""Priority classes and preemption: the rule (who is preempted, in what order, why), the grace
plan, and the `priority` section of the fleet config."""

from __future__ import annotations

import ast
import math
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.config import ConfigError, FleetSettings, default_clusters_dir, load_fleet, load_settings
from provisioner.config.policy import PriorityClassConfig
from provisioner.decide import preemption_rules as preempt
from provisioner.decide.preemption_rules import Held, Request, Running, Share, Victim, choose_victims, grace_plan, mark_over_share

CLASSES = FleetSettings().priority.classes  # interactive 100, never preempted; batch 10, preemptible


def running(id: str, owner: str, klass: str, started_at: float, over_share: bool, gpus: int = 1) -> Running:
    return Running(id, owner, klass, gpus, started_at, over_share)


# The README's example: a full pool of 8 GPUs, a share of 2 GPUs per user. ben holds 4 (2 over his
# share), cho 3 (1 over), ana 1.
EXAMPLE = (
    running("s1", "ana", "interactive", 0, False),
    running("s2", "ben", "batch", 100, False),
    running("s3", "ben", "batch", 200, False),
    running("s4", "ben", "batch", 300, True),
    running("s5", "ben", "batch", 400, True),
    running("s6", "cho", "batch", 150, False),
    running("s7", "cho", "batch", 500, False),
    running("s8", "cho", "batch", 600, True),
)
SHARES = {"ana": Share(2, 1), "ben": Share(2, 4), "cho": Share(2, 3), "dee": Share(2, 0)}


def ids(victims) -> list[str]:
    return [v.session_id for v in victims]


# ---- the rule, by example --------------------------------------------------------------------

def test_the_readme_example_over_share_first_then_the_most_over_then_the_youngest():
    victims = choose_victims(Request("dee", "interactive", 2), EXAMPLE, SHARES, CLASSES)
    assert ids(victims) == ["s5", "s4"]
    assert victims[0].detail == ("batch session s5 started at 400, over its owner's share (ben holds 4 GPUs of a "
                                 "2-GPU share): frees 1 GPU for dee's interactive session within their share "
                                 "(0 + 2 of 2 GPUs)")
    # The whole order, for a user with room for 7 GPUs: over share (ben's before cho's, as ben is
    # further over; youngest first), then batch within its share (lower rank than interactive).
    roomy = SHARES | {"dee": Share(8, 0)}
    assert ids(choose_victims(Request("dee", "interactive", 7), EXAMPLE, roomy, CLASSES)) == \
        ["s5", "s4", "s8", "s3", "s2", "s7", "s6"]
    # Only interactive s1 is left, and it is never preempted: 8 GPUs cannot be freed.
    assert choose_victims(Request("dee", "interactive", 8), EXAMPLE, SHARES | {"dee": Share(8, 0)}, CLASSES) is None


def test_each_victim_says_why():
    over, within = choose_victims(Request("dee", "interactive", 7), EXAMPLE, SHARES | {"dee": Share(8, 0)},
                                  CLASSES)[2:4]
    assert over == Victim("s8", "cho", 1, "over_share",
                          "batch session s8 started at 600, over its owner's share (cho holds 3 GPUs of a 2-GPU "
                          "share): frees 1 GPU for dee's interactive session within their share (0 + 7 of 8 GPUs)")
    assert within.cause == "lower_priority" and within.detail.startswith(
        "batch session s3 started at 200, class batch (rank 10) below interactive (rank 100): frees 1 GPU")


def test_a_requester_over_its_own_share_preempts_nothing():
    assert choose_victims(Request("ana", "interactive", 2), EXAMPLE, SHARES, CLASSES) is None  # 1 + 2 > 2
    assert ids(choose_victims(Request("ana", "interactive", 1), EXAMPLE, SHARES, CLASSES)) == ["s5"]
    assert choose_victims(Request("ben", "interactive", 1), EXAMPLE, SHARES, CLASSES) is None


def test_a_batch_within_its_share_takes_only_borrowed_gpus_never_another_batch_within_its_share():
    assert ids(choose_victims(Request("dee", "batch", 2), EXAMPLE, SHARES, CLASSES)) == ["s5", "s4"]
    roomy = SHARES | {"dee": Share(8, 0)}
    assert ids(choose_victims(Request("dee", "batch", 3), EXAMPLE, roomy, CLASSES)) == ["s5", "s4", "s8"]
    assert choose_victims(Request("dee", "batch", 4), EXAMPLE, roomy, CLASSES) is None
    within = [s for s in EXAMPLE if not s.over_share]
    assert choose_victims(Request("dee", "batch", 1), within, SHARES, CLASSES) is None
    assert ids(choose_victims(Request("dee", "interactive", 1), within, SHARES, CLASSES)) == ["s3"]


def test_a_victim_a_later_larger_one_made_unnecessary_is_spared():
    pool = (running("small", "ben", "batch", 500, True), running("big", "ben", "batch", 100, True, gpus=4))
    shares = {"ben": Share(0, 5), "dee": Share(4, 0)}
    # Youngest first takes small (1 GPU), then big (4): big alone frees the 4 asked for.
    assert ids(choose_victims(Request("dee", "interactive", 4), pool, shares, CLASSES)) == ["big"]
    assert ids(choose_victims(Request("dee", "interactive", 1), pool, shares, CLASSES)) == ["small"]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="at least one GPU"):
        choose_victims(Request("dee", "interactive", 0), EXAMPLE, SHARES, CLASSES)
    with pytest.raises(ValueError, match="distinct ids"):
        choose_victims(Request("dee", "interactive", 1), EXAMPLE + EXAMPLE[:1], SHARES, CLASSES)
    with pytest.raises(ValueError, match="no share given for user 'eve'"):
        choose_victims(Request("eve", "interactive", 1), EXAMPLE, SHARES, CLASSES)
    with pytest.raises(ValueError, match="unknown priority class 'gold'; classes: batch, interactive"):
        choose_victims(Request("dee", "gold", 1), EXAMPLE, SHARES, CLASSES)


# ---- the rule, as properties -----------------------------------------------------------------

PROPERTY_CLASSES = {"interactive": PriorityClassConfig(rank=100), "service": PriorityClassConfig(rank=50),
                    "batch": PriorityClassConfig(rank=10, preemptible=True),
                    "scavenger": PriorityClassConfig(rank=0, preemptible=True),
                    "training": PriorityClassConfig(rank=10, preemptible=True)}
OWNERS = ("ana", "ben", "cho", "dee")


@st.composite
def pools(draw, gpus=st.integers(1, 4)):
    """A request, the running sessions (start times drawn from few values, so ties happen) and
    every owner's share with the GPUs their sessions hold."""
    rows = draw(st.lists(st.tuples(st.sampled_from(OWNERS), st.sampled_from(sorted(PROPERTY_CLASSES)), gpus,
                                   st.sampled_from((0.0, 60.0, 120.0, 3600.0)), st.booleans()), max_size=12))
    sessions = tuple(Running(f"s{i}", *row) for i, row in enumerate(rows))
    shares = {o: Share(draw(st.integers(0, 12)), sum(s.gpus for s in sessions if s.owner == o)) for o in OWNERS}
    request = Request(draw(st.sampled_from(OWNERS)), draw(st.sampled_from(sorted(PROPERTY_CLASSES))),
                      draw(st.integers(1, 6)))
    return request, sessions, shares


def may_take(request: Request, s: Running) -> bool:
    c = PROPERTY_CLASSES[s.klass]
    return c.preemptible and (s.over_share or c.rank < PROPERTY_CLASSES[request.klass].rank)


def goes_before(a: Running, b: Running, shares: dict[str, Share]) -> bool:
    """The documented order, as a comparison: over share first, lowest rank, the owner most over
    their share, the youngest, then the id."""
    ra, rb = PROPERTY_CLASSES[a.klass].rank, PROPERTY_CLASSES[b.klass].rank
    oa, ob = shares[a.owner].over_by, shares[b.owner].over_by
    if a.over_share != b.over_share:
        return a.over_share
    if ra != rb:
        return ra < rb
    if oa != ob:
        return oa > ob
    if a.started_at != b.started_at:
        return a.started_at > b.started_at
    return a.id < b.id


def in_rule_order(sessions, shares) -> list[Running]:
    out: list[Running] = []
    for s in sessions:  # insertion sort by goes_before, independent of the module's sort key
        i = next((i for i, t in enumerate(out) if goes_before(s, t, shares)), len(out))
        out.insert(i, s)
    return out


@settings(max_examples=150, deadline=None)
@given(pools())
def test_frees_enough_when_allowed_and_possible_and_no_victim_is_unneeded(case):
    request, sessions, shares = case
    victims = choose_victims(request, sessions, shares, PROPERTY_CLASSES)
    within = shares[request.owner].used + request.gpus <= shares[request.owner].gpus
    takeable = sum(s.gpus for s in sessions if may_take(request, s))
    if not within or takeable < request.gpus:
        assert victims is None
        return
    assert victims is not None
    by_id = {s.id: s for s in sessions}
    freed = sum(v.gpus for v in victims)
    assert freed >= request.gpus
    for v in victims:
        assert may_take(request, by_id[v.session_id])
        assert PROPERTY_CLASSES[by_id[v.session_id].klass].preemptible
        assert by_id[v.session_id].klass not in ("interactive", "service")
        assert freed - v.gpus < request.gpus, f"{v.session_id} was not needed"
        assert v.cause == ("over_share" if by_id[v.session_id].over_share else "lower_priority")


@settings(max_examples=150, deadline=None)
@given(pools())
def test_victims_follow_the_order_and_come_from_its_shortest_sufficient_prefix(case):
    request, sessions, shares = case
    victims = choose_victims(request, sessions, shares, PROPERTY_CLASSES)
    if not victims:
        return
    order = in_rule_order([s for s in sessions if may_take(request, s)], shares)
    positions = [[s.id for s in order].index(v.session_id) for v in victims]
    assert positions == sorted(positions)
    prefix, total = 0, 0
    while total < request.gpus:
        total += order[prefix].gpus
        prefix += 1
    assert max(positions) < prefix


@settings(max_examples=150, deadline=None)
@given(pools(gpus=st.just(2)))
def test_with_sessions_of_one_size_the_victims_are_the_first_in_the_order(case):
    """As in a real pool, where every session holds one VM of the pool's shape."""
    request, sessions, shares = case
    victims = choose_victims(request, sessions, shares, PROPERTY_CLASSES)
    if victims is None:
        return
    order = in_rule_order([s for s in sessions if may_take(request, s)], shares)
    assert ids(victims) == [s.id for s in order[:math.ceil(request.gpus / 2)]]


@settings(max_examples=100, deadline=None)
@given(pools(), st.randoms(use_true_random=False))
def test_the_answer_does_not_depend_on_the_order_of_the_input(case, random):
    request, sessions, shares = case
    shuffled = list(sessions)
    random.shuffle(shuffled)
    reordered_shares = dict(reversed(shares.items()))
    assert choose_victims(request, shuffled, reordered_shares, PROPERTY_CLASSES) == \
        choose_victims(request, sessions, shares, PROPERTY_CLASSES)


@settings(max_examples=100, deadline=None)
@given(pools())
def test_an_interactive_session_is_never_preempted_under_the_shipped_classes(case):
    request, sessions, shares = case
    shipped = {s.klass: ("interactive" if s.klass in ("interactive", "service") else "batch") for s in sessions}
    sessions = tuple(Running(s.id, s.owner, shipped[s.klass], s.gpus, s.started_at, s.over_share) for s in sessions)
    request = Request(request.owner, "interactive" if request.klass in ("interactive", "service") else "batch",
                      request.gpus)
    interactive = {s.id for s in sessions if s.klass == "interactive"}
    victims = choose_victims(request, sessions, shares, CLASSES) or ()
    assert not interactive & set(ids(victims))


# ---- the grace plan --------------------------------------------------------------------------

def test_a_preempted_session_is_warned_at_once_and_stopped_after_the_grace_period():
    victim = choose_victims(Request("dee", "interactive", 1), EXAMPLE, SHARES, CLASSES)[0]
    plan = grace_plan(victim, decided_at=1000.0, grace_period_s=120.0, requeue=True)
    assert (plan.session_id, plan.warn_at, plan.stop_at, plan.requeue) == ("s5", 1000.0, 1120.0, True)
    assert plan.detail == victim.detail
    assert not grace_plan(victim, 1000.0, 0.0, requeue=False).requeue
    assert grace_plan(victim, 1000.0, 0.0, requeue=False).stop_at == 1000.0  # no grace: stopped at once
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="grace_period_s"):
            grace_plan(victim, 1000.0, bad, requeue=False)


def test_the_rule_imports_nothing_but_the_standard_library_s_pure_parts():
    """The cluster core calls it inside its pure state machine: no clock, randomness, I/O or config."""
    tree = ast.parse(Path(preempt.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | {
        n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported == {"__future__", "math", "dataclasses", "typing"}


# ---- config ----------------------------------------------------------------------------------

def _settings(tmp_path, text: str) -> FleetSettings:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return load_settings(path)


def test_the_defaults_guarantee_each_user_two_gpus_in_every_pool():
    p = FleetSettings().priority
    assert p.classes["interactive"].rank > p.classes["batch"].rank
    assert not p.classes[p.class_of("interactive")].preemptible and p.classes[p.class_of("batch")].preemptible
    assert p.grace_period_s == 120.0
    assert p.share_gpus("gpu-p100") == p.share_gpus("gpu-t4x2") == 2
    assert load_fleet(default_clusters_dir()).settings.priority == p  # the shipped fleet.yaml spells out the defaults


def test_the_section_loads_with_classes_kinds_and_shares(tmp_path):
    p = _settings(tmp_path, """
priority:
  classes:
    notebook: {rank: 50}
    training: {rank: 20, preemptible: true}
    scavenger: {rank: 0, preemptible: true}
  kinds: {interactive: notebook, batch: training}
  grace_period_s: 300
  share_gpus_per_user: 1
  pool_share_gpus_per_user: {gpu-p100: 2}
""").priority
    assert (p.class_of("interactive"), p.class_of("batch")) == ("notebook", "training")
    assert p.classes["scavenger"].preemptible and not p.classes["notebook"].preemptible
    assert (p.grace_period_s, p.share_gpus("gpu-p100"), p.share_gpus("gpu-t4")) == (300, 2, 1)


@pytest.mark.parametrize("text, field, reason", [
    ("priority: {classes: {}}", "priority.classes", "at least one class"),
    ("priority: {classes: {interactive: {rank: 1}}}", "priority.kinds.batch", "no class 'batch'; classes: interactive"),
    ("priority: {kinds: {batch: low}}", "priority.kinds.batch", "no class 'low'"),
    ("priority: {kinds: {interactive: batch}}", "priority.classes.batch.preemptible", "never preempted"),
    ("priority: {classes: {interactive: {rank: 1, preemptible: true}, batch: {rank: 0}}}",
     "priority.classes.interactive.preemptible", "never preempted"),
    ("priority: {kinds: {training: batch}}", "priority.kinds.training[key]", "'interactive' or 'batch'"),
    ("priority: {classes: {interactive: {rank: -1}, batch: {rank: 0}}}", "priority.classes.interactive.rank",
     "greater than or equal to 0"),
    ("priority: {classes: {Interactive: {rank: 1}}}", "priority.classes.Interactive[key]", "should match pattern"),
    ("priority: {grace_period_s: -5}", "priority.grace_period_s", "greater than or equal to 0"),
    ("priority: {share_gpus_per_user: 1.5}", "priority.share_gpus_per_user", "integer"),
    ("priority: {classes: {batch: {rank: 1, typo: 2}}}", "priority.classes.batch.typo", "unknown field"),
])
def test_bad_settings_name_the_field(tmp_path, text, field, reason):
    with pytest.raises(ConfigError) as err:
        _settings(tmp_path, text + "\n")
    assert err.value.field == field and reason in err.value.reason, str(err.value)


def test_a_share_for_a_pool_no_cluster_has_names_fleet_yaml_and_the_pools(tmp_path):
    d = tmp_path / "clusters"
    shutil.copytree(default_clusters_dir(), d)
    fleet = yaml.safe_load((d / "fleet.yaml").read_text())
    fleet["priority"]["pool_share_gpus_per_user"] = {"gpu-p1000": 2}
    (d / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    with pytest.raises(ConfigError) as err:
        load_fleet(d)
    e = err.value
    assert e.file == str(d / "fleet.yaml") and e.field == "priority.pool_share_gpus_per_user.gpu-p1000", str(e)
    assert "no cluster has a pool 'gpu-p1000'; pools: " in e.reason and "gpu-p100" in e.reason


def test_sessions_left_out_but_counted_ahead_fill_the_share_first():
    held = [Held("b1", "ben", "batch", 1, 100.0), Held("b2", "ben", "batch", 1, 200.0)]
    # ben also holds 1 GPU in an interactive session not listed: with a 2-GPU share only b1 fits.
    marked = {r.id: r.over_share for r in mark_over_share(held, 2, CLASSES, {"ben": 1})}
    assert marked == {"b1": False, "b2": True}
    assert {r.id: r.over_share for r in mark_over_share(held, 2, CLASSES)} == {"b1": False, "b2": False}
