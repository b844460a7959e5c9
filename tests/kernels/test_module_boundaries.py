"""kernels/ imports at module level (parsed, nothing imported).

- No function-level ``from .`` import in kernels/ (they hid an import circle; kernels/ has none).

That no module of the package uses a name private to another (``from .x import _y``, ``x._y``) is checked for
kernels/, tuner/, db/ and service/ alike by ``tests/test_tree_hygiene.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _files(*dirs: str):
    for d in dirs:
        yield from sorted((ROOT / d).rglob("*.py"))


def test_no_function_level_relative_import_in_kernels():
    bad = []
    for path in _files("kernels"):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, ast.ImportFrom) and node.level > 0:
                        bad.append(
                            f"{path.relative_to(ROOT)}:{node.lineno}: from {'.' * node.level}{node.module or ''}"
                        )
    assert not bad, "\n".join(bad)
