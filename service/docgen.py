"""The reference pages of docs/reference/, generated from the code.

``python -m kvsplit.service.docgen`` (``make docs``) writes four pages:

* ``python-api.md``: the public names of :mod:`kvsplit.kernels`, :mod:`kvsplit.service.client` and
  :mod:`kvsplit.tuner.simulate` (:data:`API`), each with its :func:`inspect.signature` and docstring;
* ``knobs.md``: :data:`kvsplit.kernels.rulespec.TUNED_PARAM_SPACE` (every parameter of the ``tuned`` policy with
  its range or choices, default, condition and meaning), the parameters of each named policy (``POLICIES``) and
  the default kernel tiles (:func:`kvsplit.kernels.limits.default_config`);
* ``cli.md``: the help of every ``kvsplit`` command, walked from the typer application
  (``typer.main.get_command``) and rendered by click's plain formatter at :data:`WIDTH` columns (no rich panels);
* ``http.md``: the plan service's OpenAPI document (:func:`kvsplit.service.app.create_app` with the default
  settings): each route with its parameters, request body and responses, then every schema.

The output depends on the code only: no dates, paths, environment (``KVSPLIT_*`` variables and ``.env`` are not
read, the terminal width is fixed) or dict-order accidents, so ``--check`` compares it byte for byte with the
committed pages and exits 1 naming the stale ones (``tests/service/test_docgen.py`` does the same).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["API", "PAGES", "WIDTH", "COMMAND", "render_all", "write_pages", "stale_pages", "main"]

WIDTH = 100
"""Columns of the rendered ``--help`` texts (cli.md)."""

COMMAND = "python -m kvsplit.service.docgen"
"""The command that regenerates the pages (``make docs`` runs it)."""

DEFAULT_OUT = Path("docs/reference")

_HEADER = f"<!-- Generated from the code by `{COMMAND}` (make docs); do not edit. -->\n\n"

API: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "Engine integration",
        "kvsplit.kernels",
        ("DecodeWrapper", "PolicyTable", "load_shipped_table", "make_plan", "Plan"),
    ),
    ("CUDA-graph options", "kvsplit.kernels.wrapper", ("GraphOptions",)),
    ("The kernel and its reference", "kvsplit.kernels.decode", ("decode_attention", "reference_decode_attention")),
    ("Buckets", "kvsplit.kernels.buckets", ("bucket_key", "BucketKey", "distance")),
    ("Split rules", "kvsplit.kernels.rulespec", ("RuleSpec", "resolve")),
    ("Shapes, devices and kernel tiles", "kvsplit.kernels", ("Shape", "DeviceSpec", "KernelConfig", "default_config")),
    ("Plan service client", "kvsplit.service.client", ("PlanClient", "plan_from_response", "PlanServiceError")),
    ("Simulator", "kvsplit.tuner.simulate", ("predict", "hbm_floor_s", "Calibration")),
)
"""Sections of python-api.md: (title, the module the names are imported from, the names)."""


# --------------------------------------------------------------------------- helpers


def _md_cell(text: Any) -> str:
    """``text`` on one line, safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(head: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    head = list(head)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, spaces to dashes, punctuation other than ``-``/``_`` dropped."""
    return "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def _fence(text: str, lang: str = "text") -> str:
    body = "\n".join(line.rstrip() for line in text.strip("\n").splitlines())
    return f"```{lang}\n{body}\n```\n"


def _page(*parts: str) -> str:
    text = _HEADER + "\n".join(p.rstrip("\n") + "\n" for p in parts if p)
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


# --------------------------------------------------------------------------- python-api.md


class _Raw:
    """An annotation shown as written (``from __future__ import annotations`` keeps them as strings)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _raw_annotation(a: Any) -> Any:
    if a is inspect.Parameter.empty:
        return a
    return _Raw(a if isinstance(a, str) else inspect.formatannotation(a))


def _signature(name: str, obj: Callable[..., Any], drop_first: bool = False) -> str:
    """``name(params) -> ret`` (no ``-> ret`` for a class), one parameter per line when longer than the page."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return f"{name}(...)"
    params = list(sig.parameters.values())
    if drop_first and params:
        params = params[1:]
    params = [p.replace(annotation=_raw_annotation(p.annotation)) for p in params]
    ret_ann = inspect.Signature.empty if inspect.isclass(obj) else _raw_annotation(sig.return_annotation)
    sig = sig.replace(parameters=params, return_annotation=ret_ann)
    one = f"{name}{sig}"
    if len(one) <= WIDTH:
        return one
    # the same text as str(sig), one parameter per line
    parts, seen_kwonly, last_posonly = [], False, None
    for i, p in enumerate(params):
        if p.kind is p.POSITIONAL_ONLY:
            last_posonly = i
    for i, p in enumerate(params):
        if p.kind is p.KEYWORD_ONLY and not seen_kwonly and not any(q.kind is q.VAR_POSITIONAL for q in params):
            parts.append("*")
        seen_kwonly = seen_kwonly or p.kind is p.KEYWORD_ONLY
        parts.append(str(p))
        if i == last_posonly:
            parts.append("/")
    ret = "" if sig.return_annotation is inspect.Signature.empty else f" -> {sig.return_annotation!r}"
    return name + "(\n" + "".join(f"    {p},\n" for p in parts) + ")" + ret


def _doc(obj: Any) -> str:
    doc = inspect.getdoc(obj)
    return _fence(doc) if doc else "(no docstring)\n"


def _members(cls: type) -> list[tuple[str, Any]]:
    """The public methods and properties ``cls`` itself defines, in definition order."""
    out = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, (property, classmethod, staticmethod)) or inspect.isfunction(value):
            out.append((name, value))
    return out


def _api_entry(module: str, name: str) -> str:
    obj = getattr(importlib.import_module(module), name)
    where = getattr(obj, "__module__", module)
    kind = "class" if inspect.isclass(obj) else "function"
    parts = [f"### `{module}.{name}`\n", f"{kind}, defined in `{where}`\n"]
    if inspect.isclass(obj):
        parts.append(_fence(_signature(name, obj), "python"))
        parts.append(_doc(obj))
        for mname, member in _members(obj):
            if isinstance(member, property):
                parts.append(f"#### `{name}.{mname}` (property)\n")
                parts.append(_doc(member))
                continue
            func = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
            label = " (classmethod)" if isinstance(member, classmethod) else ""
            label = " (staticmethod)" if isinstance(member, staticmethod) else label
            parts.append(f"#### `{name}.{mname}`{label}\n")
            parts.append(_fence(_signature(mname, func, drop_first=not isinstance(member, staticmethod)), "python"))
            parts.append(_doc(func))
    else:
        parts.append(_fence(_signature(name, obj), "python"))
        parts.append(_doc(obj))
    return "\n".join(parts)


def python_api_page() -> str:
    index = []
    for title, _module, names in API:
        index.append(f"- [{title}](#{_anchor(title)}): " + ", ".join(f"`{n}`" for n in names))
    intro = (
        "# Python API\n\n"
        "The public names of the package, with their signatures and docstrings. An engine needs one import "
        "line:\n\n"
        "```python\nfrom kvsplit.kernels import DecodeWrapper, PolicyTable, load_shipped_table, make_plan, Plan\n```\n\n"
        "The planner's names need only NumPy; `DecodeWrapper`, `decode_attention` and "
        "`reference_decode_attention` need torch and Triton. The parameters of the policies are in "
        "[knobs.md](knobs.md).\n\n" + "\n".join(index) + "\n"
    )
    sections = []
    for title, module, names in API:
        sections.append(f"## {title}\n")
        sections.extend(_api_entry(module, n) for n in names)
    return _page(intro, *sections)


# --------------------------------------------------------------------------- knobs.md


def _value(v: Any) -> str:
    return "`" + json.dumps(v) + "`"


def _range(spec: dict[str, Any]) -> str:
    if spec["kind"] == "categorical":
        return ", ".join(_value(c) for c in spec["choices"])
    text = f"[{spec['low']}, {spec['high']}]"
    return text + (" log scale" if spec.get("log") else "")


def _condition(cond: dict[str, Any] | None) -> str:
    if not cond:
        return "always"
    terms = []
    for k, want in cond.items():
        if isinstance(want, (list, tuple)):
            terms.append(f"`{k}` in " + ", ".join(_value(w) for w in want))
        else:
            terms.append(f"`{k}` = {_value(want)}")
    return " and ".join(terms)


def knobs_page() -> str:
    from ..kernels.limits import DTYPES, default_config
    from ..kernels.rulespec import KNOB_PARAMS, POLICIES, TUNED_PARAM_SPACE

    rows = []
    for name, spec in TUNED_PARAM_SPACE.items():
        default = spec["default"]
        rows.append(
            (
                f"`{name}`",
                spec["kind"],
                _range(spec),
                "unset" if default is None else _value(default),
                "yes" if spec["search"] else "no",
                _condition(spec.get("condition")),
                spec["doc"],
            )
        )
    space = (
        "# Knobs\n\n"
        "## The `tuned` policy's parameters\n\n"
        "From `kvsplit.kernels.rulespec.TUNED_PARAM_SPACE`, the one definition the planner (`resolve`, which "
        "rejects a value outside these ranges with a `ValueError` naming `params.<name>`) and the tuner (its "
        "Optuna search space) both read. *searched*: whether the tuner searches the parameter (the others are "
        "set per bucket or left at their default). *applies when*: the parameter only has an effect when the "
        "named parameters have these values. *unset*: derived as the meaning says (the "
        "kernel tile's knobs from `default_config(head_dim, dtype)`, below). With every default, `tuned` plans as `balanced`.\n\n"
        + _table(("parameter", "kind", "range or choices", "default", "searched", "applies when", "meaning"), rows)
    )
    own = [(f"`{p}`", ", ".join(f"`{n}`" for n in ps if n not in KNOB_PARAMS) or "none") for p, ps in POLICIES.items()]
    policies = (
        "## Parameters of each policy\n\n"
        "From `kvsplit.kernels.rulespec.POLICIES`. Every policy also accepts the kernel knobs and launch options "
        + ", ".join(f"`{n}`" for n in KNOB_PARAMS)
        + " (`KNOB_PARAMS`); any other name is a `ValueError`.\n\n"
        + _table(("policy", "its own parameters"), own)
    )
    tiles = []
    for dtype in sorted(DTYPES):
        for head_dim in (64, 128, 256):
            c = default_config(head_dim, dtype)
            tiles.append((dtype, head_dim, c.block_n, c.num_warps, c.num_stages))
    defaults = (
        "## Default kernel tiles\n\n"
        "`kvsplit.kernels.default_config(head_dim, dtype)`: the tile a policy runs when it leaves `block_n`, "
        "`num_warps` and `num_stages` unset.\n\n"
        + _table(("dtype", "head_dim", "block_n", "num_warps", "num_stages"), tiles)
    )
    return _page(space, policies, defaults)


# --------------------------------------------------------------------------- cli.md


def _cli_sections(cmd: Any, name: str, parent: Any) -> list[tuple[str, str, str]]:
    """(command path, short help, plain help text) of ``cmd`` and every command under it, in typer's order."""
    cmd.rich_markup_mode = None  # click's plain formatter instead of rich's panels (a fresh command tree)
    ctx = cmd.context_class(cmd, parent=parent, info_name=name, terminal_width=WIDTH, max_content_width=WIDTH)
    out = [(ctx.command_path, cmd.get_short_help_str(limit=WIDTH), cmd.get_help(ctx))]
    for sub_name, sub in getattr(cmd, "commands", {}).items():
        if not sub.hidden:
            out += _cli_sections(sub, sub_name, ctx)
    return out


def cli_page() -> str:
    import typer

    from .cli import app

    sections = _cli_sections(typer.main.get_command(app), "kvsplit", None)
    intro = (
        "# Command line\n\n"
        "Every `kvsplit` command with its `--help`. Every command also reads the store's settings "
        "(`KVSPLIT_DATABASE_URL` and the other `KVSPLIT_*` variables, or `./.env`): see "
        "[serving](../guides/serving.md).\n\n"
        + _table(("command", "what it does"), [(f"[`{p}`](#{_anchor(p)})", short) for p, short, _ in sections])
    )
    return _page(intro, *(f"## {path}\n\n" + _fence(text) for path, _, text in sections))


# --------------------------------------------------------------------------- http.md


def _schema_link(ref: str) -> str:
    name = ref.rsplit("/", 1)[-1]
    return f"[{name}](#{_anchor(name)})"


def _jtype(s: dict[str, Any]) -> str:
    """A JSON schema in a few words: ``integer (>= 1 and <= 1024)``, ``array of string``, ``[Name](#name) or null``."""
    if "$ref" in s:
        return _schema_link(s["$ref"])
    for key in ("anyOf", "oneOf"):
        if key in s:
            text = " or ".join(_jtype(x) for x in s[key])
            if "enum" in s:  # FastAPI puts a Literal's values beside its anyOf
                text += ", one of " + ", ".join(_value(v) for v in s["enum"])
            return text
    if "allOf" in s:
        return " and ".join(_jtype(x) for x in s["allOf"])
    if "const" in s:
        return _value(s["const"])
    if "enum" in s:
        return "one of " + ", ".join(_value(v) for v in s["enum"])
    t = s.get("type", "any")
    if isinstance(t, list):
        t = " or ".join(t)
    if t == "array":
        item = _jtype(s.get("items", {}))
        text = "array of " + (f"({item})" if " or " in item else item)
    elif t == "object" and isinstance(s.get("additionalProperties"), dict):
        text = "object of " + _jtype(s["additionalProperties"])
    else:
        text = t
    bounds = []
    lo = s.get("minimum", s.get("exclusiveMinimum"))
    hi = s.get("maximum", s.get("exclusiveMaximum"))
    if lo is not None or hi is not None:
        lo_op = ">" if "exclusiveMinimum" in s else ">="
        hi_op = "<" if "exclusiveMaximum" in s else "<="
        bounds.append(
            " and ".join(x for x in (lo is not None and f"{lo_op} {lo}", hi is not None and f"{hi_op} {hi}") if x)
        )
    for key, word in (
        ("minLength", "length >="),
        ("maxLength", "length <="),
        ("minItems", "items >="),
        ("maxItems", "items <="),
    ):
        if key in s:
            bounds.append(f"{word} {s[key]}")
    return text + (" (" + ", ".join(bounds) + ")" if bounds else "")


def _content_schema(obj: dict[str, Any]) -> str:
    content = obj.get("content") or {}
    if not content:
        return "no body"
    return "; ".join(f"`{ctype}`: " + (_jtype(c["schema"]) if "schema" in c else "any") for ctype, c in content.items())


def _operation(path: str, method: str, op: dict[str, Any]) -> str:
    parts = [f"### {method.upper()} {path}\n", f"{op.get('summary', '')} (operation `{op.get('operationId', '')}`)\n"]
    if op.get("description"):
        parts.append(op["description"].strip() + "\n")
    params = op.get("parameters") or []
    if params:
        rows = [
            (
                f"`{p['name']}`",
                p["in"],
                _jtype(p.get("schema", {})),
                "yes" if p.get("required") else "no",
                p.get("description") or p.get("schema", {}).get("description", ""),
            )
            for p in params
        ]
        parts.append("Parameters:\n\n" + _table(("name", "in", "type", "required", "description"), rows))
    body = op.get("requestBody")
    if body:
        req = "required" if body.get("required") else "optional"
        parts.append(f"Request body ({req}): {_content_schema(body)}\n")
    rows = [(f"`{code}`", r.get("description", ""), _content_schema(r)) for code, r in sorted(op["responses"].items())]
    parts.append("Responses:\n\n" + _table(("status", "meaning", "body"), rows))
    return "\n".join(parts)


def _schema(name: str, s: dict[str, Any]) -> str:
    parts = [f"### {name}\n"]
    if s.get("description"):
        parts.append(_md_cell(s["description"]) + "\n")
    props = s.get("properties") or {}
    required = set(s.get("required") or ())
    if props:
        rows = [
            (f"`{p}`", _jtype(ps), "yes" if p in required else "no", ps.get("description", ""))
            for p, ps in props.items()
        ]
        parts.append(_table(("field", "type", "required", "description"), rows))
    elif "properties" not in s:
        parts.append(f"Type: {_jtype(s)}\n")
    return "\n".join(parts)


def openapi_document() -> dict[str, Any]:
    """The service's OpenAPI document under the default settings (no ``KVSPLIT_*`` variable or ``.env`` read).

    The app is built against a SQLite file in a temporary folder, which it never opens (routes only)."""
    from .app import create_app
    from .settings import Settings

    defaults = {k: f.default for k, f in Settings.model_fields.items()}
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(_env_file=None, **{**defaults, "database_url": f"sqlite:///{tmp}/store.db"})
        return create_app(settings).openapi()


def http_page() -> str:
    doc = openapi_document()
    info = doc["info"]
    ops = [(path, method, op) for path, item in doc["paths"].items() for method, op in item.items()]
    intro = (
        "# HTTP API\n\n"
        f"{info['title']} (API version {info['version']}, OpenAPI {doc['openapi']}): {info.get('description', '')} "
        "The document itself is served at `GET /v1/openapi.json` and browsable at `/v1/docs`. Errors are JSON, "
        '`{"detail": ...}`. The admin routes (import, publish, retire) need `Authorization: Bearer '
        "<KVSPLIT_ADMIN_TOKEN>` and are off while that setting is unset; the dashboard (`GET /`) is not part of "
        "the document.\n\n"
        + _table(
            ("method", "path", "summary"),
            [
                (method.upper(), f"[`{path}`](#{_anchor(f'{method} {path}')})", op.get("summary", ""))
                for path, method, op in ops
            ],
        )
    )
    routes = "## Routes\n\n" + "\n".join(_operation(path, method, op) for path, method, op in ops)
    schemas = doc.get("components", {}).get("schemas", {})
    comps = "## Schemas\n\n" + "\n".join(_schema(n, schemas[n]) for n in sorted(schemas))
    return _page(intro, routes, comps)


# --------------------------------------------------------------------------- the pages


PAGES: dict[str, Callable[[], str]] = {
    "python-api.md": python_api_page,
    "knobs.md": knobs_page,
    "cli.md": cli_page,
    "http.md": http_page,
}
"""The generated pages of docs/reference/ and what renders each."""


def render_all() -> dict[str, str]:
    """Every page's text, by file name."""
    return {name: render() for name, render in PAGES.items()}


def write_pages(out: Path, pages: dict[str, str] | None = None) -> list[Path]:
    """Write the pages into ``out`` (created if missing); returns the paths written."""
    pages = render_all() if pages is None else pages
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in pages.items():
        path = out / name
        path.write_bytes(text.encode("utf-8"))
        written.append(path)
    return written


def stale_pages(out: Path, pages: dict[str, str] | None = None) -> list[str]:
    """Names of the pages whose file in ``out`` is missing or differs from the code's, byte for byte."""
    pages = render_all() if pages is None else pages
    return [n for n, text in pages.items() if not (out / n).is_file() or (out / n).read_bytes() != text.encode("utf-8")]


def main(argv: list[str] | None = None) -> int:
    """``python -m kvsplit.service.docgen [--out DIR] [--check]``: write the reference pages, or with ``--check``
    write nothing and return 1 when a page differs from what the code generates (0 otherwise).
    """
    parser = argparse.ArgumentParser(prog=COMMAND, description="Generate docs/reference/ from the code.")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder of the pages (default: docs/reference)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages(args.out)
        if stale:
            print(f"stale reference pages in {args.out}: {', '.join(stale)}; regenerate with `{COMMAND}` (make docs)")
            return 1
        print(f"{len(PAGES)} reference pages in {args.out} are current")
        return 0
    for path in write_pages(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
