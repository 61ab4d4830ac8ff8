"""docs/deploy-gke.md's step 6: overlays of one's own, outside the checkout, name the project, the
image and the edited fleet config, and the checkout's manifests stay as shipped."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from test_deploy import K8S, ROOT, kustomize

DOC = ROOT / "docs" / "deploy-gke.md"


def test_the_documented_overlay_renders_with_the_projects_names(tmp_path):
    deploy = tmp_path / "provisioner-deploy"
    shutil.copytree(ROOT / "clusters", deploy / "clusters")
    (deploy / "clusters" / "fleet.yaml").write_text((deploy / "clusters" / "fleet.yaml").read_text() + "# ours\n")
    # the loop of step 6, run as the document has it
    script = re.search(r"(for o in front us-central1 europe-west4 asia-east1; do\n  kind=.*?\ndone\n)",
                       DOC.read_text(), re.S).group(1)
    env = {**os.environ, "CHECKOUT": str(ROOT), "IMAGE": "us-docker.pkg.dev/proj-x/provisioner/provisioner",
           "TAG": "9.9.9", "PROJECT_ID": "proj-x", "SA": "iam.gserviceaccount.com"}
    subprocess.run(["bash", "-euc", script], cwd=deploy, env=env, check=True, timeout=60)
    for overlay, kind in (("front", "front"), ("asia-east1", "cluster")):
        objects = kustomize(deploy / overlay, "--load-restrictor=LoadRestrictionsNone")
        [account] = [o for o in objects if o["kind"] == "ServiceAccount"]
        assert account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"] == \
            f"provisioner-{kind}@proj-x.iam.gserviceaccount.com"
        [deployment] = [o for o in objects if o["kind"] == "Deployment"]
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == \
            "us-docker.pkg.dev/proj-x/provisioner/provisioner:9.9.9"
        [config] = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("provisioner-fleet")]
        assert config["data"]["fleet.yaml"].endswith("# ours\n")
    assert "PROJECT_ID" in (K8S / "base" / "front" / "serviceaccount.yaml").read_text()  # the checkout as shipped
    assert "sed -i" not in DOC.read_text()
