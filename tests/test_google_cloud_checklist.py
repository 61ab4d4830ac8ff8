"""docs/google-cloud.md's project checklist, run in order as the page has it, with `gcloud`
recording each command instead of calling Google: every resource a command names (a service
account, a repository, a bucket, a network, a subnetwork, a router) was made by an earlier
step, every API a step needs was enabled before it, and the operators' impersonation of oncall@
rests on the role Google documents for `--impersonate-service-account` (Service Account Token
Creator: the OpenID Connect token creator role alone does not let gcloud impersonate)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from provisioner.cloud.gce_instance import NOTEBOOK_PORT

DOC = Path(__file__).resolve().parent.parent / "docs" / "google-cloud.md"
SEP = "\x1f"
# gcloud and the build step record their arguments, one command a line.
STUBS = f"""gcloud() {{ printf '%s{SEP}' gcloud "$@" >> "$LOG"; echo >> "$LOG"; }}
python3() {{ printf '%s{SEP}' python3 "$@" >> "$LOG"; echo >> "$LOG"; }}
"""


def checklist() -> str:
    text = DOC.read_text()
    return text[text.index("## What a Google Cloud project needs"):text.index("## Spot VMs")]


def flag(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
        if a == f"--{name}" and i + 1 < len(args):
            return args[i + 1]
    return None


class Project:
    """What the recorded commands have made so far, and the refusals a real project would give."""

    def __init__(self):
        self.apis: set[str] = set()
        self.made: set[tuple[str, str]] = set()  # (kind, name)
        self.grants: set[tuple[str, str, str]] = set()  # (resource, member, role)

    def need(self, kind: str, name: str | None, what: str) -> None:
        assert (kind, name) in self.made, f"{what}: the {kind} {name} was not made by an earlier step"

    def api(self, api: str, what: str) -> None:
        assert f"{api}.googleapis.com" in self.apis, f"{what}: {api}.googleapis.com is not enabled before it"

    def member(self, member: str | None, what: str) -> None:
        if member and member.startswith("serviceAccount:"):
            self.need("account", member.split(":", 1)[1], what)

    def run(self, args: list[str]) -> None:
        words, what = [a for a in args if not a.startswith("-")], " ".join(args[:5])
        cmd = tuple(words[1:4])
        if words[1:3] == ["services", "enable"]:
            self.apis.update(words[3:])
        elif cmd == ("iam", "service-accounts", "create"):
            self.api("iam", what)
            self.made.add(("account", f"{words[4]}@my-project.iam.gserviceaccount.com"))
        elif cmd[:2] == ("iam", "service-accounts") or cmd[:2] == ("projects", "add-iam-policy-binding"):
            resource = words[4] if cmd[0] == "iam" else words[3]
            if cmd[0] == "iam":
                self.need("account", resource, what)
            self.member(flag(args, "member"), what)
            self.grants.add((resource, flag(args, "member") or "", flag(args, "role") or ""))
        elif cmd[:2] == ("artifacts", "repositories"):
            self.api("artifactregistry", what)
            if cmd[2] == "create":
                self.made.add(("repository", words[4]))
            else:
                self.need("repository", words[4], what)
                self.member(flag(args, "member"), what)
        elif cmd[:2] == ("storage", "buckets"):
            if cmd[2] == "create":
                self.made.add(("bucket", words[4]))
            else:
                self.need("bucket", words[4], what)
                self.member(flag(args, "member"), what)
        elif words[1] == "compute" and words[2] in ("networks", "routers", "firewall-rules", "instances", "images"):
            self.compute(words, args, what)
        elif words[1:3] == ["auth", "print-identity-token"]:
            self.impersonate(flag(args, "impersonate-service-account"), what)

    def compute(self, words: list[str], args: list[str], what: str) -> None:
        self.api("compute", what)
        if words[2:4] == ["networks", "create"]:
            self.made.add(("network", words[4]))
        elif words[2:5] == ["networks", "subnets", "create"]:
            self.need("network", flag(args, "network"), what)
            self.made.add(("subnetwork", f"regions/{flag(args, 'region')}/subnetworks/{words[5]}"))
        elif words[2:4] == ["routers", "create"]:
            self.need("network", flag(args, "network"), what)
            self.made.add(("router", words[4]))
        elif words[2:5] == ["routers", "nats", "create"]:
            self.need("router", flag(args, "router"), what)
        elif words[2:4] == ["firewall-rules", "create"]:
            self.need("network", flag(args, "network"), what)
            assert flag(args, "rules") == f"tcp:{NOTEBOOK_PORT}", "the inbound rule is the notebook port"
            self.need("account", flag(args, "target-service-accounts"), what)
        elif words[2:4] == ["instances", "create"]:
            self.need("account", flag(args, "service-account"), what)
            self.need("subnetwork", f"regions/{flag(args, 'zone')[:-2]}/subnetworks/{flag(args, 'subnet')}", what)

    def impersonate(self, account: str | None, what: str) -> None:
        self.need("account", account, what)
        self.api("iamcredentials", what)
        roles = {role for resource, _, role in self.grants if resource == account}
        assert "roles/iam.serviceAccountTokenCreator" in roles, \
            f"{what}: nobody may impersonate {account} (gcloud's --impersonate-service-account needs Token Creator)"


def recorded(tmp_path) -> list[list[str]]:
    blocks = re.findall(r"```sh\n(.*?)```", checklist(), re.S)
    log = tmp_path / "gcloud.log"
    log.write_text("")
    subprocess.run(["bash", "-uc", STUBS + "\n".join(blocks)], env={"LOG": str(log), "PATH": "/usr/bin:/bin"},
                   cwd=DOC.parent.parent, check=True, timeout=60)
    return [line.split(SEP)[:-1] for line in log.read_text().splitlines()]


def test_the_steps_are_numbered_in_order():
    numbers = [int(n) for n in re.findall(r"^### (\d+)\. ", checklist(), re.M)]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 8


def test_the_checklist_runs_in_order_on_a_new_project(tmp_path):
    project = Project()
    commands = recorded(tmp_path)
    for args in commands:
        if args[0] == "gcloud":
            project.run(args)
    assert any(a[1:3] == ["auth", "print-identity-token"] for a in commands)
    # The cluster's config names what the steps made.
    [config] = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", checklist(), re.S) if "backend:" in b]
    backend = config["backend"]
    project.need("account", backend["service_account"], "backend.service_account")
    project.need("network", backend["network"].rsplit("/", 1)[-1], "backend.network")
    project.need("subnetwork", backend["subnetwork"], "backend.subnetwork")
    # The provisioners may start VMs that run as that account.
    cluster = "serviceAccount:provisioner-cluster@my-project.iam.gserviceaccount.com"
    assert (backend["service_account"], cluster, "roles/iam.serviceAccountUser") in project.grants
