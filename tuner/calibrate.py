"""Fit the simulator to the real kernel (``kvsplit calibrate``).

Times a fixed sample of (batch, plan) pairs on the GPU — the five length
families at several batch sizes, each planned by the baseline policies with
the default kernel config — fits :class:`kvsplit.tuner.simulate.Calibration`
to the training draws with :func:`kvsplit.tuner.simulate.fit_calibration`, and
reports the simulator's relative error on separately drawn held-out batches
(median and worst, per family). The fitted constants and the errors go to the
store (``calibrations`` table) so the ``sim`` backend uses them.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..kernels.limits import cover_q_len
from ..kernels.plan import Plan, make_plan
from .workloads import FAMILIES, family_batches

__all__ = [
    "CALIBRATION_POLICIES",
    "calibration_plans",
    "calibrate",
    "stored_calibration",
    "calibrate_command",
    "check_calibration_entry",
]

CALIBRATION_POLICIES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("balanced", {"ctas_per_sm": 2}),
    ("balanced", {"ctas_per_sm": 4}),
    ("balanced", {"ctas_per_sm": 8}),
    ("fa3", {}),
    ("flashinfer", {}),
    ("no_split", {}),
)
"""Policies whose plans make the calibration sample (default kernel config)."""


def check_calibration_entry(entry: Mapping[str, Any]) -> None:
    """The extra check ``kvsplit db import`` makes of a calibrations export entry
    (:func:`kvsplit.db.store.import_calibrations`): ``kv_dtype`` a q dtype or a KV cache dtype the kernel takes,
    ``q_len`` 1..8, ``constants`` a valid :class:`~kvsplit.tuner.simulate.Calibration`. Raises ValueError naming
    the field."""
    from ..kernels.limits import DTYPES, KV_DTYPES, check_q_len
    from .simulate import Calibration

    kd = entry["kv_dtype"]
    if kd not in DTYPES and kd not in KV_DTYPES:
        raise ValueError(f"kv_dtype: expected one of {sorted(DTYPES) + sorted(KV_DTYPES)}, got {kd!r}")
    check_q_len(entry["q_len"])
    try:
        Calibration.from_dict(entry["constants"])
    except ValueError as exc:
        raise ValueError(f"constants: {exc}") from None


def calibrate_command(gpu: str, dtype: str, kv_dtype: str, q_len: int) -> str:
    """The ``kvsplit calibrate`` command line that stores a calibration of this GPU, KV dtype and q_len."""
    from ..kernels.limits import KV_DTYPE_SHORT

    cmd = f"kvsplit calibrate --gpu {shlex.quote(gpu)}"
    if dtype != "bfloat16":
        cmd += f" --dtype {dtype}"
    if kv_dtype != dtype:
        cmd += f" --kv-dtype {KV_DTYPE_SHORT.get(kv_dtype, kv_dtype)}"
    if q_len != 1:
        cmd += f" --q-len {q_len}"
    return cmd


def stored_calibration(
    session: Any, gpu: str, *, dtype: str, kv_dtype: str | None = None, q_len: int = 1
) -> tuple[Any, str]:
    """The stored calibration a simulation of GPU ``gpu`` at this shape uses, and a note when it is not an
    exact match (``""`` when it is).

    ``dtype`` is the model's (q's) dtype, ``kv_dtype`` the KV cache's (None: ``dtype``; ``"fp8"`` /
    ``"float8_e4m3fn"``), ``q_len`` the query tokens per request. The rule, in order:

    1. the newest calibration of ``gpu`` timed with that KV dtype and q_len
       (:func:`kvsplit.db.store.latest_calibration`);
    2. else, for an FP8 cache or q_len > 1, the newest q_len-1 calibration with K/V in ``dtype``: the
       simulator's reference fit, on which :func:`kvsplit.tuner.simulate.predict` models the KV dtype's bytes
       and the heavier tiles' math (:data:`kvsplit.tuner.simulate.REFERENCE_FLOPS_PER_BYTE`); the note says so
       and names the ``kvsplit calibrate`` command that stores the exact one;
    3. else None (the simulator's defaults), with a note naming that command.

    A fit of another FP8/q_len > 1 shape is never used for this one (its measured rates include that shape's
    bytes and math). The KV dtype is the key, not q's: an FP8 cache's fit serves bf16 and fp16 models alike.

    Returns
    -------
    (row, note)
        ``row`` a :class:`kvsplit.db.models.Calibration` or None.

    Raises
    ------
    ValueError
        An invalid ``dtype``, ``kv_dtype`` or ``q_len`` (named).
    """
    from ..db import store
    from ..kernels.limits import DTYPE_ALIASES, DTYPES, check_kv_dtype, check_q_len

    dt = DTYPE_ALIASES.get(dtype, dtype)
    if dt not in DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
    kd = check_kv_dtype(kv_dtype, dt)
    ql = check_q_len(q_len)
    row = store.latest_calibration(session, gpu=gpu, kv_dtype=kd, q_len=ql)
    if row is not None:
        return row, ""
    want = f"KV {kd}, q_len {ql}"
    cmd = calibrate_command(gpu, dt, kd, ql)
    if (kd, ql) != (dt, 1):
        row = store.latest_calibration(session, gpu=gpu, kv_dtype=dt, q_len=1)
        if row is not None:
            return row, (
                f"no calibration of {gpu} for {want}: the simulator uses calibration {row.id} "
                f"(KV {dt}, q_len 1) and models the KV dtype's bytes and the q_len tiles on it; `{cmd}` "
                "stores a fit of this shape"
            )
    return None, f"no calibration of {gpu} for {want}: the simulator uses its defaults; `{cmd}` stores one"


def calibration_plans(
    *,
    gpu: str,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
    page_size: int,
    batch_sizes: Sequence[int] = (4, 16, 64, 256),
    total_tokens: int = 262_144,
    role: str = "train",
    seed: int = 0,
    kv_dtype: str | None = None,
    q_len: int = 1,
    num_qo_heads: int | None = None,
) -> list[tuple[str, Plan]]:
    """(family, plan) pairs of one calibration set; ``role`` picks independent draws. ``kv_dtype``, ``q_len``
    and ``num_qo_heads`` as :func:`~kvsplit.kernels.plan.make_plan` takes them (kv_lens below q_len are raised
    to q_len: they count the new tokens)."""
    out = []
    for fam in FAMILIES:
        for B in batch_sizes:
            if fam == "2x40" and B < 3:
                continue
            (lens,) = family_batches(fam, B, total_tokens, num_batches=1, seed=seed, role=role)
            lens = cover_q_len(lens, q_len)
            for name, params in CALIBRATION_POLICIES:
                plan = make_plan(
                    lens,
                    num_kv_heads=num_kv_heads,
                    device=gpu,
                    policy=name,
                    params=params,
                    head_dim=head_dim,
                    page_size=page_size,
                    dtype=dtype,
                    kv_dtype=kv_dtype,
                    q_len=q_len,
                    num_qo_heads=num_qo_heads,
                )
                out.append((fam, plan))
    return out


def _errors(
    pairs: Sequence[tuple[str, Plan]], times: Sequence[float], cal: Any, device: Any, **sim_kw: Any
) -> dict[str, Any]:
    from .simulate import predict

    rel = np.array([predict(p, device, calibration=cal, **sim_kw) / t - 1.0 for (_, p), t in zip(pairs, times)])
    fams = np.array([f for f, _ in pairs])
    per = {}
    for fam in FAMILIES:
        e = np.abs(rel[fams == fam])
        if e.size:
            per[fam] = {"n": int(e.size), "median": float(np.median(e)), "worst": float(e.max())}
    a = np.abs(rel)
    return {"n": int(a.size), "median": float(np.median(a)), "worst": float(a.max()), "per_family": per}


def calibrate(
    backend: Any,
    *,
    gpu: str,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
    page_size: int,
    seed: int = 0,
    database_url: str | None = None,
    progress: bool = False,
    kv_dtype: str | None = None,
    q_len: int = 1,
    num_qo_heads: int | None = None,
) -> dict[str, Any]:
    """Time the calibration sample with ``backend`` (a GPU timing backend), fit, report, store.

    ``kv_dtype`` (None: ``dtype``; ``"float8_e4m3fn"``), ``q_len`` (1-8) and ``num_qo_heads`` (H_q, for the GQA
    group G) are the shape ``backend`` times (a :class:`~kvsplit.tuner.backends.GpuBackend` made for them): the
    sample's plans are made for it and the fit and its errors simulate it (:func:`~kvsplit.tuner.simulate.predict`
    with the same KV dtype, q_len and G).

    Returns a report: the fitted constants, ``train`` fit errors and ``heldout``
    errors (``median``/``worst`` absolute relative error, overall and per family),
    the sample's ``kv_dtype`` and ``q_len``, and the stored calibration id when ``database_url`` is given (stored as
    a calibration of that KV dtype and q_len only: :func:`stored_calibration` is how simulations pick one).

    Raises
    ------
    ValueError
        An invalid ``kv_dtype`` or ``q_len`` (named).
    """
    from ..kernels.device import resolve_device
    from ..kernels.limits import check_kv_dtype, check_q_len
    from .simulate import Calibration, fit_calibration

    dev = resolve_device(gpu)
    group = num_qo_heads // num_kv_heads if num_qo_heads else None
    kd = check_kv_dtype(kv_dtype, dtype)
    kd = None if kd == dtype else kd
    q_len = check_q_len(q_len, group)
    sim_kw = dict(kv_dtype=kd, q_len=q_len, group_size=group)
    shape = dict(
        gpu=gpu,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        page_size=page_size,
        seed=seed,
        kv_dtype=kd,
        q_len=q_len,
        num_qo_heads=num_qo_heads,
    )
    train = calibration_plans(role="train", **shape)
    held = calibration_plans(role="heldout", **shape)
    it = train + held
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="calibrate", unit="plan")
    times = [float(backend.time_plan(p)) for _, p in it]
    t_train, t_held = times[: len(train)], times[len(train) :]
    base = Calibration.default(dev, head_dim=head_dim, dtype=dtype, config=train[0][1].config, **sim_kw)
    read_bw = float(backend.device_info().get("read_bandwidth_gbps") or 0) * 1e9
    if read_bw > 0:
        f = read_bw / base.hbm_bw
        import dataclasses

        base = dataclasses.replace(base, hbm_bw=read_bw, sm_bw=base.sm_bw * f, cta_bw=base.cta_bw * f)
    # hbm_bw stays the measured read bandwidth; the per-SM/per-CTA rates and fixed costs are fitted
    params = (
        "sm_bw",
        "cta_bw",
        "slots",
        "tile_fixed_s",
        "item_fixed_s",
        "launch_s",
        "merge_launch_s",
        "merge_partial_s",
        "persistent_tile_s",
    )
    cal, fit = fit_calibration(
        [(p, t) for (_, p), t in zip(train, t_train)], dev, initial=base, params=params, rounds=10, **sim_kw
    )
    report = {
        "gpu": dev.name,
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
        "dtype": dtype,
        "page_size": page_size,
        "kv_dtype": kd or dtype,
        "q_len": q_len,
        "kernel_config": train[0][1].config.to_dict(),
        "constants": cal.to_dict(),
        "default_heldout": _errors(held, t_held, base, dev, **sim_kw),
        "train": _errors(train, t_train, cal, dev, **sim_kw),
        "heldout": _errors(held, t_held, cal, dev, **sim_kw),
        "samples": [
            {"family": f, "B": p.batch_size, "policy": p.policy, "params": dict(p.params), "time_s": t, "role": role}
            for role, pairs, ts in (("train", train, t_train), ("heldout", held, t_held))
            for (f, p), t in zip(pairs, ts)
        ],
    }
    if database_url is not None:
        from ..db import store

        info, sw = backend.device_info(), backend.software()
        with store.session_scope(database_url, write=True) as s:
            d = store.get_or_create_device(
                s,
                name=info["name"],
                num_sms=info["num_sms"],
                hbm_bandwidth_gbps=info["hbm_bandwidth_gbps"],
                software=sw,
                read_bandwidth_gbps=info.get("read_bandwidth_gbps"),
            )
            row = store.record_calibration(
                s,
                device_id=d.id,
                constants=cal.to_dict(),
                kv_dtype=kd or dtype,
                q_len=q_len,
                kernel_config=report["kernel_config"],
                error={
                    "train": {k: report["train"][k] for k in ("median", "worst")},
                    "heldout": {k: report["heldout"][k] for k in ("median", "worst")},
                    "heldout_per_family": report["heldout"]["per_family"],
                },
                num_samples=len(train),
            )
            report["calibration_id"] = row.id
    return report
