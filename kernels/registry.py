"""The policy registry: what a policy function sees (:class:`PlanContext`), the
kernel knobs every policy accepts (:data:`KNOB_PARAMS`) and their parsing."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .device import DeviceSpec
from .limits import (
    MAX_NUM_PROGRAMS, MAX_PACK_TOKENS, ORDERS, SCHEDULES, KernelConfig, _check_config, _pos_int, default_config,
)

@dataclass(frozen=True)
class PlanContext:
    """What a policy sees besides the lengths (all validated)."""

    device: DeviceSpec
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: str



KNOB_PARAMS = ("block_n", "num_warps", "num_stages", "schedule", "num_programs", "order", "pack_tokens", "prefetch",
               "heads_per_tile", "next_item")
"""Parameters every policy accepts (kernel knobs, launch order, CTA packing)."""


def _flag(params: Mapping[str, Any], name: str) -> bool:
    """The boolean knob ``params[name]`` (default false; a NumPy bool is taken as a bool). Raises ValueError
    naming ``params.<name>`` for anything else."""
    v = params.get(name, False)
    if isinstance(v, np.bool_):
        v = bool(v)
    if not isinstance(v, bool):
        raise ValueError(f"params.{name}: expected true or false, got {v!r}")
    return v


def _knobs(params: Mapping[str, Any], ctx: PlanContext, default_order: str, default_schedule: str | None = None,
           default_programs: int | None = None) -> tuple[KernelConfig, str, int]:
    base = default_config(ctx.head_dim, ctx.dtype)
    block_n = params.get("block_n", base.block_n)
    num_warps = params.get("num_warps", base.num_warps)
    num_stages = params.get("num_stages", base.num_stages)
    schedule = params.get("schedule", default_schedule or base.schedule)
    for name, v in (("block_n", block_n), ("num_warps", num_warps), ("num_stages", num_stages)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"params.{name}: expected an integer, got {v!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"params.schedule: expected one of {SCHEDULES}, got {schedule!r}")
    if schedule == "persistent":
        default_np = default_programs if default_programs is not None else 4 * ctx.device.num_sms
        num_programs = _pos_int("params.num_programs", params.get("num_programs", default_np), 1, MAX_NUM_PROGRAMS)
    else:
        if "num_programs" in params and params["num_programs"] not in (0, None):
            raise ValueError("params.num_programs: only meaningful with schedule='persistent'")
        num_programs = 0
    order = params.get("order", default_order)
    if order not in ORDERS:
        raise ValueError(f"params.order: expected one of {ORDERS}, got {order!r}")
    pack = _pos_int("params.pack_tokens", params.get("pack_tokens", 0), 0, MAX_PACK_TOKENS)
    prefetch, next_item = _flag(params, "prefetch"), _flag(params, "next_item")
    heads = params.get("heads_per_tile", 1)
    if isinstance(heads, bool) or not isinstance(heads, (int, np.integer)):
        raise ValueError(f"params.heads_per_tile: expected an integer, got {heads!r}")
    cfg = KernelConfig(int(block_n), int(num_warps), int(num_stages), str(schedule), int(num_programs), prefetch,
                       int(heads), next_item)
    _check_config(cfg, ctx.head_dim, ctx.dtype)
    if ctx.num_kv_heads % cfg.heads_per_tile:
        raise ValueError(f"params.heads_per_tile: expected a divisor of num_kv_heads={ctx.num_kv_heads}, "
                         f"got {cfg.heads_per_tile}")
    return cfg, order, pack



# ----------------------------------------------------------------------------
# Policies
# ----------------------------------------------------------------------------

PolicyFn = Callable[[np.ndarray, PlanContext, Mapping[str, Any]], tuple[np.ndarray, KernelConfig, str, int]]
POLICIES: dict[str, PolicyFn] = {}
_POLICY_PARAMS: dict[str, tuple[str, ...]] = {}


def _register(name: str, params: tuple[str, ...]) -> Callable[[PolicyFn], PolicyFn]:
    def deco(fn: PolicyFn) -> PolicyFn:
        POLICIES[name] = fn
        _POLICY_PARAMS[name] = params + KNOB_PARAMS
        return fn

    return deco



def _num(name: str, v: Any, lo: float, hi: float) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ValueError(f"params.{name}: expected a number in [{lo}, {hi}], got {v!r}")
    f = float(v)
    if not (lo <= f <= hi):  # also rejects NaN
        raise ValueError(f"params.{name}: expected a number in [{lo}, {hi}], got {v!r}")
    return f



def policy_params(policy: str) -> tuple[str, ...]:
    """Names of the parameters ``policy`` accepts."""
    if policy not in _POLICY_PARAMS:
        raise ValueError(f"policy: unknown policy {policy!r}; known: {sorted(POLICIES)}")
    return _POLICY_PARAMS[policy]


