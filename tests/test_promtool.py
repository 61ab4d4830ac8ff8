"""Prometheus's own checker accepts what the processes serve on /metrics (one HELP and TYPE per
family, even with three clusters in one `up`) and the alert rules in deploy/. promtool comes with
Debian's `prometheus` package; .ci/run installs it, and with PROVISIONER_REQUIRE_PROMTOOL set
these tests fail instead of skipping without it."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from local_up import Up, clusters_on_free_ports
from provisioner.perf.fleet import free_port
from test_processes import Fleet

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "kubernetes" / "monitoring" / "prometheusrule.yaml"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("PROVISIONER_REQUIRE_PROMTOOL"):
            pytest.fail("promtool is not on the PATH, and PROVISIONER_REQUIRE_PROMTOOL is set (CI must run this test)")
        pytest.skip("promtool is not on the PATH (apt-get install prometheus)")
    return found


def check_metrics(text: str) -> None:
    out = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    types = re.findall(r"^# TYPE (\S+) ", text, re.M)
    assert len(types) == len(set(types)), sorted(t for t in types if types.count(t) > 1)


async def scrape(address: str) -> str:
    def get() -> str:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
            return resp.read().decode()
    return await asyncio.to_thread(get)


def test_the_alert_rules_pass_promtool(tmp_path):
    spec = yaml.safe_load(RULES.read_text())["spec"]
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(spec))
    out = subprocess.run([promtool(), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr


async def test_a_scrape_of_up_passes_promtool(tmp_path):
    promtool()
    metrics = f"127.0.0.1:{free_port()}"
    up = Up(clusters_on_free_ports(tmp_path / "clusters"), tmp_path / "data", "--metrics-address", metrics)
    await up.started()
    try:
        text = await scrape(metrics)
        assert text.count('provisioner_sessions{cluster="') and text.count("# TYPE provisioner_sessions gauge") == 1
        assert {m for m in re.findall(r'provisioner_sessions\{cluster="([^"]+)"', text)} == {
            "us-central1", "europe-west4", "asia-east1"}
        check_metrics(text)
    finally:
        await up.stop()


async def test_a_scrape_of_each_serve_passes_promtool(tmp_path):
    promtool()
    fleet = Fleet(tmp_path)
    addresses = {}
    for name, service in [*fleet.clusters.items(), ("front", fleet.front)]:
        addresses[name] = f"127.0.0.1:{free_port()}"
        service.argv += ["--metrics-address", addresses[name]]
    try:
        await fleet.start()
        for name, address in addresses.items():
            text = await scrape(address)
            assert ("provisioner_front_cluster_healthy" if name == "front" else f'cluster="{name}"') in text
            check_metrics(text)
    finally:
        for s in fleet.services:
            await s.kill()
