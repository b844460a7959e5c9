"""The dependency rule of docs/concepts/design.md §2/§8, checked with import-linter (contract in pyproject.toml).

service -> tuner -> db, kernels; db and kernels import nothing of ours (and
not each other). ``lint-imports`` runs here so ``make test`` and CI enforce it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_layers_contract_is_kept():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert exe, "lint-imports not installed (it is in the `test` extra)"
    r = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "service -> tuner -> db | kernels KEPT" in r.stdout
    assert "Contracts: 1 kept, 0 broken." in r.stdout


def test_contract_has_no_ignored_imports():
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert cfg["root_packages"] == ["kvsplit.kernels", "kvsplit.db", "kvsplit.tuner", "kvsplit.service"]
    for c in cfg["contracts"]:
        assert "ignore_imports" not in c, c["name"]
