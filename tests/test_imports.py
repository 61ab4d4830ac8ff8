"""Import contracts between the package's layers, read from the modules' syntax trees."""

from __future__ import annotations

import ast
from pathlib import Path

import provisioner

PACKAGE = Path(provisioner.__file__).parent


def package_of(path: Path) -> str:
    return ".".join(("provisioner", *path.relative_to(PACKAGE).parent.parts))


def imported_modules(source: str, package: str) -> set[str]:
    """Every module a module of `package` imports, absolute, wherever the import statement is
    (also inside functions)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package, up level - 1
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            # `from provisioner import cluster` imports a module as a name: count the names too.
            out.update({base, *(f"{base}.{alias.name}" for alias in node.names)})
    return out


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_front_imports_nothing_from_the_cluster():
    files = sorted((PACKAGE / "front").rglob("*.py"))
    assert files
    found = {f"{path.relative_to(PACKAGE)}: {m}" for path in files
             for m in imported_modules(path.read_text(), package_of(path)) if within(m, "provisioner.cluster")}
    assert found == set()


def test_the_import_reader_sees_every_form_of_import():
    """The contract above is only as good as the reader: each way of naming the cluster package counts."""
    for source in ("import provisioner.cluster.core", "from provisioner.cluster.core import cluster_of",
                   "from provisioner import cluster", "from ..cluster import service", "from .. import cluster",
                   "def f():\n    from provisioner.cluster import runtime"):
        assert any(within(m, "provisioner.cluster") for m in imported_modules(source, "provisioner.front")), source
    assert not any(within(m, "provisioner.cluster") for m in imported_modules(
        "from provisioner import clock\nimport provisioner.clusters_of_other_name", "provisioner.front"))


# The cluster's brain is pure: no I/O, no network, no wall clock, no event loop, no tracing.
DECIDE_FORBIDDEN = ("grpc", "google.cloud", "provisioner.store", "asyncio", "time", "datetime", "opentelemetry")


def test_the_decision_package_imports_no_io_clock_or_event_loop():
    files = sorted((PACKAGE / "decide").rglob("*.py"))
    assert len(files) > 10
    found = {f"{path.relative_to(PACKAGE)}: {m}" for path in files
             for m in imported_modules(path.read_text(), package_of(path))
             if any(within(m, forbidden) for forbidden in DECIDE_FORBIDDEN)}
    assert found == set()
    # What the rule would catch, in the forms a decision module might use.
    caught = imported_modules("import time\nfrom datetime import datetime\nfrom provisioner import store\n"
                              "from google.cloud import compute_v1", "provisioner.decide")
    assert all(any(within(m, f) for m in caught) for f in ("time", "datetime", "provisioner.store", "google.cloud"))
