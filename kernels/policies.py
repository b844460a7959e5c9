""":func:`make_plan`, the public entry point of the planner: a named policy resolved once
(:func:`~kvsplit.kernels.rulespec.resolve`, memoized), then the loop-form rules of :mod:`.fastplan`
(compiled by numba when present, plain Python otherwise)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import fastplan as _fastplan
from .device import DeviceSpec
from .rulespec import RuleSpec, resolve
from .shape import canonical_dtype
from .workplan import Plan


def make_plan(
    kv_lens: Any,
    *,
    num_kv_heads: int,
    device: DeviceSpec | str,
    policy: str = "balanced",
    params: Mapping[str, Any] | None = None,
    head_dim: int = 128,
    page_size: int = 16,
    dtype: str = "bfloat16",
    kv_dtype: str | None = None,
    q_len: int = 1,
    num_qo_heads: int | None = None,
) -> Plan:
    """Plan one decode batch with a named split policy.

    Parameters
    ----------
    kv_lens : array-like of int, ``[B]``
        Tokens in each request's KV cache (list, NumPy array or CPU tensor);
        0 <= kv_len <= 2^31-1, 1 <= B <= 65,536.
    num_kv_heads : int
        H_kv, >= 1.
    device : DeviceSpec or str
        Target GPU, or its name as ``torch.cuda.get_device_name()`` reports it.
    policy : str
        One of :data:`POLICIES`.
    params : dict, optional
        Policy parameters plus the kernel knobs of :data:`KNOB_PARAMS`; knobs
        not given come from :func:`default_config`.
    head_dim : int
        D, one of 64, 128, 256.
    page_size : int
        Tokens per KV page, 1 to 256.
    dtype : str or torch.dtype
        ``"float16"``, ``"bfloat16"`` or ``"float32"``: q's (and the output's); a ``torch.dtype`` is read as its
        name (:func:`~kvsplit.kernels.shape.canonical_dtype`).
    kv_dtype : str, optional
        The KV cache's dtype: None or ``dtype`` (the same), or ``"float8_e4m3fn"`` with a 16-bit ``dtype``
        (1 byte per element: the residency counts half the K/V shared memory, the wave-aware chunk twice the
        tokens of a tile's fixed cost).
    q_len : int
        Query tokens per request, 1 to 8 (a verify step of ``q_len - 1`` draft tokens): a work tile holds
        ``G * q_len`` query rows (more registers, fewer resident CTAs; BLOCK_N 64 by default above 32 rows). The
        work list's KV ranges are planned as for q_len 1 with that tile.
    num_qo_heads : int, optional
        H_q, for the GQA group G of a q_len > 1 tile's rows; without it G = 8 (the residency tables' group).

    Returns
    -------
    Plan

    Raises
    ------
    ValueError
        On any invalid argument or parameter, naming it.
    """
    if not isinstance(dtype, str):
        dtype = canonical_dtype(dtype)
    return plan_with(
        kv_lens,
        resolve(
            policy,
            params,
            num_kv_heads=num_kv_heads,
            device=device,
            head_dim=head_dim,
            page_size=page_size,
            dtype=dtype,
            kv_dtype=kv_dtype,
            q_len=q_len,
            num_qo_heads=num_qo_heads,
        ),
    )


def plan_with(kv_lens: Any, spec: RuleSpec) -> Plan:
    """The plan of ``kv_lens`` (as :func:`make_plan`'s) with a resolved spec (:func:`~kvsplit.kernels.rulespec.resolve`):
    on the compiled rules where they apply, else with the NumPy ones. Raises ValueError naming ``kv_lens[i]``."""
    return _fastplan.plan_with_spec(_fastplan.as_kv_lens(kv_lens), spec, True)
