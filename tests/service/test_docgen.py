"""The generated reference pages (docs/reference/*.md) match the code, byte for byte.

When a test here fails, regenerate the pages with ``python -m kvsplit.service.docgen`` (``make docs``) and commit
them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("typer")
pytest.importorskip("triton")  # python-api.md documents DecodeWrapper and the kernel (torch + Triton)

from kvsplit.service import docgen  # noqa: E402

REF = Path(__file__).resolve().parents[2] / "docs" / "reference"
FIX = f"regenerate them with `{docgen.COMMAND}` (make docs) and commit docs/reference/"


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return docgen.render_all()


def test_committed_pages_are_current(pages, tmp_path):
    written = docgen.write_pages(tmp_path, pages)
    assert sorted(p.name for p in written) == sorted(docgen.PAGES)
    stale = [p.name for p in written if not (REF / p.name).is_file() or (REF / p.name).read_bytes() != p.read_bytes()]
    assert not stale, f"stale reference pages in docs/reference/: {', '.join(stale)}; {FIX}"


def test_check_mode_names_a_stale_page(pages, tmp_path, capsys):
    docgen.write_pages(tmp_path, pages)
    assert docgen.main(["--check", "--out", str(tmp_path)]) == 0
    knobs = tmp_path / "knobs.md"
    knobs.write_text(
        knobs.read_text().replace("| `ctas_per_sm` | float | [0.25, 64.0]", "| `ctas_per_sm` | float | [1, 64]")
    )
    (tmp_path / "cli.md").unlink()
    capsys.readouterr()
    assert docgen.main(["--check", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "knobs.md, cli.md" in out and docgen.COMMAND in out
    assert docgen.stale_pages(tmp_path, pages) == ["knobs.md", "cli.md"]
    assert not (tmp_path / "cli.md").exists()  # --check writes nothing


def test_pages_ignore_the_environment(pages, tmp_path, monkeypatch):
    """Settings from the environment or ./.env and the terminal's width do not reach the pages."""
    (tmp_path / ".env").write_text("KVSPLIT_MAX_KV_LEN=7\nKVSPLIT_MAX_BODY_BYTES=4096\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVSPLIT_MAX_KV_LEN", "1024")
    monkeypatch.setenv("KVSPLIT_DATABASE_URL", str(tmp_path / "elsewhere.db"))
    monkeypatch.setenv("COLUMNS", "40")
    monkeypatch.setenv("TERMINAL_WIDTH", "40")
    assert docgen.http_page() == pages["http.md"]
    assert docgen.cli_page() == pages["cli.md"]
    text = "".join(pages.values())
    assert str(tmp_path) not in text and "/tmp" not in text
    assert not re.search(r"0x[0-9a-f]{6,}", text)  # no object addresses from reprs


def test_pages_cover_the_code(pages):
    """Every tuned parameter, command, route and listed public name has its entry."""
    import typer

    from kvsplit.kernels.rulespec import TUNED_PARAM_SPACE
    from kvsplit.service.cli import app

    rows = re.findall(r"^\| `(\w+)` \| (?:float|int|categorical) \|", pages["knobs.md"], re.M)
    assert rows == list(TUNED_PARAM_SPACE)

    def paths(cmd, prefix):
        out = [prefix]
        for name, sub in getattr(cmd, "commands", {}).items():
            out += paths(sub, f"{prefix} {name}")
        return out

    commands = paths(typer.main.get_command(app), "kvsplit")
    assert "kvsplit db import" in commands and "kvsplit tune" in commands
    assert re.findall(r"^## (kvsplit.*)$", pages["cli.md"], re.M) == commands
    tune = pages["cli.md"].split("## kvsplit tune\n")[1].split("\n## ")[0]
    for opt in ("--trials N", "--campaign", "--budget-minutes MIN", "--publish / --no-publish", "--database-url URL"):
        assert opt in tune

    ops = [f"{m.upper()} {p}" for p, item in docgen.openapi_document()["paths"].items() for m in item]
    assert "POST /v1/plan" in ops and "GET /v1/policies" in ops
    assert re.findall(r"^### ((?:GET|POST|PUT|PATCH|DELETE) \S+)$", pages["http.md"], re.M) == ops

    listed = [f"{module}.{name}" for _, module, names in docgen.API for name in names]
    assert re.findall(r"^### `([\w.]+)`$", pages["python-api.md"], re.M) == listed
    assert "kvsplit.kernels.make_plan" in listed and "kvsplit.service.client.PlanClient" in listed


def test_readme_indexes_every_page():
    readme = (REF / "README.md").read_text()
    for name in docgen.PAGES:
        assert f"({name})" in readme, name
    assert docgen.COMMAND in readme and "make docs" in readme
