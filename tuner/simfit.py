"""Fit the simulator to H200 timings: one constant set per kernel config.

``bench/gpu_sweep.py`` times many (batch, plan) pairs on the GPU and writes one
JSON record per line (``--mode train``: the training batches of
:func:`~kvsplit.tuner.workloads.training_cases`; tests/data/h200_retime_eval.jsonl is such a file of
the evaluation batches). This module rebuilds each timed plan
with today's planner (:func:`sweep_samples`; a file timed with another planner
rebuilds other plans than the ones it
timed), fits :class:`~kvsplit.tuner.simulate.Calibration` with per-config
constants on the training timings (:func:`fit_per_config`), and tabulates the
relative error per set, policy, wave class and kernel config (:func:`error_table`).
The per-config constants of service/data/h200_calibration.json were fitted with
these functions on H200 sweeps of those training batches (the document's
``source`` says what was fitted on what; docs/concepts/simulator.md gives the
measured error on held-out batches).

Record names of a ``case`` record's ``times``: ``balanced|c4|n64w4s2`` is policy
balanced with ``{"ctas_per_sm": 4.0, "block_n": 64, "num_warps": 4,
"num_stages": 2}`` (likewise ``stream_k|...``; a suffix ``|o2m4`` adds
``item_cost_blocks`` 2, ``min_piece_blocks`` 4, a suffix ``|pf`` the ``prefetch`` knob, a suffix ``|h2``
``heads_per_tile`` 2, a last suffix ``|nx`` the ``next_item`` knob);
``balanced`` its defaults; ``fa3``;
``fi_rule_tc`` / ``fi_rule_notc`` FlashInfer's rule (``tensor_cores`` True /
False) on our kernel; ``served`` / ``served_r1`` / ``served_prev`` / ``served_alt`` the case's ``served`` /
``served_r1`` / ``served_prev`` / ``served_alt`` policy in the case record (bench/gpu_sweep.py's ``load_cases``); ``flashinfer_kernel`` is
FlashInfer's own kernel (not ours: skipped). A time of ``None`` is a rejected plan
(skipped); records with a negative ``case`` id are discarded warm-ups (skipped).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..kernels.device import DeviceSpec, resolve_device
from ..kernels.plan import Plan, make_plan
from .pool import candidate_policy
from .simulate import Calibration, SimTiles, config_key, prepare_tiles, simulate_tiles

__all__ = [
    "SweepSample",
    "sweep_samples",
    "best_of",
    "fit_per_config",
    "error_table",
    "error_summary",
    "predict_samples",
    "wave_class",
    "GLOBAL_FIT_PARAMS",
    "CONFIG_FIT_PARAMS",
    "HELDOUT_SETS",
    "candidate_policy",
    "merged_case_records",
]

GLOBAL_FIT_PARAMS = ("launch_s", "merge_launch_s", "merge_partial_s", "merge_split_s", "persistent_tile_s")
"""Constants shared by every kernel config (fitted on all training samples)."""
CONFIG_FIT_PARAMS = ("sm_bw", "cta_bw", "ramp_ctas", "tile_fixed_s", "item_fixed_s")
"""Constants fitted per kernel config (on that config's training samples)."""
HELDOUT_SETS = ("untuned", "llama8b", "trace")
"""Sets of the evaluation cases (``set`` of a case record) held out of the fit by default (trained on ``ref`` and ``jitter``)."""

_LOSS_CAP = math.log(1.5)  # squared log error capped at 50 %: a few pathological times do not steer the fit


@dataclass
class SweepSample:
    """One timed plan of the sweep."""

    case: int
    set: str
    family: str
    B: int
    T: int
    name: str
    policy: str  # the record name's policy part: balanced, stream_k, fa3, fi_rule_tc, fi_rule_notc, served_r1
    time_s: float
    floor_s: float
    plan: Plan


def _policy_of(name: str, case: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    if name == "fa3":
        return "fa3", {}
    if name == "fi_rule_tc":
        return "flashinfer", {"tensor_cores": True}
    if name == "fi_rule_notc":
        return "flashinfer", {"tensor_cores": False}
    if name in ("served", "served_r1", "served_prev", "served_alt"):
        return case[name]["policy"], dict(case[name]["params"])
    return candidate_policy(name) or (name, {})


def merged_case_records(paths: str | Path | Sequence[str | Path]) -> tuple[list[dict[str, Any]], float | None]:
    """The ``case`` records of one or more sweep files, merged per case id: a plan timed in a later file
    replaces the earlier timing of the same record name (a re-time of the plans a planner change rebuilt, listed
    after the original run). Negative (warm-up) case ids
    are dropped. Returns the records in first-seen order and the first file's measured read bandwidth (bytes/s,
    None if it has none)."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    merged: dict[int, dict[str, Any]] = {}
    bw = None
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("kind") == "bandwidth" and bw is None:
                bw = float(r["bytes_per_s"])
            if r.get("kind") != "case" or r["case"] < 0:
                continue
            have = merged.get(r["case"])
            if have is None:
                merged[r["case"]] = {**r, "times": dict(r["times"])}
            else:
                have["times"].update(r["times"])
    return list(merged.values()), bw


def sweep_samples(
    sweep_path: str | Path | Sequence[str | Path],
    cases_path: str | Path,
    *,
    device: str = "NVIDIA H200",
    head_dim: int = 128,
    dtype: str = "bfloat16",
    page_size: int = 16,
    case_ids: Iterable[int] | None = None,
) -> tuple[list[SweepSample], float | None]:
    """Rebuild every timed plan of a sweep file (or of several, merged by :func:`merged_case_records`).

    Returns the samples and the sweep's measured read bandwidth (bytes/s, its
    ``bandwidth`` record; None if absent). ``case_ids`` keeps only those cases.
    """
    cases = {c["id"]: c for c in json.loads(Path(cases_path).read_text())["cases"]}
    keep = set(case_ids) if case_ids is not None else None
    out: list[SweepSample] = []
    records, bw = merged_case_records(sweep_path)
    for r in records:
        if keep is not None and r["case"] not in keep:
            continue
        c = cases[r["case"]]
        lens = np.asarray(c["kv_lens"], dtype=np.int64)
        for name, t in r["times"].items():
            if t is None or name == "flashinfer_kernel":
                continue
            pol, params = _policy_of(name, c)
            plan = make_plan(
                lens,
                num_kv_heads=c["num_kv_heads"],
                device=device,
                policy=pol,
                params=params,
                head_dim=head_dim,
                dtype=dtype,
                page_size=page_size,
            )
            out.append(
                SweepSample(
                    case=r["case"],
                    set=r["set"],
                    family=r["family"],
                    B=int(r["B"]),
                    T=int(r["T"]),
                    name=name,
                    policy=name.split("|")[0],
                    time_s=float(t),
                    floor_s=float(r["floor_s"]),
                    plan=plan,
                )
            )
    return out, bw


def best_of(samples: Sequence[SweepSample], repeats: Sequence[SweepSample]) -> list[SweepSample]:
    """``samples`` with each time replaced by the least of it and the times of the same (case, name)
    in ``repeats`` (another run of the same cases): best of
    repeated timings, as bench's final table takes for the served plan."""
    best: dict[tuple[int, str], float] = {}
    for r in repeats:
        k = (r.case, r.name)
        best[k] = min(best.get(k, math.inf), r.time_s)
    return [dataclasses.replace(s, time_s=min(s.time_s, best.get((s.case, s.name), math.inf))) for s in samples]


def _prep(samples: Sequence[SweepSample], dev: DeviceSpec) -> list[SimTiles]:
    return [prepare_tiles(s.plan, dev) for s in samples]


def predict_samples(
    samples: Sequence[SweepSample],
    cal: Calibration,
    device: DeviceSpec | str = "NVIDIA H200",
    tiles: Sequence[SimTiles] | None = None,
) -> np.ndarray:
    """Predicted seconds of each sample under ``cal``."""
    tl = tiles if tiles is not None else _prep(samples, resolve_device(device))
    return np.array([simulate_tiles(t, cal) for t in tl])


def _loss(pred: np.ndarray, meas: np.ndarray) -> float:
    e = np.log(pred / meas)
    return float(np.mean(np.minimum(e * e, _LOSS_CAP * _LOSS_CAP)))


def _coord_search(
    cal: Calibration, names: Sequence[str], loss_of, rounds: int, key: str | None = None
) -> tuple[Calibration, float]:
    """Coordinate search in log space on ``names`` (of ``cal.per_config[key]`` when ``key`` is given)."""

    def get(c: Calibration, n: str) -> float:
        if key is not None:
            return float(c.per_config.get(key, {}).get(n, getattr(c, n)))
        return float(getattr(c, n))

    def put(c: Calibration, n: str, v: float) -> Calibration:
        if key is None:
            return dataclasses.replace(c, **{n: v})
        pc = {k: dict(o) for k, o in c.per_config.items()}
        pc.setdefault(key, {})[n] = v
        return dataclasses.replace(c, per_config=pc)

    best = loss_of(cal)
    for r in range(rounds):
        step = 2.0 ** (1.0 / (1.7**r))
        for n in names:
            cur = get(cal, n)
            if n == "ramp_ctas":  # additive: 0 is a valid value
                d = 2.0 * (step - 1.0)
                cands = [cur + d, max(cur - d, 0.0)]
            elif cur > 0:
                cands = [cur * step, cur / step]
            else:  # a time constant at 0: try back in at a few magnitudes
                cands = [1e-8, 1e-7, 1e-6, 4e-6] if n.endswith("_s") else [1e-7]
            if n not in ("hbm_bw", "sm_bw", "cta_bw") and cur > 0 and r == 0:
                cands.append(0.0)
            for v in cands:
                try:
                    trial = put(cal, n, v)
                except ValueError:
                    continue
                val = loss_of(trial)
                if val < best - 1e-12:
                    best, cal = val, trial
    return cal, best


def fit_per_config(
    samples: Sequence[SweepSample],
    *,
    device: str = "NVIDIA H200",
    initial: Calibration | None = None,
    read_bandwidth: float | None = None,
    rounds: int = 5,
    outer: int = 2,
    min_samples: int = 20,
) -> Calibration:
    """Fit per-config constants (:data:`CONFIG_FIT_PARAMS`) and the shared ones (:data:`GLOBAL_FIT_PARAMS`).

    Slots stay the measured residency of each config (``slots=None``);
    ``hbm_bw`` is the measured read bandwidth when given. Block-coordinate
    search: per config on its own samples (configs with fewer than
    ``min_samples`` keep the shared constants), then the shared constants on
    all samples, ``outer`` times. Loss: mean squared log error capped at
    log(1.5) per sample (robust to a few pathological measurements).
    """
    dev = resolve_device(device)
    cal = initial or Calibration.default(dev)
    cal = dataclasses.replace(
        cal, slots=None, per_config={}, ramp_ctas=cal.ramp_ctas or 1.0, sm_bw=max(cal.sm_bw, 2.0 * cal.cta_bw)
    )
    if read_bandwidth:
        cal = dataclasses.replace(cal, hbm_bw=float(read_bandwidth))
    tiles = _prep(samples, dev)
    meas = np.array([s.time_s for s in samples])
    by_key: dict[str, list[int]] = {}
    for i, t in enumerate(tiles):
        by_key.setdefault(t.config_key, []).append(i)
    keys = [k for k, ix in sorted(by_key.items(), key=lambda kv: -len(kv[1])) if len(ix) >= min_samples]

    def loss_all(c: Calibration) -> float:
        return _loss(np.array([simulate_tiles(t, c) for t in tiles]), meas)

    # shared constants first (every config on them), then per config, then shared again
    cal, _ = _coord_search(cal, CONFIG_FIT_PARAMS + GLOBAL_FIT_PARAMS, loss_all, rounds=2)
    for _ in range(outer):
        for k in keys:
            ix = by_key[k]
            tk = [tiles[i] for i in ix]
            mk = meas[ix]
            cal, _ = _coord_search(
                cal,
                CONFIG_FIT_PARAMS,
                lambda c, tk=tk, mk=mk: _loss(np.array([simulate_tiles(t, c) for t in tk]), mk),
                rounds=rounds,
                key=k,
            )
        cal, _ = _coord_search(cal, GLOBAL_FIT_PARAMS, loss_all, rounds=2)
    return cal


def _stats(e: np.ndarray) -> dict[str, Any]:
    a = np.abs(e)
    if a.size == 0:
        return {"n": 0}
    return {
        "n": int(a.size),
        "median": float(np.median(a)),
        "p90": float(np.quantile(a, 0.9)),
        "worst": float(a.max()),
        "over_20pct": int((a > 0.2).sum()),
    }


def wave_class(plan: Plan, device: DeviceSpec | str = "NVIDIA H200") -> str:
    """``one_wave`` (tiles <= resident slots of the plan's config, or a persistent
    launch), ``partial_last_wave`` (more tiles than slots and the last wave at most
    half full) or ``full_waves`` (the rest)."""
    dev = resolve_device(device)
    t = prepare_tiles(plan, dev)
    slots = t.resident * dev.num_sms
    n = int(t.tile_bytes.shape[0])
    if t.persistent or n <= slots:
        return "one_wave"
    last = n % slots
    return "partial_last_wave" if 0 < last <= slots // 2 else "full_waves"


def error_table(samples: Sequence[SweepSample], pred: np.ndarray) -> dict[str, Any]:
    """Absolute relative errors ``|pred / measured - 1|``: overall, per set, per policy, per
    (set, policy), per :func:`wave_class` and per kernel config."""
    e = pred / np.array([s.time_s for s in samples]) - 1.0
    out: dict[str, Any] = {
        "all": _stats(e),
        "per_set": {},
        "per_policy": {},
        "per_set_policy": {},
        "per_wave": {},
        "per_config": {},
    }
    ka = np.array([config_key(s.plan.config) for s in samples])
    for k in sorted(set(ka.tolist())):
        out["per_config"][k] = _stats(e[ka == k])
    wa = np.array([wave_class(s.plan) for s in samples])
    for w in ("one_wave", "partial_last_wave", "full_waves"):
        out["per_wave"][w] = _stats(e[wa == w])
    sets = sorted({s.set for s in samples})
    pols = sorted({s.policy for s in samples})
    sa = np.array([s.set for s in samples])
    pa = np.array([s.policy for s in samples])
    for st in sets:
        out["per_set"][st] = _stats(e[sa == st])
    for p in pols:
        out["per_policy"][p] = _stats(e[pa == p])
    for st in sets:
        for p in pols:
            m = (sa == st) & (pa == p)
            if m.any():
                out["per_set_policy"][f"{st}/{p}"] = _stats(e[m])
    return out


def by_config(
    samples: Sequence[SweepSample], dev: DeviceSpec
) -> tuple[list[SimTiles], np.ndarray, list[tuple[str, list[int]]]]:
    """What a per-config fit (one config's constants refitted, the others kept) loops over: the samples'
    prepared tiles, their measured seconds, and ``(config key, sample indices)`` per kernel config, the configs
    with the most samples first (ties in first-seen order)."""
    tiles = _prep(samples, dev)
    meas = np.array([s.time_s for s in samples])
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(tiles):
        groups.setdefault(t.config_key, []).append(i)
    return tiles, meas, sorted(groups.items(), key=lambda kv: -len(kv[1]))


def error_summary(train: Mapping[str, Any], heldout: Mapping[str, Any]) -> dict[str, Any]:
    """The ``error`` object of a calibration document from two :func:`error_table` results: median and worst
    on the training and held-out plans, and held-out per set, per policy and per kernel config (with ``n``)."""

    def part(tab: Mapping[str, Any]) -> dict[str, Any]:
        return {k: {"n": v["n"], "median": v["median"], "worst": v["worst"]} for k, v in tab.items()}

    return {
        "train": {k: train["all"][k] for k in ("median", "worst")},
        "heldout": {k: heldout["all"][k] for k in ("median", "worst")},
        "heldout_per_set": part(heldout["per_set"]),
        "heldout_per_policy": part(heldout["per_policy"]),
        "heldout_per_config": part(heldout["per_config"]),
    }
