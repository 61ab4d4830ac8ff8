"""The package layers and the absence of import cycles, as declared in pyproject.toml's
[tool.importlinter] section, checked with import-linter on the package as it is."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
        "sys.argv = ['lint-imports', '--no-cache']; lint_imports_command()"]


def lint(tree: Path) -> subprocess.CompletedProcess:
    # PYTHONPATH first, so the tree's own copy of the package is the one analysed.
    return subprocess.run(LINT, cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)


def test_every_layer_contract_holds():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 kept, 0 broken" in out.stdout


def test_an_import_against_the_layers_breaks_the_contracts(tmp_path):
    """The check is only worth as much as its ability to fail: the model importing the CLI is
    both a layer violation and a cycle."""
    shutil.copytree(ROOT / "provisioner", tmp_path / "provisioner", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    records = tmp_path / "provisioner" / "model" / "records.py"
    records.write_text(records.read_text() + "\nfrom provisioner.cli import serve  # noqa\n")
    out = lint(tmp_path)
    assert out.returncode != 0
    assert "provisioner.model is not allowed to import provisioner.cli" in out.stdout, out.stdout
    assert "0 kept, 2 broken" in out.stdout
