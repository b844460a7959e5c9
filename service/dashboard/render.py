"""Jinja2 environment of the dashboard pages (templates/, autoescaped) and the model names of shapes."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

from ...kernels.limits import KV_DTYPE_SHORT
from ...tuner.workloads import MODEL_SHAPES as PRESETS

__all__ = ["render", "MODEL_SHAPES", "MODEL_QO_HEADS", "shape_name", "family_note"]

_MODEL_NAMES = {  # name of each preset of kvsplit.tuner.workloads.MODEL_SHAPES, given its H_q
    "qwen3-30b-a3b": "Qwen3-30B-A3B (H_q {hq})",
    "llama-3.1-8b": "Llama-3.1-8B (H_q {hq})",
    "llama-3.1-70b-tp8": "Llama-3.1-70B at TP 8 (H_q {hq} per GPU)",
}
MODEL_SHAPES: dict[tuple[int, int], str] = {
    (hkv, d): _MODEL_NAMES[preset].format(hq=hq) for preset, (hq, hkv, d) in PRESETS.items()
}
"""Model whose per-GPU attention shape a bucket family has, by (H_kv, head_dim).

A bucket family records H_kv and head_dim but not H_q (the plan does not depend
on it: the G = H_q / H_kv query heads of a KV head are one tile), so the name
is the model this project tunes for with that (H_kv, head_dim); other models
can share the shape (Llama-3.1-70B at TP 1 is H_q 64 / H_kv 8 / 128)."""
MODEL_QO_HEADS: dict[tuple[int, int], int] = {(hkv, d): hq for hq, hkv, d in PRESETS.values()}
"""H_q per GPU of the model :data:`MODEL_SHAPES` names for an (H_kv, head_dim): the ``--num-qo-heads`` the
dashboard's ``kvsplit tune --from-traffic`` hint gives (the recorded traffic keys do not hold H_q)."""


def shape_name(num_kv_heads: int, head_dim: int) -> str:
    """The card title's model part: a known model, else the shape itself."""
    return MODEL_SHAPES.get((num_kv_heads, head_dim), f"H_kv {num_kv_heads} × head_dim {head_dim}")


def family_note(sh: Any) -> str:
    """What a card title adds for a bucket family beyond its dtype and page size: ``" · KV fp8"`` for a KV cache of
    another dtype than q's, ``" · q_len 4"`` for q_len > 1 (both: ``" · KV fp8 · q_len 4"``); ``""`` for K/V in q's
    dtype at q_len 1. ``sh``: a mapping with ``dtype`` and optional ``kv_dtype`` / ``q_len``."""
    kv = sh.get("kv_dtype") or sh["dtype"]
    q_len = int(sh.get("q_len") or 1)
    out = "" if kv == sh["dtype"] else f" · KV {KV_DTYPE_SHORT.get(kv, kv)}"
    return out + (f" · q_len {q_len}" if q_len != 1 else "")


_env = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)


def _num(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def _speed_class(v: Any) -> str:
    if v is None or not math.isfinite(v):
        return "na"
    if v >= 1.15:
        return "win"
    if v >= 0.995:
        return "even"
    return "loss"


def _params(p: dict) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(p.items()))


def _duration(s: Any) -> str:
    if s is None:
        return "–"
    s = float(s)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def count(n: Any, noun: str, plural: str | None = None) -> str:
    """``n`` with thousands separators and ``noun`` in the number it takes: ``1 request``, ``2,048 requests``
    (``plural`` when not ``noun + "s"``)."""
    n = int(n)
    return f"{n:,} {noun if n == 1 else (plural or noun + 's')}"


_env.filters.update(
    family_note=family_note, num=_num, speed_class=_speed_class, params=_params, duration=_duration, counted=count
)


def render(template: str, **context: Any) -> str:
    """HTML of dashboard template ``template`` (in ``templates/``) with ``context``."""
    return _env.get_template(template).render(**context)
