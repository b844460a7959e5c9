"""The tree stays a product, not a lab notebook (fast, no GPU).

- No history citations ("round 7", "round2", "r18_call3", "perf.md") in README.md, docs/ outside docs/decisions/ (the decision
  records carry the history), kernels/, tuner/, db/, service/ or tests/: code and docs state the fact or cite a
  record in docs/decisions/.
- Every relative link of README.md and docs/**/*.md reaches a file of the tree, and its ``#anchor`` a heading of
  that file.
- Every file of the tree a doc, docstring or comment names (``bench/peers.py``, ``tests/data/x.jsonl``) exists.
- Nothing reaches into another folder through ``sys.path.insert``.
- bench/ and scripts/ hold at most 25 tracked files.
- No module of kernels/, tuner/, db/ or service/ uses a name private to another module (``from .x import _y``,
  ``x._y``): a name shared between modules is public in the module that defines it.
- Every public name a module of kvsplit.kernels / tuner / db / service exports (its ``__all__``), and every
  public method and property of an exported class, has a docstring.

Each check is a function of the file texts it is given, so the tests below also run it on a planted violation.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# the phrases are split so that this file does not match its own patterns; ``--repeats 3`` is an option
HISTORY = re.compile(r"(?<![-a-z])round" + r"s?[ _]?\d|\br\d+_" + r"call|perf" + r"\.md", re.IGNORECASE)
HISTORY_SCOPE = ("README.md", "docs", "kernels", "tuner", "db", "service", "tests")
HISTORY_EXEMPT = ("docs/decisions/",)
SYS_PATH = "sys.path" + ".insert"
TEXT_SUFFIXES = {".py", ".md", ".txt", ".toml", ".cfg", ".ini", ".yaml", ".yml", ".json", ".jsonl", ".html", ".css"}
TEXT_SUFFIXES |= {".js", ".sh", ".lua", ".csv", ".mako", ".sql", ".j2"}
MAX_BENCH_FILES = 25


def _tracked() -> list[str] | None:
    """Tracked files (repository-relative, POSIX), or None outside a git checkout."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return None
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def _files() -> list[str]:
    """Tracked files; outside a git checkout, every file under the root but the virtual environment and caches."""
    tracked = _tracked()
    if tracked is not None:
        return [p for p in tracked if (ROOT / p).is_file()]
    skip = {".venv", ".git", "__pycache__", ".pytest_cache", ".ruff_cache", "node_modules"}
    return sorted(
        p.relative_to(ROOT).as_posix()
        for p in ROOT.rglob("*")
        if p.is_file() and not skip & set(p.relative_to(ROOT).parts)
    )


def _texts(paths: list[str]) -> dict[str, str]:
    out = {}
    for p in paths:
        if Path(p).suffix.lower() not in TEXT_SUFFIXES and Path(p).name not in ("Makefile", "LICENSE"):
            continue
        try:
            out[p] = (ROOT / p).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
    return out


SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()


# ----------------------------------------------------------------------------- the checks


def history_citations(texts: dict[str, str]) -> list[str]:
    """``path:line: text`` of each history citation in the scoped files."""
    hits = []
    for path, text in texts.items():
        in_scope = any(path == s or path.startswith(s + "/") for s in HISTORY_SCOPE)
        if not in_scope or path.startswith(HISTORY_EXEMPT) or path == SELF:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if HISTORY.search(line):
                hits.append(f"{path}:{n}: {line.strip()[:160]}")
    return hits


_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a page (a repeated heading gets ``-1``, ``-2``, ...)."""
    from kvsplit.service.docgen import _anchor

    seen: dict[str, int] = {}
    out = set()
    for title in _HEADING.findall(_FENCE.sub("", markdown)):
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).replace("`", "")  # link text and code keep their text
        slug = _anchor(title)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    out |= set(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", markdown))
    return out


def broken_links(texts: dict[str, str], exists=lambda rel: (ROOT / rel).exists()) -> list[str]:
    """``page: target (why)`` of each relative link of README.md and docs/**/*.md that reaches no file of the tree,
    or whose ``#anchor`` is no heading of the page it names."""
    bad = []
    pages = {p: t for p, t in texts.items() if p == "README.md" or (p.startswith("docs/") and p.endswith(".md"))}
    for page, text in pages.items():
        body = _CODE_SPAN.sub("", _FENCE.sub("", text))
        for target in _INLINE_LINK.findall(body) + _REF_DEF.findall(body):
            if _SCHEME.match(target) or target.startswith("//"):
                continue  # http(s), mailto: not the tree's
            path, _, anchor = target.partition("#")
            if path.startswith("/"):
                bad.append(f"{page}: {target} (absolute path: write it relative to the page)")
                continue
            if path:
                rel = Path(page).parent.joinpath(path).as_posix()
                parts = []
                for part in rel.split("/"):
                    if part == "..":
                        if not parts:
                            break
                        parts.pop()
                    elif part not in ("", "."):
                        parts.append(part)
                else:
                    rel = "/".join(parts)
                    if not exists(rel):
                        bad.append(f"{page}: {target} (no file {rel})")
                        continue
                    if anchor and rel.endswith(".md"):
                        other = texts.get(rel)
                        if other is None:
                            other = (ROOT / rel).read_text(encoding="utf-8")
                        if anchor not in _anchors(other):
                            bad.append(f"{page}: {target} (no heading #{anchor} in {rel})")
                    continue
                bad.append(f"{page}: {target} (leaves the repository)")
            elif anchor and anchor not in _anchors(text):
                bad.append(f"{page}: {target} (no heading #{anchor} in this page)")
    return bad


_TREE_PATH = re.compile(
    r"(?<![\w/.-])((?:bench|scripts|docs|tests|kernels|tuner|service|db)/[\w./-]*\w"
    r"\.(?:py|md|json|jsonl|sh|log|csv|png|lua|toml|html|css|js))(?![\w-]|\.\w)"
)
NAMED_SCOPE = (".md", ".py", ".toml", ".html", ".sh", ".yaml", ".yml")
NAMED_EXEMPT = ("docs/decisions/", "CHANGELOG.md")  # history: they name what was there then


def missing_named_files(texts: dict[str, str], exists=lambda rel: (ROOT / rel).exists()) -> list[str]:
    """``path: named`` for each file of the tree a doc or source names (from the root, or from the naming file's
    folder) that does not exist."""
    bad = []
    for path, text in texts.items():
        if not path.endswith(NAMED_SCOPE) or path.startswith(NAMED_EXEMPT) or path == SELF:
            continue
        for named in sorted(set(_TREE_PATH.findall(text))):
            if not exists(named) and not exists((Path(path).parent / named).as_posix()):
                bad.append(f"{path}: {named}")
    return bad


def sys_path_inserts(texts: dict[str, str]) -> list[str]:
    """``path:line`` of each ``sys.path.insert`` in the tree (this file's own pattern aside)."""
    return [
        f"{path}:{n}"
        for path, text in texts.items()
        if path != SELF
        for n, line in enumerate(text.splitlines(), 1)
        if SYS_PATH in line
    ]


PACKAGE_DIRS = ("kernels/", "tuner/", "db/", "service/")


def private_names_across_modules(texts: dict[str, str]) -> list[str]:
    """``path:line name`` of each use, in a module of the package, of a name private to another of its modules:
    ``from .x import _y`` (or ``from kvsplit... import _y``), and ``x._y`` where ``x`` was imported from the
    package (dunder names aside)."""
    bad = []
    for path, text in texts.items():
        if not (path.startswith(PACKAGE_DIRS) and path.endswith(".py")):
            continue
        tree = ast.parse(text)
        modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("kvsplit")):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        bad.append(f"{path}:{node.lineno} {alias.name}")
                    else:
                        modules.add(alias.asname or alias.name)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                bad.append(f"{path}:{node.lineno} {node.value.id}.{node.attr}")
    return bad


# ----------------------------------------------------------------------------- the tree as it is


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    return _texts(_files())


def test_no_history_citations(texts):
    hits = history_citations(texts)
    assert not hits, "state the fact or cite a record in docs/decisions/ instead of:\n" + "\n".join(hits)


def test_relative_markdown_links_resolve(texts):
    bad = broken_links(texts)
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_files_named_in_docs_and_code_exist(texts):
    bad = missing_named_files(texts)
    assert not bad, "name a file that is in the tree, or state the fact instead:\n" + "\n".join(bad)


def test_no_sys_path_insert(texts):
    hits = sys_path_inserts(texts)
    assert not hits, "import through the package (kvsplit.*, tests.*, bench.*) instead: " + ", ".join(hits)


def test_no_private_name_used_across_modules(texts):
    hits = private_names_across_modules(texts)
    assert not hits, "make the name public in the module that defines it:\n" + "\n".join(hits)


def test_bench_and_scripts_stay_small():
    tracked = _tracked()
    if tracked is None:
        pytest.skip("not a git checkout")
    files = [p for p in tracked if p.startswith(("bench/", "scripts/"))]
    assert len(files) <= MAX_BENCH_FILES, f"{len(files)} tracked files in bench/ and scripts/: {files}"


# ----------------------------------------------------------------------------- planted violations


def test_each_check_fails_on_a_planted_violation(texts):
    planted = dict(texts)
    planted["kernels/planted.py"] = "x = 1  # the default since round" + " 7\n"
    planted["tests/test_planted.py"] = "def test_round" + "2_policies(): ...\n"
    planted["tests/planted_test.py"] = '"""see docs/' + 'perf.md"""\n'
    planted["docs/guides/planted.md"] = "# Planted\n\nSee [a record](../decisions/nope.md), [here](#planted), "
    planted["docs/guides/planted.md"] += "[design](../concepts/design.md#no-such-heading) and [ok](../index.md).\n"
    planted["bench/planted.py"] = "import sys\n" + SYS_PATH + "(0, 'scripts')\n"
    hist = history_citations(planted)
    assert [h.split(":")[0] for h in hist] == [
        "kernels/planted.py",
        "tests/test_planted.py",
        "tests/planted_test.py",
    ], hist
    # the same citations in a decision record are history where it belongs
    assert not history_citations({"docs/decisions/x.md": planted["kernels/planted.py"]})
    links = broken_links({"docs/guides/planted.md": planted["docs/guides/planted.md"]})
    assert links == [
        "docs/guides/planted.md: ../decisions/nope.md (no file docs/decisions/nope.md)",
        "docs/guides/planted.md: ../concepts/design.md#no-such-heading (no heading #no-such-heading in "
        "docs/concepts/design.md)",
    ], links
    assert broken_links({"README.md": "[x](docs/index.md#nope) [y](../outside.md) [z](/docs/index.md)\n"}) == [
        "README.md: docs/index.md#nope (no heading #nope in docs/index.md)",
        "README.md: ../outside.md (leaves the repository)",
        "README.md: /docs/index.md (absolute path: write it relative to the page)",
    ]
    # links inside code are code, not links
    assert not broken_links({"README.md": "`[x](nope.md)`\n\n```md\n[y](nope.md)\n```\n"})
    assert sys_path_inserts(planted) == ["bench/planted.py:2"]
    private = {
        "tuner/planted.py": "from .study import _load_study, open_storage\nfrom . import search\nsearch._start()\n",
        "tests/planted_test.py": "from kvsplit.tuner.study import _load_study\n",  # tests may reach in
        "kernels/planted_ok.py": "from . import fastplan as _fastplan\n_fastplan.key_plan(x.__len__)\n",
    }
    assert private_names_across_modules(private) == [
        "tuner/planted.py:1 _load_study",
        "tuner/planted.py:3 search._start",
    ]
    named = {"kernels/planted.py": "# timed by bench/kernel_a.py, as bench/peers.py does; tests/data/x.jsonl.gz\n"}
    assert missing_named_files(named) == ["kernels/planted.py: bench/kernel_a.py"]
    assert not missing_named_files({"docs/decisions/x.md": named["kernels/planted.py"]})


# ----------------------------------------------------------------------------- public docstrings

SUBPACKAGES = ("kvsplit.kernels", "kvsplit.tuner", "kvsplit.db", "kvsplit.service")


def _own_doc(obj) -> str:
    """A class's own docstring (not a base class's, not the signature dataclasses and NamedTuple write)."""
    doc = vars(obj).get("__doc__") or ""
    return "" if doc.startswith(obj.__name__ + "(") else doc.strip()


def _member_doc(cls: type, name: str, member) -> str:
    """A method's or property's docstring, or the one of the member it overrides in a base class."""

    def doc_of(m) -> str:
        f = m.fget if isinstance(m, property) else getattr(m, "__func__", m)
        return (getattr(f, "__doc__", None) or "").strip()

    for c in cls.__mro__:
        m = member if c is cls else vars(c).get(name)
        if m is not None and doc_of(m):
            return doc_of(m)
    return ""


def undocumented(modules) -> list[str]:
    """Dotted names of the exported (``__all__``) classes and functions of ``modules``, and of the public methods and
    properties of those classes, that have no docstring. A name exported by several modules counts once."""
    from kvsplit.service.docgen import _members  # the public members the reference pages list

    missing, seen = [], set()
    for mod in modules:
        for name in getattr(mod, "__all__", ()):
            obj = getattr(mod, name)
            if id(obj) in seen:
                continue
            where = f"{mod.__name__}.{name}"
            if inspect.isclass(obj):
                seen.add(id(obj))
                if not _own_doc(obj):
                    missing.append(where)
                missing += [f"{where}.{m}" for m, member in _members(obj) if not _member_doc(obj, m, member)]
            elif inspect.isfunction(obj) or inspect.isbuiltin(obj) or hasattr(obj, "__wrapped__"):
                seen.add(id(obj))
                if not (getattr(obj, "__doc__", None) or "").strip():
                    missing.append(where)
    return missing


def _modules():
    mods = []
    for pkg_name in SUBPACKAGES:
        pkg = importlib.import_module(pkg_name)
        mods.append(pkg)
        for info in pkgutil.walk_packages(pkg.__path__, pkg_name + "."):
            if info.name.rsplit(".", 1)[-1] == "__main__":
                continue  # running it is its only effect
            mods.append(importlib.import_module(info.name))
    return mods


_PENDING: set[str] = set()  # names allowed to lack a docstring for now: none


def test_public_names_have_docstrings():
    for dep in ("fastapi", "typer", "triton", "optuna", "sqlalchemy"):
        pytest.importorskip(dep)
    missing = [n for n in undocumented(_modules()) if n not in _PENDING]
    assert not missing, "public names without a docstring (shapes, dtypes, units, errors raised):\n" + "\n".join(
        missing
    )


def test_docstring_check_finds_a_missing_docstring():
    import types

    mod = types.ModuleType("planted")

    class Documented:
        """Has one."""

        @property
        def size(self) -> int:
            """Bytes."""
            return 0

        def run(self) -> None:
            """Runs."""

    class Bare:
        @property
        def size(self) -> int:
            return 0

        def run(self) -> None:
            pass

        def _private(self) -> None:
            pass

    class Child(Documented):
        """Overrides keep the base's docstring."""

        def run(self) -> None:
            pass

    def documented():
        """Has one."""

    def bare():
        pass

    mod.Documented, mod.Bare, mod.Child, mod.documented, mod.bare = Documented, Bare, Child, documented, bare
    mod.__all__ = ["Documented", "Bare", "Child", "documented", "bare"]
    assert undocumented([mod]) == ["planted.Bare", "planted.Bare.size", "planted.Bare.run", "planted.bare"]
