"""The container image, as far as it can be checked without a container engine: the Dockerfile's
stages, its user, what it installs and from where, and that the build context holds what it
copies."""

from __future__ import annotations

import fnmatch
import re
import shlex
import tomllib
from pathlib import Path

from provisioner import config

ROOT = Path(__file__).resolve().parent.parent
BUILD_TOOLS = ("gcc", "g++", "build-essential", "make", "python3-dev", "libpq-dev")


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for ins in instructions():
        if ins[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


def args() -> dict[str, str]:
    return dict(rest.split("=", 1) for word, rest in instructions() if word == "ARG" and "=" in rest)


def test_multi_stage_on_a_slim_base_without_build_tools():
    builder, final = stages()
    base = final[0][1].replace("${PYTHON_IMAGE}", args()["PYTHON_IMAGE"])
    assert re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", base), base
    for word, rest in final:
        assert not re.search(r"\b(apt-get|apk|pip)\s+install\b", rest), rest  # installs happen in the builder
        assert not any(re.search(rf"(^|\s){re.escape(tool)}(\s|$)", rest) for tool in BUILD_TOOLS), rest
    copied = [rest for word, rest in final if word == "COPY" and "--from=builder" in rest]
    assert any("/opt/provisioner" in c for c in copied)


def test_runs_as_an_unprivileged_user():
    final = stages()[-1]
    users = [rest for word, rest in final if word == "USER"]
    assert users, "the final stage sets no USER: it would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0") and int(user) >= 1000
    # The Kubernetes manifests run it with the same ids.
    for base in ("front", "cluster"):
        text = (ROOT / "deploy" / "kubernetes" / "base" / base / "deployment.yaml").read_text()
        assert f"runAsUser: {user}" in text


def test_installs_the_package_from_its_own_metadata():
    builder = stages()[0]
    runs = " ".join(rest for word, rest in builder if word == "RUN")
    assert re.search(r"pip install \"\.\[server\]\"", runs)
    copies = [shlex.split(rest)[:-1] for word, rest in builder if word == "COPY"]
    assert ["pyproject.toml", "README.md"] in copies and ["provisioner"] in copies
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    server = meta["optional-dependencies"]["server"]
    # Every server dependency carries a version: exactly, or bounded.
    for requirement in server:
        assert re.search(r"(==|>=|<)", requirement), requirement
    entry, = [rest for word, rest in instructions() if word == "ENTRYPOINT"]
    assert entry == '["provisioner"]' and "provisioner" in meta["scripts"]


def test_the_fleet_config_goes_where_the_lookup_finds_it():
    final = stages()[-1]
    copies = [shlex.split(rest) for word, rest in final if word == "COPY" and "--from" not in rest]
    assert ["clusters/*.yaml", f"{config.ETC_CLUSTERS}/"] in copies
    env = " ".join(rest for word, rest in final if word == "ENV")
    assert f"PROVISIONER_CLUSTERS={config.ETC_CLUSTERS}" in env


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern that matches decides; `!` re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.removeprefix("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if any(fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p, pattern.removeprefix("**/"))
               for p in prefixes):
            ignored = not negate
    return ignored


def test_the_build_context_holds_what_is_copied_and_nothing_else():
    patterns = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    for word, rest in instructions():
        if word != "COPY" or "--from" in rest:
            continue
        for source in shlex.split(rest)[:-1]:
            matches = list(ROOT.glob(source))
            assert matches, source
            for path in matches:
                files = [path] if path.is_file() else [p for p in path.rglob("*.py")]
                for f in files:
                    assert not _ignored(str(f.relative_to(ROOT)), patterns), f
    for unwanted in (".venv/bin/python", ".data/front.db", ".git/HEAD", "tests/conftest.py",
                     "provisioner/__pycache__/config.cpython-311.pyc"):
        assert _ignored(unwanted, patterns), unwanted


def test_exposes_the_ports_the_manifests_use():
    exposed = {int(p) for word, rest in instructions() if word == "EXPOSE" for p in rest.split()}
    for base in ("front", "cluster"):
        text = (ROOT / "deploy" / "kubernetes" / "base" / base / "deployment.yaml").read_text()
        ports = {int(p) for p in re.findall(r"containerPort: (\d+)", text)}
        assert ports <= exposed, (base, ports - exposed)
