"""kernels/ keeps its modules' private names private and imports at module level (parsed, nothing imported).

- No module of kernels/, tuner/ or service/ imports a private name (``_x``) of a kernels module, or reads one as
  ``module._x`` off a kernels module it imported.
- No function-level ``from .`` import in kernels/ (they hid an import circle; kernels/ has none).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KERNEL_MODULES = {p.stem for p in (ROOT / "kernels").glob("*.py")} - {"__init__"}


def _files(*dirs: str):
    for d in dirs:
        yield from sorted((ROOT / d).rglob("*.py"))


def _from_kernels(path: Path, mod: str | None, level: int) -> bool:
    """Whether ``from <level dots><mod> import ...`` in ``path`` imports from kvsplit.kernels."""
    mod = mod or ""
    if level == 0:
        return mod == "kvsplit.kernels" or mod.startswith("kvsplit.kernels.")
    pkg = list(path.relative_to(ROOT).parent.parts)  # kernels, tuner, service, kernels/integrations ...
    pkg = pkg[: len(pkg) - (level - 1)] + [m for m in mod.split(".") if m]
    return bool(pkg) and pkg[0] == "kernels"


def test_no_private_name_crosses_a_module():
    bad = []
    for path in _files("kernels", "tuner", "service"):
        tree = ast.parse(path.read_text())
        aliases = {}  # local name -> kernels module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and _from_kernels(path, node.module, node.level):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: imports {a.name} from {node.module}")
                    if a.name in KERNEL_MODULES:
                        aliases[a.asname or a.name] = a.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not bad, "\n".join(bad)


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
