"""A regular (non-editable) wheel carries every module and data file of the four folders."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"kernels": "kvsplit/kernels", "tuner": "kvsplit/tuner", "db": "kvsplit/db", "service": "kvsplit/service"}
DATA = ("*.json", "*.csv", "*.html", "*.mako", "README.md")


def test_wheel_has_every_module_and_data_file(tmp_path):
    # -v: pip passes the backend's output (setuptools' warnings) through
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-v",
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    log = out.stdout + out.stderr
    assert "running bdist_wheel" in log  # the backend's output is in the log, so the checks below can fail
    for bad in ("would be ignored", "SetuptoolsDeprecationWarning", "project.license` as a TOML table"):
        assert bad not in log, (
            f"build output has {bad!r}:\n"
            + "\n".join(ln for ln in log.splitlines() if "arning" in ln or bad in ln)[:4000]
        )
    (wheel,) = tmp_path.glob("kvsplit-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for folder, pkg in FOLDERS.items():
        src = ROOT / folder
        files = [p for p in src.rglob("*.py")] + [p for pat in DATA for p in src.rglob(pat)]
        for p in files:
            if "__pycache__" in p.parts:
                continue
            expected.add(f"{pkg}/{p.relative_to(src).as_posix()}")
    missing = sorted(expected - names)
    assert not missing, f"not in the wheel: {missing}"
    assert not any(n.startswith(("kernels/", "db/", "service/", "tuner/")) for n in names)  # no top-level modules
    # the license pyproject declares travels with the wheel, word for word
    (lic,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert zipfile.ZipFile(wheel).read(lic).decode() == (ROOT / "LICENSE").read_text()
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
