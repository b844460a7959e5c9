"""The plan viewer (``/plan``): a batch's plans as work tiles on SMs over time, from the calibrated simulator.

:func:`parse_kv_lens` validates what the user pasted or uploaded; :func:`viewer_context` plans the batch three
ways for one (GPU, shape) — the plan the served table gives it (:meth:`kvsplit.kernels.policy_table.PolicyTable.plan`,
the ``balanced`` fallback without a table), ``balanced``, and FlashInfer's split rule on kvsplit's kernel
(``make_plan(..., policy="flashinfer")``, kernels/peer_policies.py) — and draws each
:func:`kvsplit.tuner.simulate.timeline` (the placement :func:`~kvsplit.tuner.simulate.predict`'s total is computed
from) on one time scale (:mod:`.gantt`). The simulator uses the store's newest calibration of the GPU
(``kvsplit calibrate``) of the shape's KV dtype and q_len, else its defaults, and says which, with the
calibration's held-out error.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import orjson
from markupsafe import Markup

from .gantt import gantt_svg

__all__ = [
    "parse_kv_lens",
    "viewer_context",
    "viewer_qo_heads",
    "ViewerError",
    "MAX_REQUESTS",
    "MAX_TEXT",
    "trace_choices",
]

MAX_REQUESTS = 4096
"""Most requests the viewer plans and draws (the HTTP plan service takes 65,536)."""
MAX_TEXT = 200_000
"""Most characters of pasted or uploaded kv_lens text."""
_SPLIT = re.compile(r"[\s,;\[\]]+")


class ViewerError(ValueError):
    """Invalid plan-viewer input; the message names the argument."""


def parse_kv_lens(text: str, *, max_kv_len: int) -> list[int]:
    """kv_lens from text: values separated by commas, spaces, newlines or semicolons (a JSON list works).

    Each value is read as a JSON value, as in the body of ``POST /v1/plan``, and the list is checked by that
    route's own rule (:func:`kvsplit.service.validation.check_kv_lens`): integers in ``0..max_kv_len`` tokens, 0
    being an empty slot. The viewer only adds limits of its own on the text's size and on the requests it draws.

    Raises
    ------
    ViewerError
        More than :data:`MAX_TEXT` characters or :data:`MAX_REQUESTS` values, a value that is not a JSON value, or
        a list that rule refuses (no value; a value that is not an integer, below 0 or above ``max_kv_len``); the
        message names ``kv_lens`` or ``kv_lens[i]``.
    """
    from ..validation import check_kv_lens

    if len(text) > MAX_TEXT:
        raise ViewerError(f"kv_lens: {len(text):,} characters; at most {MAX_TEXT:,}")
    toks = [t for t in _SPLIT.split(text.strip()) if t]
    if len(toks) > MAX_REQUESTS:
        raise ViewerError(f"kv_lens: {len(toks):,} requests; the viewer draws at most {MAX_REQUESTS:,}")
    values = []
    for i, t in enumerate(toks):
        try:
            values.append(orjson.loads(t))
        except orjson.JSONDecodeError:
            raise ViewerError(f"kv_lens[{i}] = {t[:30]}: Input should be a valid integer") from None
    errs: list[dict[str, Any]] = []
    arr = check_kv_lens(errs, values, max_kv_len)
    if errs:
        loc, msg = errs[0]["loc"], errs[0]["msg"]
        if len(loc) > 2:  # ("body", "kv_lens", i)
            raise ViewerError(f"kv_lens[{loc[2]}] = {toks[loc[2]][:30]}: {msg}")
        raise ViewerError(f"kv_lens: {msg} (paste integers separated by commas or spaces)")
    assert arr is not None
    return arr.tolist()


def trace_choices() -> list[tuple[str, int]]:
    """(trace name, nominal B) pairs the viewer offers: the held-out trace batches of the results."""
    from ...tuner.workloads import TRACE_EVAL_BATCH_SIZES, TRACES

    return [(n, b) for n in TRACES for b in TRACE_EVAL_BATCH_SIZES]


@lru_cache(maxsize=32)
def trace_batch(name: str, B: int) -> tuple[int, ...]:
    """The held-out batch of trace ``name`` at nominal batch size ``B`` (``kvsplit.tuner.workloads.trace_batches``).

    Raises
    ------
    ViewerError
        Unknown trace or batch size, or the trace has no such batch.
    """
    from ...tuner.workloads import trace_batches

    if (name, B) not in trace_choices():
        raise ViewerError(f"trace: expected one of the listed trace batches, got {name[:40]!r} B={B}")
    try:
        _, held = trace_batches(name, B, num_train=1, num_heldout=1, seed=0)
    except ValueError as exc:
        raise ViewerError(f"trace: {exc}") from None
    return tuple(int(x) for x in held[0])


def viewer_calibration(url: str, sh: dict[str, Any]) -> tuple[dict[str, Any] | None, float | None, dict[str, Any]]:
    """The calibration the simulator uses for dashboard shape ``sh`` (its GPU, dtype, KV dtype and q_len:
    :func:`kvsplit.tuner.search.calibration_for`), the GPU's measured read bandwidth and the fit's error."""
    from ...tuner.search import calibration_for

    cal, bw = calibration_for(
        url, sh["gpu"], "sim", dtype=sh["dtype"], kv_dtype=sh.get("kv_dtype"), q_len=sh.get("q_len", 1)
    )
    return cal, bw, (cal or {}).get("error") or {}


def viewer_qo_heads(sh: dict[str, Any]) -> int:
    """H_q the viewer plans shape ``sh`` for: the model's of :data:`~.render.MODEL_QO_HEADS` (the one its card names),
    else H_kv (a bucket family records no H_q; it shapes only a q_len > 1 plan's tiles)."""
    from .render import MODEL_QO_HEADS

    return MODEL_QO_HEADS.get((sh["num_kv_heads"], sh["head_dim"]), sh["num_kv_heads"])


def family_shape(sh: dict[str, Any]) -> dict[str, Any]:
    """The planner's shape arguments (``make_plan`` / ``PolicyTable.plan`` without the GPU) of dashboard shape
    ``sh``: its family's fields and :func:`viewer_qo_heads` query heads; the viewer and the coverage map plan with
    them."""
    return dict(
        num_kv_heads=sh["num_kv_heads"],
        head_dim=sh["head_dim"],
        dtype=sh["dtype"],
        page_size=sh["page_size"],
        kv_dtype=sh["kv_dtype"],
        q_len=sh["q_len"],
        num_qo_heads=viewer_qo_heads(sh),
    )


def viewer_context(url: str, table: Any, sh: dict[str, Any], kv_lens: list[int]) -> dict[str, Any]:
    """The three plans of ``kv_lens`` for shape ``sh`` (a ``dashboard_data`` shape: one bucket family, its KV dtype
    and q_len included) with their Gantt charts, planned and simulated for :func:`viewer_qo_heads` query heads.

    Each plan's ``floor_us`` is the batch's HBM read floor (the simulator's: ``sum(kv_len) * H_kv * D * 2`` elements
    of the KV dtype's size over the calibration's read bandwidth, :func:`kvsplit.tuner.simulate.hbm_floor_s`)."""
    from ...kernels.limits import kv_elt_bytes
    from ...kernels.plan import make_plan
    from ...tuner.backends import SimBackend
    from ...tuner.simulate import timeline

    shape = family_shape(sh)
    hq = shape["num_qo_heads"]
    cal, read_bw, err = viewer_calibration(url, sh)
    sim = SimBackend(
        sh["gpu"],
        calibration=cal,
        read_bandwidth_gbps=read_bw,
        **{k: shape[k] for k in ("num_kv_heads", "head_dim", "dtype", "kv_dtype", "q_len", "num_qo_heads")},
    )
    plans = []
    if table is not None:
        plan, bucket, info = table.plan(kv_lens, gpu=sh["gpu"], **shape)
        src = info["source"]
        what = (
            f"policy #{info['id']} ({info['name']}, {src}), bucket distance {bucket['distance']:.2f}"
            if src != "fallback"
            else "no tuned bucket within reach: the balanced fallback"
        )
        plans.append(("served", "served plan", plan, what))
    else:
        plan = make_plan(kv_lens, policy="balanced", device=sh["gpu"], **shape)
        plans.append(("served", "served plan", plan, "no policy table loaded: the balanced fallback"))
    plans.append(
        (
            "balanced",
            "balanced",
            make_plan(kv_lens, policy="balanced", device=sh["gpu"], **shape),
            "untuned fallback rule",
        )
    )
    plans.append(
        (
            "flashinfer",
            "FlashInfer's rule",
            make_plan(kv_lens, policy="flashinfer", device=sh["gpu"], **shape),
            "FlashInfer's split rule on kvsplit's kernel (kernels/peer_policies.py)",
        )
    )
    sim_kw = dict(kv_dtype=sh["kv_dtype"], q_len=sh["q_len"], group_size=hq // sh["num_kv_heads"])
    tls = [timeline(p, sh["gpu"], calibration=sim.calibration_for(p), **sim_kw) for _, _, p, _ in plans]
    t_max = max(t.main_s + t.merge_s for t in tls)
    out = []
    for (kind, name, p, what), tl in zip(plans, tls):
        c = p.config
        out.append(
            {
                "kind": kind,
                "name": name,
                "what": what,
                "total_us": tl.total_s * 1e6,
                "floor_us": tl.floor_s * 1e6,
                "ratio": tl.total_s / tl.floor_s if tl.floor_s > 0 else None,  # None: a batch of 0 tokens
                "tiles": int(tl.sm.shape[0]),
                "ctas": int(p.cta_indptr.shape[0] - 1),
                "max_splits": int(p.num_splits.max()),
                "split_requests": int((p.num_splits > 1).sum()),
                "num_splits": ",".join(map(str, p.num_splits.tolist())),  # per request, in batch order
                "config": f"BLOCK_N {c.block_n}, {c.num_warps} warps, {c.num_stages} stages, {c.schedule}",
                "svg": Markup(gantt_svg(tl, p, title=name, t_max=t_max)),
            }
        )
    held = (err or {}).get("heldout") or {}
    return {
        "plans": out,
        "B": len(kv_lens),
        "tokens": int(sum(kv_lens)),
        "num_qo_heads": hq,
        "kv_bytes": kv_elt_bytes(sh["dtype"], sh["kv_dtype"]),
        "floor_us": tls[0].floor_s * 1e6,
        "calibration": f"the store's calibration {cal['id']} of this GPU (KV {cal['kv_dtype']}, q_len "
        f"{cal['q_len']}; kvsplit calibrate)"
        if cal
        else f"the simulator's defaults scaled to the measured read bandwidth {read_bw:,.0f} GB/s (no calibration stored)"
        if read_bw
        else "the simulator's defaults (no calibration or measured bandwidth stored)",
        "cal_error": held,
    }
