"""A tuning campaign: one GPU's policy table for one model shape, from an empty store (``kvsplit tune --campaign``).

Steps, each finished unit persisted before the next starts (so ``kill -9`` at any moment loses at most the unit
in flight, and the same command resumes):

1. **setup**: the buckets and their training / held-out batches (:func:`campaign_tasks`: every family of
   :data:`~kvsplit.tuner.workloads.FAMILIES` at each B of ``batch_sizes`` and T of ``totals``, and the buckets of
   every shipped trace at ``trace_batch_sizes``; one bucket per key); the calibration the simulator uses (the
   newest stored one of the GPU at the campaign's KV dtype and q_len, :func:`kvsplit.tuner.calibrate.stored_calibration`;
   on the GPU backend, without one of that shape, ``kvsplit calibrate``'s fit is run at that shape and stored
   first; on the simulator backend without one, the q_len-1 fit of the model's dtype, else the simulator's
   defaults for the GPU's :class:`~kvsplit.kernels.device.DeviceSpec`, labelled so and said).
2. **pool**: every candidate of :data:`~kvsplit.tuner.pool.SERVED_POOL`, as the shape's launch takes it
   (:func:`~kvsplit.tuner.pool.fitted_pool`: a two-head candidate at one head where two do not fit a work tile),
   timed on every training batch (one
   stored measurement per timing, stage ``pool``, one transaction per batch). The calibrated simulator prunes:
   a candidate it predicts slower than :data:`SIM_PRUNE_RATIO` x its best prediction on the batch is not timed.
3. **pick and allocation**: each bucket's pool pick (:func:`~kvsplit.tuner.pool.pick_per_key`: margin,
   neighbours within :data:`~kvsplit.tuner.pool.NEIGHBOUR_DISTANCE`, hysteresis against the table being
   replaced), and the number of Optuna trials per bucket from the budget left, weighted towards buckets whose
   best pool plan is far from the pool's default or whose neighbours pick another plan (:func:`allocate_trials`).
   Stored in the campaign's state.
4. **search**: per bucket, the bucket's Optuna study (:func:`kvsplit.tuner.search.tune_task`, TPE, exactly the
   allocated trials, ``--workers`` processes sharing it), warm-started with the pool pick and the next two pool
   plans restated in the ``tuned`` family (``add_trial`` with the pool's own timings when the restated plan is
   the candidate's on every training batch: not timed again; else ``enqueue_trial``) and the replaced table's
   plan (``enqueue_trial``).
5. **choice**: the pool pick, unless the study's best or the replaced plan beats it on the bucket's training
   batches by more than :data:`~kvsplit.tuner.pool.MARGIN` (:func:`~kvsplit.tuner.pool.choose_published`).
6. **whole-wave**: the whole-wave rule (``params.whole_wave``) is timed on the training batches and the
   near-even probe batches (:data:`WHOLE_WAVE_PROBE_BATCH_SIZES`) whose plan it changes, and enabled in each
   bucket where it wins on that bucket's own batches and probes
   (:func:`~kvsplit.tuner.pool.whole_wave_by_bucket`).
7. **verify and publish**: each bucket's choice against the baselines on its held-out batches
   (:func:`kvsplit.tuner.verify.verify_and_store`, with a tolerance of the margin), published under the store's
   rules: ``source: tuned`` (GPU backend) or ``simulated``.

The campaign's state (allocation, choices, finished buckets, time spent) is a study of the same Optuna storage
(:func:`campaign_name`). Time: on the GPU backend the wall time of the timing steps; on the simulator backend the
GPU time the same timings would take, modelled as :data:`SIM_SECONDS_PER_TIMING` per timed plan (the GPU
timer's 10 ms warm-up + 40 ms of replays + its graph capture), so a simulated campaign is deterministic.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..db import store
from ..kernels.buckets import distance
from ..kernels.device import resolve_device
from ..kernels.plan import make_plan
from .backends import BACKEND_NAMES, TimingBackend, make_backend
from .pool import (
    DEFAULT,
    MARGIN,
    NEIGHBOUR_DISTANCE,
    SERVED_POOL,
    WHOLE_WAVE_EPS,
    candidate_name,
    choose_published,
    fitted_pool,
    parse_candidate,
    pick_per_key,
    previous_picks,
    tuned_equivalent,
    whole_wave_by_bucket,
)
from .tasks import LIBRARY_TRACES, TuneTask, family_task, trace_tasks
from .workloads import FAMILIES, MODEL_SHAPES, family_kv_lens

__all__ = [
    "MODEL_SHAPES",
    "parse_model_shape",
    "CampaignConfig",
    "CampaignResult",
    "campaign_tasks",
    "campaign_name",
    "allocate_trials",
    "run_campaign",
    "SIM_SECONDS_PER_TIMING",
    "SIM_PRUNE_RATIO",
    "FAMILY_BATCH_SIZES",
    "TOTALS",
    "TRACE_BATCH_SIZES",
]

FAMILY_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOTALS = (262_144, 1_048_576)
TRACE_BATCH_SIZES = (8, 32, 128, 512, 1024)
SIM_SECONDS_PER_TIMING = 0.06
"""Modelled GPU seconds of one timed plan on the simulator backend (:meth:`kvsplit.tuner.gpu.GpuTimer.time_plan`:
10 ms warm-up, 40 ms of CUDA-graph replays, about 10 ms of capture and host work)."""
SIM_PRUNE_RATIO = 1.5
"""A pool candidate predicted slower than this multiple of the best prediction on a batch is not timed (the pool
holds plans whose worst training batch was within 1.36x of its best)."""
WHOLE_WAVE_VARIANTS = ({"whole_wave": WHOLE_WAVE_EPS}, {"whole_wave": WHOLE_WAVE_EPS, "whole_wave_heads": 2})
WHOLE_WAVE_PROBE_BATCH_SIZES = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
WHOLE_WAVE_PROBE_TOTALS = (393_216, 786_432)
"""The whole-wave step's probe batches: B requests of exactly T / B tokens each, at totals between the training
totals (no evaluation batch has them). The rule acts only on near-even batches (their longest request within
:data:`~kvsplit.tuner.pool.WHOLE_WAVE_EPS` of an even share), and the training draws, jittered by +-10 %, are
never that even (a Qwen3-30B-A3B campaign's 123 training batches: the rule changed the plan of none), so
without these the campaign could not see the batches the rule exists for. Each probe is timed with the chosen
params of its nearest bucket; only probes whose plan the rule changes are timed (with H_kv 4: B = 64-256)."""
SEARCH_TRIAL_COST = 2.2
"""Seconds of a timed search trial per second of a pool timing and training batch, before the campaign has
measured its own: on one H200 (Qwen3-30B-A3B shape, cold Triton cache) 0.245 s per timed trial with the kernels
compiled ahead, against 0.11 s per pool timing."""
RESIZE_EVERY = 25
"""On the GPU backend, the allocation of the buckets not yet searched is fitted to the budget left every this many
timed search trials (at the slice's measured seconds per trial)."""
SIM_WINDOW = 4
"""Studies in flight at once in a one-process search on the simulator backend (the GPU backend keeps twice its
compile helpers in flight, :func:`kvsplit.tuner.precompile.default_compile_workers`)."""
EXIT_PAUSED = 75
"""Exit status of a campaign that stopped at ``--max-minutes`` with work left (EX_TEMPFAIL: run it again)."""


def parse_model_shape(text: str) -> tuple[int, int, int]:
    """``(H_q, H_kv, head_dim)`` of a preset name (:data:`MODEL_SHAPES`) or of ``"H_q/H_kv/head_dim"``.
    Raises ValueError naming ``--model-shape``."""
    t = str(text).strip().lower()
    if t in MODEL_SHAPES:
        return MODEL_SHAPES[t]
    parts = t.split("/")
    try:
        hq, hkv, d = (int(x) for x in parts)
    except ValueError:
        raise ValueError(
            f"--model-shape: expected one of {sorted(MODEL_SHAPES)} or H_q/H_kv/head_dim (e.g. 32/4/128), got {text!r}"
        ) from None
    if min(hq, hkv, d) < 1 or hq % hkv:
        raise ValueError(f"--model-shape: H_q must be a positive multiple of H_kv, got {text!r}")
    return hq, hkv, d


@dataclass(frozen=True)
class CampaignConfig:
    """What a campaign builds and how (``kvsplit tune --campaign``'s flags)."""

    database_url: str
    gpu: str = "NVIDIA H200"
    num_qo_heads: int = 32
    num_kv_heads: int = 4
    head_dim: int = 128
    dtype: str = "bfloat16"
    page_size: int = 16
    kv_dtype: str | None = None  # the KV cache's dtype when not dtype (float8_e4m3fn): another bucket family
    q_len: int = 1  # query tokens per request (a verify step): another bucket family
    backend: str = "sim"
    budget_minutes: float = 15.0
    max_minutes: float | None = None
    seed: int = 0
    workers: int = 1
    journal: str | None = None
    families: tuple[str, ...] = FAMILIES
    batch_sizes: tuple[int, ...] = FAMILY_BATCH_SIZES
    totals: tuple[int, ...] = TOTALS
    traces: tuple[str, ...] = LIBRARY_TRACES
    trace_batch_sizes: tuple[int, ...] = TRACE_BATCH_SIZES
    num_train: int = 1
    num_heldout: int = 1
    max_trials: int = 48
    pool: tuple[str, ...] = SERVED_POOL
    previous: Mapping[str, Any] | None = None  # a policies export: the table being replaced
    publish: bool = True
    progress: bool = False

    def __post_init__(self) -> None:
        if self.backend not in BACKEND_NAMES:
            raise ValueError(f"--backend: expected one of {BACKEND_NAMES}, got {self.backend!r}")
        if not (self.budget_minutes > 0 and math.isfinite(self.budget_minutes)):
            raise ValueError(f"--budget-minutes: expected minutes > 0, got {self.budget_minutes!r}")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError(f"--max-minutes: expected minutes > 0, got {self.max_minutes!r}")
        for name in ("num_train", "num_heldout", "max_trials", "workers"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"--{name.replace('_', '-')}: expected an integer >= 1, got {v!r}")
        for name in self.pool:
            parse_candidate(name)
        if DEFAULT not in self.pool:
            raise ValueError(f"pool: must hold the default {DEFAULT!r}")
        if not (self.batch_sizes and self.totals and self.families) and not (self.traces and self.trace_batch_sizes):
            raise ValueError("--batch-sizes/--totals/--traces: the campaign has no training batch")

    def identity(self) -> dict[str, Any]:
        """Everything that decides the campaign's result (not where it is stored nor how fast it runs)."""
        keep = (
            "gpu",
            "num_qo_heads",
            "num_kv_heads",
            "head_dim",
            "dtype",
            "page_size",
            "backend",
            "budget_minutes",
            "seed",
            "families",
            "batch_sizes",
            "totals",
            "traces",
            "trace_batch_sizes",
            "num_train",
            "num_heldout",
            "max_trials",
            "pool",
        )
        out = {k: getattr(self, k) for k in keep}
        out["rules"] = {  # what the choice depends on
            "margin": MARGIN,
            "neighbour_distance": NEIGHBOUR_DISTANCE,
            "whole_wave_probes": [WHOLE_WAVE_PROBE_BATCH_SIZES, WHOLE_WAVE_PROBE_TOTALS],
            "whole_wave_scope": "bucket",
        }
        out["gpu"] = resolve_device(self.gpu).name
        # only when not the defaults, so the identity (and state study) of a 16-bit q_len-1 campaign stays as it was
        if self.kv_dtype is not None and self.kv_dtype != self.dtype:
            out["kv_dtype"] = self.kv_dtype
        if self.q_len != 1:
            out["q_len"] = self.q_len
        out["previous"] = (
            hashlib.sha256(json.dumps(self.previous, sort_keys=True, default=str).encode()).hexdigest()[:12]
            if self.previous
            else None
        )
        return json.loads(json.dumps(out))

    @property
    def shape(self) -> dict[str, Any]:
        """The campaign's shape as a dict: ``gpu``, ``num_qo_heads``, ``num_kv_heads``, ``head_dim``, ``dtype``,
        ``page_size`` (part of the campaign's identity)."""
        return dict(
            gpu=self.gpu,
            num_qo_heads=self.num_qo_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            dtype=self.dtype,
            page_size=self.page_size,
            kv_dtype=self.kv_dtype,
            q_len=self.q_len,
        )


def campaign_name(cfg: CampaignConfig) -> str:
    """``kvsplit-campaign-<backend>-<12 hex digits of the identity>``: the campaign's state study."""
    h = hashlib.sha256(json.dumps(cfg.identity(), sort_keys=True).encode()).hexdigest()[:12]
    return f"kvsplit-campaign-{cfg.backend}-{h}"


def campaign_tasks(cfg: CampaignConfig) -> list[TuneTask]:
    """The campaign's buckets (one :class:`TuneTask` per key, the first source of a key wins): families x
    ``batch_sizes`` x ``totals`` (the combinations a family can form), then the traces' buckets at ``trace_batch_sizes``; ``num_train`` /
    ``num_heldout`` jittered draws each (held-out draws are never trained on)."""
    shape = dict(cfg.shape, num_train=cfg.num_train, num_heldout=cfg.num_heldout, seed=cfg.seed)
    tasks: dict[str, TuneTask] = {}
    for T in cfg.totals:
        for fam in cfg.families:
            for B in cfg.batch_sizes:
                try:
                    family_kv_lens(fam, int(B), int(T))
                except ValueError:  # a family this B cannot form (2x40 at B = 2): no such batch
                    continue
                t = family_task(fam, int(B), int(T), **shape)
                tasks.setdefault(t.key, t)
    for tr in cfg.traces:
        for t in trace_tasks(tr, batch_sizes=tuple(cfg.trace_batch_sizes), **shape):
            tasks.setdefault(t.key, t)
    return list(tasks.values())


def allocate_trials(
    weights: Mapping[str, float], seconds: float, seconds_per_trial: Mapping[str, float], *, cap: int
) -> dict[str, int]:
    """Optuna trials per bucket: ``seconds`` shared in proportion to ``weights``, each bucket's share divided by
    its cost per trial, at least 1 (the warm start's pool pick) and at most ``cap``. Buckets capped below their
    share hand the rest to the others (water filling). Returns ``{key: trials}``."""
    keys = list(weights)
    out = {k: 1 for k in keys}
    left = max(0.0, float(seconds) - sum(seconds_per_trial[k] for k in keys))
    open_ = [k for k in keys if cap > 1]
    while left > 0 and open_:
        w = sum(weights[k] for k in open_)
        spent = 0.0
        nxt = []
        for k in open_:
            add = int(left * weights[k] / w / seconds_per_trial[k])
            add = min(add, cap - out[k])
            out[k] += add
            spent += add * seconds_per_trial[k]
            if out[k] < cap:
                nxt.append(k)
        if spent <= 0:
            break
        left -= spent
        open_ = nxt
    return out


@dataclass
class CampaignResult:
    """What :func:`run_campaign` did."""

    name: str
    status: str  # finished | paused | interrupted
    buckets: int
    published: int = 0
    spent_s: float = 0.0  # GPU (or modelled GPU) seconds of the whole campaign so far
    time_kind: str = "gpu"  # gpu | simulated
    wall_s: float = 0.0  # this invocation
    timings: int = 0  # plans timed by this invocation
    calibration: str = ""
    whole_wave: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The result as a JSON-able dict of its fields (what ``kvsplit tune --campaign --json`` prints)."""
        return dataclasses.asdict(self)


class _State:
    """The campaign's persisted state: user attributes of its study in the Optuna storage."""

    def __init__(self, study) -> None:
        self.study = study
        self._attrs = dict(study.user_attrs)

    def get(self, key: str, default: Any = None) -> Any:
        return self._attrs.get(key, default)

    def set(self, key: str, value: Any) -> None:
        self.study.set_user_attr(key, value)
        self._attrs[key] = value


def _canon(params: Mapping[str, Any]) -> str:
    return json.dumps({k: (float(v) if isinstance(v, float) else v) for k, v in params.items()}, sort_keys=True)


class _Campaign:
    def __init__(self, cfg: CampaignConfig, stop, say: Callable[[str], None], bar) -> None:
        from .search import storage_spec

        self.cfg = cfg
        self.stop = stop
        self.say = say
        self.bar = bar
        self.url = store.resolve_url(cfg.database_url)
        self.spec = storage_spec(self.url, journal=cfg.journal, workers=cfg.workers)
        self.name = campaign_name(cfg)
        # the candidates as this shape's launch takes them (two-head ones refitted where two heads' rows do not fit)
        self.pool = fitted_pool(cfg.pool, cfg.num_qo_heads, cfg.num_kv_heads, cfg.q_len)
        self.t0 = time.time()
        self.timings = 0
        self.result = CampaignResult(self.name, "finished", 0, time_kind="gpu" if cfg.backend == "gpu" else "simulated")

    # time ---------------------------------------------------------------------------------------------------
    def charge(self, n_timings: int, wall_s: float) -> None:
        self.timings += n_timings
        cost = wall_s if self.cfg.backend == "gpu" else n_timings * SIM_SECONDS_PER_TIMING
        self.state.set("spent_s", float(self.state.get("spent_s", 0.0)) + cost)
        self.state.set("timings_total", int(self.state.get("timings_total", 0)) + int(n_timings))
        self.bar.advance_overall(cost)
        self.bar.retotal(self.projected_s())

    def projected_s(self) -> float:
        """The campaign's GPU (or modelled GPU) seconds in all, as far as they can be told now, at most the
        budget: the budget until the search's trials are allocated; then what is spent, plus the allocated trials
        of the buckets not yet searched at the search's measured seconds per trial (before it is measured, the
        pool's seconds per timing x :data:`SEARCH_TRIAL_COST` on the GPU), plus the whole-wave and verification
        steps (:meth:`_rest_estimate`). Trials a study already has from an earlier run are counted as to come."""
        alloc = self.state.get("alloc")
        if alloc is None or not hasattr(self, "by_key"):
            return self.budget_s
        searched = set(self.state.get("searched") or [])
        left = sum(
            int(n) * self._search_trial_s(self.by_key[k])
            for k, n in alloc.items()
            if k not in searched and k in self.by_key
        )
        return min(self.budget_s, self.spent + left + self._rest_estimate())

    def _search_trial_s(self, task: TuneTask) -> float:
        """Seconds of one search trial of ``task``: the search's measured figure (stored by a slice), else the
        pool's seconds per timing x the task's training batches x :data:`SEARCH_TRIAL_COST` (GPU backend; 1 on
        the simulator, whose modelled time per timing is fixed)."""
        per = self.state.get("search_s_per_trial")
        if per:
            return float(per)
        cost = SEARCH_TRIAL_COST if self.cfg.backend == "gpu" else 1.0
        return len(task.train) * self._seconds_per_timing() * cost

    @property
    def spent(self) -> float:
        return float(self.state.get("spent_s", 0.0))

    @property
    def budget_s(self) -> float:
        return self.cfg.budget_minutes * 60.0

    def out_of_slice(self) -> bool:
        if self.stop is not None and self.stop.is_set():
            self.result.status = "interrupted"
            return True
        if self.cfg.max_minutes is not None and time.time() - self.t0 >= self.cfg.max_minutes * 60.0:
            self.result.status = "paused"
            return True
        return False

    # steps --------------------------------------------------------------------------------------------------
    def open_state(self) -> None:
        from .study import load_study, open_storage

        study = load_study(self.spec, self.name, self.cfg.seed, 1, storage=open_storage(self.spec))
        self.state = _State(study)
        if self.state.get("identity") is None:
            self.state.set("identity", self.cfg.identity())
        elif not self.state.get("finished"):
            spent = (
                f"{self.spent:.0f} of {self.budget_s:.0f} s of the GPU budget spent"
                if self.spent <= self.budget_s
                else f"GPU time {self.spent:.0f} s spent, over the {self.budget_s:.0f} s budget"
            )
            self.say(f"resuming {self.name}: {spent}; finished steps and stored timings are not repeated")
        self.bar.start_overall(self.budget_s, self.spent)

    def setup(self) -> None:
        cfg = self.cfg
        self.tasks = campaign_tasks(cfg)
        self.by_key = {t.key: t for t in self.tasks}
        self.result.buckets = len(self.tasks)
        from .search import calibration_for, calibration_note, describe_calibration, task_bucket

        with store.session_scope(self.url, write=True) as s:
            self.bucket_ids = {}
            for t in self.tasks:
                self.bucket_ids[t.key] = task_bucket(s, t).id
        # room for the campaign's batches and for the calibration sample (kvsplit calibrate's sizes)
        self.max_tokens = max(max(t.max_tokens for t in self.tasks), 300_000)
        self.max_batch = max(max(t.max_batch for t in self.tasks), 512)
        shape = self.tasks[0].shape
        # the calibration of the campaign's GPU, KV dtype and q_len (kvsplit.tuner.calibrate.stored_calibration)
        cal_kw = dict(dtype=shape.dtype, kv_dtype=shape.kv_dtype, q_len=shape.q_len)
        if cfg.backend == "gpu":
            self.backend = make_backend("gpu", shape=shape, max_tokens=self.max_tokens, max_batch=self.max_batch)
            cal, _ = calibration_for(self.url, shape.gpu, "sim", **cal_kw)
            if cal is None or cal["note"]:  # none of this KV dtype and q_len: time the sample at this shape
                from .calibrate import calibrate

                t0 = time.time()
                self.say(
                    f"calibrating {shape.gpu} for KV {shape.kv_dtype}, q_len {shape.q_len} (no calibration of "
                    "this shape stored)"
                )
                rep = calibrate(
                    self.backend,
                    gpu=shape.gpu,
                    num_kv_heads=cfg.num_kv_heads,
                    head_dim=cfg.head_dim,
                    dtype=shape.dtype,
                    page_size=cfg.page_size,
                    seed=cfg.seed,
                    database_url=self.url,
                    kv_dtype=None if shape.kv_dtype == shape.dtype else shape.kv_dtype,
                    q_len=shape.q_len,
                    num_qo_heads=shape.num_qo_heads,
                )
                self.charge(len(rep["samples"]), time.time() - t0)
            cal, bw = calibration_for(self.url, shape.gpu, "sim", **cal_kw)
        else:
            cal, bw = calibration_for(self.url, shape.gpu, "sim", **cal_kw)
            self.backend = make_backend("sim", shape=shape, calibration=cal, read_bandwidth_gbps=bw)
        note = calibration_note(self.url, self.tasks[0], "sim")
        if note:
            self.say(note)
        # the simulator that prunes (on the simulator backend: the backend itself)
        self.sim = make_backend("sim", shape=shape, calibration=cal, read_bandwidth_gbps=bw)
        self.sim_calibration = (cal, bw)
        self.result.calibration = describe_calibration(cal, bw, shape.gpu)
        with store.session_scope(self.url, write=True) as s:
            info = self.backend.device_info()
            dev = store.get_or_create_device(
                s,
                name=info["name"],
                num_sms=info["num_sms"],
                hbm_bandwidth_gbps=info["hbm_bandwidth_gbps"],
                software=self.backend.software(),
                read_bandwidth_gbps=info.get("read_bandwidth_gbps"),
            )
            self.device_id = dev.id
        if self.state.get("previous") is None:  # the table being replaced, as the campaign first saw it
            self.state.set("previous", self._previous_params())

    def _previous_params(self) -> dict[str, dict[str, Any]]:
        """Bucket key -> the tuned-family params of the plan the replaced table serves for it: ``--previous``'s
        export, else the store's published policy of the key (before the campaign publishes anything)."""
        from .space import complete_defaults

        out: dict[str, dict[str, Any]] = {}
        entries: dict[str, tuple[str, dict]] = {}
        if self.cfg.previous is not None:
            for p in self.cfg.previous["policies"]:
                entries[p["bucket"]["key"]] = (p["name"], dict(p["params"]))
        else:
            with store.session_scope(self.url) as s:
                for t in self.tasks:
                    p = store.get_published(s, t.key)
                    if p is not None:
                        entries[t.key] = (p.name, dict(p.params))
        for key, (name, params) in entries.items():
            task = self.by_key.get(key)
            if task is None:
                continue
            params = {k: v for k, v in params.items() if k not in ("whole_wave", "whole_wave_heads")}
            if name == "tuned":
                out[key] = complete_defaults(task, params)
            else:
                cand = candidate_name(name, params)
                if cand is not None and name in ("stream_k", "balanced"):
                    out[key] = complete_defaults(task, tuned_equivalent(cand))
        return out

    def pool_phase(self) -> bool:
        """Time the pool on every training batch not yet timed (with ``workers`` processes, batch j on worker
        ``j % workers``). Returns False when the slice ended first."""
        done: set[tuple[int, int]] = set()
        with store.session_scope(self.url) as s:
            for m in store.list_measurements(s, stage="pool"):
                if m.backend == self.cfg.backend:
                    done.add((m.bucket_id, m.batch_index))
        todo = [(t, i) for t in self.tasks for i in range(len(t.train)) if (self.bucket_ids[t.key], i) not in done]
        total = sum(len(t.train) for t in self.tasks)
        est = len(todo) * len(self.pool) * self._seconds_per_timing()
        if todo and self.spent + est > self.budget_s:
            if len(todo) == total:
                need = (
                    f"the pool step alone needs about {est / 60:.1f} of the {self.cfg.budget_minutes:g} budget minutes"
                )
            else:  # a resumed slice: what is left of the step, and what earlier slices spent
                need = (
                    f"the pool step's remaining batches need about {est / 60:.1f} more GPU-minutes, "
                    f"after {self.spent / 60:.1f} of the {self.cfg.budget_minutes:g} budget minutes spent"
                )
            msg = (
                f"{need} ({len(todo)} batches x {len(self.pool)} plans): the campaign will overrun its budget; "
                "give more --budget-minutes or fewer --batch-sizes/--totals/--traces"
            )
            self.say(msg)
            self.result.lines.append(msg)
        self.bar.phase("pool", total, total - len(todo))
        if self.cfg.workers > 1 and len(todo) > 1:
            return self._pool_parallel(todo, total - len(todo))
        sw = self.backend.software()
        for t, i in todo:
            if self.out_of_slice():
                return False
            t0 = time.time()
            rows = _time_pool_batch(t, t.train[i], self.pool, self.backend, self.sim)
            _record_pool(self.url, self.bucket_ids[t.key], t.train[i], i, rows, self.cfg.backend, self.device_id, sw)
            self.charge(len(rows), time.time() - t0)
            self.bar.step()
        return True

    def _run_processes(self, procs: list, tick: Callable[[], None] | None = None) -> tuple[float, Any]:
        """Start the worker processes ``procs`` (this process's store engines closed first), wait for them
        (``tick()`` every 0.25 s), terminate them once the campaign's stop is set, join them all; returns the wall
        seconds and the stop."""
        from .search import Stop

        store.dispose_engines()
        t0 = time.time()
        for p in procs:
            p.start()
        stop = self.stop or Stop()
        try:
            while any(p.is_alive() for p in procs):
                if tick is not None:
                    tick()
                if stop.is_set():
                    for p in procs:
                        if p.is_alive():
                            p.terminate()
                procs[0].join(timeout=0.25)
        finally:
            for p in procs:
                p.join()
        return time.time() - t0, stop

    def _pool_parallel(self, todo: list, done0: int) -> bool:
        import multiprocessing as mp

        if self.out_of_slice():
            return False
        deadline = self.t0 + self.cfg.max_minutes * 60.0 if self.cfg.max_minutes is not None else None
        cal, bw = self.sim_calibration
        with store.session_scope(self.url) as s:
            last = max((m.id for m in store.list_measurements(s, stage="pool")), default=0)
        items = [(t, i, self.bucket_ids[t.key]) for t, i in todo]
        K = self.cfg.workers
        ctx = mp.get_context("spawn")
        procs = [
            ctx.Process(
                target=_pool_worker,
                name=f"kvsplit-pool-{k}",
                args=(
                    items[k::K],
                    k,
                    self.url,
                    self.cfg.backend,
                    tuple(self.pool),
                    cal,
                    bw,
                    self.device_id,
                    self.max_tokens,
                    self.max_batch,
                    deadline,
                ),
            )
            for k in range(K)
        ]
        wall, stop = self._run_processes(procs)
        with store.session_scope(self.url) as s:
            ids = {b for _, _, b in items}
            new = [
                m
                for m in store.list_measurements(s, stage="pool")
                if m.id > last and m.bucket_id in ids and m.backend == self.cfg.backend
            ]
            left = {(m.bucket_id, m.batch_index) for m in new}
        self.charge(len(new), wall * K)  # K GPUs busy for the wall time
        finished = sum(1 for _, i, b in items if (b, i) in left)
        self.bar.set(done0 + finished)
        if finished < len(items):
            bad = [p.exitcode for p in procs if p.exitcode not in (0, 130)]
            if bad and not stop.is_set():
                raise RuntimeError(f"campaign pool workers exited with codes {bad}")
            self.result.status = "interrupted" if stop.is_set() else "paused"
            return False
        return True

    def pool_timings(self) -> dict[str, list[dict[str, float]]]:
        by_id = {v: k for k, v in self.bucket_ids.items()}
        out: dict[str, dict[int, dict[str, float]]] = {}
        with store.session_scope(self.url) as s:
            for m in store.list_measurements(s, stage="pool"):
                key = by_id.get(m.bucket_id)
                if key is not None and m.backend == self.cfg.backend:
                    out.setdefault(key, {}).setdefault(m.batch_index, {})[m.policy_name] = float(m.time_s)
        return {k: [v[i] for i in sorted(v)] for k, v in out.items()}

    def plan_search(self) -> None:
        """Pool picks, warm starts and the trials per bucket (once; stored)."""
        if self.state.get("alloc") is not None:
            return
        timings = self.pool_timings()
        prev_names = {}
        if self.cfg.previous is not None:
            prev_names = previous_picks(self.cfg.previous, self.pool)
        picks = pick_per_key(timings, pool=self.pool, previous=prev_names)
        weights, starts = {}, {}
        timings = {k: v for k, v in timings.items() if k in picks}
        for key, ts in timings.items():
            names = [k for k in self.pool if all(t.get(k) for t in ts)]
            best_of = [min(t[n] for n in names) for t in ts]
            score = {k: math.exp(sum(math.log(t[k] / b) for t, b in zip(ts, best_of)) / len(ts)) for k in names}
            spread = score.get(DEFAULT, max(score.values())) - 1.0
            disagree = any(
                picks[k2] != picks[key] for k2 in picks if k2 != key and distance(key, k2) <= NEIGHBOUR_DISTANCE
            )
            weights[key] = 1.0 + 20.0 * min(spread, 0.5) + (1.0 if disagree else 0.0)
            ranked = sorted(names, key=lambda k: (score[k], k))
            starts[key] = [picks[key]] + [k for k in ranked if k != picks[key]][:2]
        per_trial = {k: len(self.by_key[k].train) * self._seconds_per_timing() for k in timings}
        heldout = sum(len(t.heldout) for t in self.tasks) * 5 * self._seconds_per_timing()
        whole_wave = (
            sum(len(t.train) for t in self.tasks) * 2 * len(WHOLE_WAVE_VARIANTS) + self._probe_timings()
        ) * self._seconds_per_timing()
        left = self.budget_s - self.spent - heldout - whole_wave
        alloc = allocate_trials(weights, left, per_trial, cap=self.cfg.max_trials)
        self.state.set("picks", picks)
        self.state.set("starts", starts)
        self.state.set("alloc", alloc)
        self.bar.retotal(self.projected_s())
        room = (
            f"{left / 60:.1f} min left for the search at {self._seconds_per_timing() * 1e3:.0f} ms per timing"
            if left > 0
            else "no budget left for new trials: each bucket's study holds the pool step's timings of its warm "
            "starts (the pool pick and the next two pool plans) and runs no new trial"
        )
        self.say(f"pool picks for {len(picks)} buckets; {sum(alloc.values())} Optuna trials allocated ({room})")

    def _rest_estimate(self) -> float:
        """Estimated seconds of the whole-wave and verification steps still to run."""
        n = sum(
            len(t.train) * 2 * len(WHOLE_WAVE_VARIANTS) + len(t.heldout) * 5
            for t in self.tasks
            if t.key not in (self.state.get("verified") or {})
        )
        if self.state.get("whole_wave") is None:
            n += self._probe_timings()
        return n * self._seconds_per_timing()

    def _seconds_per_timing(self) -> float:
        n = int(self.state.get("timings_total", 0))
        if self.cfg.backend != "gpu" or n == 0:
            return SIM_SECONDS_PER_TIMING
        return self.spent / n

    def _prepared_study(self, key: str):
        """The bucket's study with the campaign's warm starts enqueued (once)."""
        from .space import complete_defaults
        from .study import load_study, open_storage, study_name

        task, n = self.by_key[key], int(self.state.get("alloc")[key])
        starts, previous = self.state.get("starts"), self.state.get("previous") or {}
        study = load_study(
            self.spec, study_name(task, self.cfg.backend), self.cfg.seed, n, storage=open_storage(self.spec)
        )
        if not study.user_attrs.get("kvsplit:campaign_starts"):
            warm = {"pool": complete_defaults(task, tuned_equivalent(starts[key][0]))}
            if key in previous:
                warm["previous"] = previous[key]
            for i, cand in enumerate(starts[key][1:]):
                warm[f"pool{i + 2}"] = complete_defaults(task, tuned_equivalent(cand))
            names = dict(zip(("pool", "pool2", "pool3"), starts[key]))
            seeded = {t.user_attrs.get("kvsplit:from_pool") for t in study.get_trials(deepcopy=False)}
            for label, params in warm.items():
                if names.get(label) in seeded:
                    continue
                trial = self._pool_trial(task, names.get(label), params)
                if trial is not None:  # the pool timed this very plan on every training batch: not timed again
                    study.add_trial(trial)
                else:
                    study.enqueue_trial(params, skip_if_exists=True)
            study.set_user_attr("kvsplit:campaign_starts", warm)
        return study

    def _pool_trial(self, task: TuneTask, name: str | None, params: Mapping[str, Any]):
        """A finished Optuna trial of ``params`` whose value is the pool's timings of candidate ``name`` on the
        task's training batches (the objective of :func:`kvsplit.tuner.worker.objective_value`), or None when the
        pool did not time it on every batch or its tuned-family plan differs from the candidate's on one."""
        import optuna

        from .worker import task_params

        if name is None:
            return None
        if not hasattr(self, "_pool_rows"):
            self._pool_rows = self._pool_measurements()
        rows = self._pool_rows.get(task.key, {})
        times, ratios = [], []
        policy, cparams = parse_candidate(name)
        for i, lens in enumerate(task.train):
            got = rows.get((i, name))
            if got is None:
                return None
            try:
                a = make_plan(list(lens), policy=policy, params=cparams, **task.plan_kwargs)
                b = self._plan(task, lens, task_params(task, params))
            except ValueError:
                return None
            if a.work_key() != b.work_key():
                return None
            times.append(got[0])
            ratios.append(got[0] / got[1])
        value = math.exp(sum(map(math.log, times)) / len(times))
        return optuna.trial.create_trial(
            params=dict(params),
            distributions=_distributions(params),
            value=value,
            user_attrs={"geomean_ratio": math.exp(sum(map(math.log, ratios)) / len(ratios)), "kvsplit:from_pool": name},
        )

    def _pool_measurements(self) -> dict[str, dict[tuple[int, str], tuple[float, float]]]:
        by_id = {v: k for k, v in self.bucket_ids.items()}
        out: dict[str, dict[tuple[int, str], tuple[float, float]]] = {}
        with store.session_scope(self.url) as s:
            for m in store.list_measurements(s, stage="pool"):
                key = by_id.get(m.bucket_id)
                if key is not None and m.backend == self.cfg.backend and m.floor_s:
                    out.setdefault(key, {})[(m.batch_index, m.policy_name)] = (float(m.time_s), float(m.floor_s))
        return out

    def _tune_config(self, n: int):
        from .search import TuneConfig

        return TuneConfig(
            database_url=self.url,
            n_trials=n,
            backend=self.cfg.backend,
            workers=self.cfg.workers,
            journal=self.cfg.journal,
            seed=self.cfg.seed,
            progress=False,
            verify=False,
            publish=False,
        )

    def search_phase(self) -> bool:
        """Each bucket's Optuna study to its allocated trials: in this process with one worker; else with
        ``workers`` processes, each going through every bucket in the same order (one per GPU of the host)."""
        alloc = self.state.get("alloc")
        searched = list(self.state.get("searched", []))
        keys = [t.key for t in self.tasks if t.key in alloc]
        self.bar.phase("search", len(keys), len(searched))
        todo = [k for k in keys if k not in searched]
        if self.cfg.workers > 1:
            return self._search_parallel(todo, searched)
        return self._search_interleaved(todo, searched)

    def _search_interleaved(self, todo: list[str], searched: list[str]) -> bool:
        """One process: the buckets' studies interleaved (:func:`kvsplit.tuner.worker.run_interleaved`), each
        study sequential as if alone; on the GPU backend, the trials' Triton kernels compiled ahead by helper
        processes (:class:`kvsplit.tuner.precompile.KernelCompiler`) while the GPU times other trials. The GPU
        time charged is the phase's wall time (compile waits included), charged after every trial."""
        from .search import Stop, open_run_study, record_run, run_result, start_run
        from .study import study_name
        from .worker import WorkerJob, run_interleaved

        if not todo:
            return True
        if self.out_of_slice():
            return False
        alloc = dict(self.state.get("alloc"))
        gpu = self.cfg.backend == "gpu"
        stop = self.stop or Stop()
        rest = self._rest_estimate()
        runs: dict[str, tuple[Any, Any]] = {}
        count: dict[str, int] = {}
        opened: set[str] = set()
        rate = [time.time(), 0]  # this slice's search: start, timed trials
        last = [time.time()]
        over_budget = [False]

        def job_of(key: str) -> WorkerJob:
            opened.add(key)
            task = self.by_key[key]
            return WorkerJob(
                task=task,
                storage=self.spec,
                study=study_name(task, self.cfg.backend),
                n_trials=int(alloc[key]),
                backend=self.cfg.backend,
                seed=self.cfg.seed,
            )

        def prepare(job: WorkerJob) -> None:
            # the campaign's warm starts first, then the study's own (baselines), as tune_task opened it
            self._prepared_study(job.task.key)
            run = start_run(job.task, self._tune_config(job.n_trials), self.backend)
            study = open_run_study(run)
            runs[job.task.key] = (run, study)
            count[job.task.key] = _finished(study)

        def charge(n_timings: int) -> None:
            now = time.time()
            if gpu or n_timings:
                self.charge(n_timings, now - last[0])
            last[0] = now

        def may_ask() -> bool:
            if self.out_of_slice():
                return False
            if gpu and self.spent + (time.time() - last[0]) + rest >= self.budget_s:
                over_budget[0] = True  # the allocation was an estimate: the budget left bounds the search
                return False
            return True

        def on_trial(job: WorkerJob, measured: bool) -> None:
            charge(len(job.task.train) if measured else 0)
            count[job.task.key] += 1
            self.bar.bucket(job.task.source, job.n_trials, count[job.task.key])
            if gpu and measured:
                rate[1] += 1
                if rate[1] % RESIZE_EVERY == 0:
                    resize()

        def resize(per_trial: float | None = None) -> None:
            """Fit the buckets not yet opened to the budget left at the search's seconds per timed trial (this
            slice's measured figure, stored for the next slice; the allocation assumed the pool step's seconds
            per timing, and a search trial also asks Optuna and may wait for a compile): each keeps the same
            share, at least one trial."""
            if per_trial is None:
                per_trial = (time.time() - rate[0]) / rate[1]
                self.state.set("search_s_per_trial", per_trial)
            closed = [k for k in todo if k not in opened]
            want = sum(int(alloc[k]) for k in closed)
            in_flight = sum(max(0, int(alloc[k]) - count.get(k, 0)) for k in opened if k not in searched)
            room = self.budget_s - self.spent - rest - in_flight * per_trial
            if not closed or want * per_trial <= room:
                return
            f = max(0.0, room) / (want * per_trial)
            for k in closed:
                alloc[k] = max(1, int(int(alloc[k]) * f))
            self.state.set("alloc", alloc)

        def on_done(job: WorkerJob) -> None:
            run, study = runs.pop(job.task.key)
            record_run(run, run_result(run, study, stop))
            searched.append(job.task.key)
            self.state.set("searched", searched)
            self.bar.step()

        if gpu:  # before any study opens: at the last slice's measured rate, else the pool's times SEARCH_TRIAL_COST
            resize(max(self._search_trial_s(self.by_key[k]) for k in todo))
        compiler = None
        if gpu:
            from .precompile import KernelCompiler

            compiler = KernelCompiler()
        window = 2 * compiler.workers if compiler is not None else SIM_WINDOW
        status = None
        try:
            # a SQLite store's tuning lock is held by run_campaign for the whole campaign
            run_interleaved(
                (job_of(k) for k in todo),
                backend=self.backend,
                stop=stop,
                window=window,
                prepare=prepare,
                compile_ahead=compiler.submit_job if compiler is not None else None,
                may_ask=may_ask,
                on_trial=on_trial,
                on_done=on_done,
            )
        except BaseException as exc:
            status = ("interrupted" if isinstance(exc, KeyboardInterrupt) else "failed", f"{type(exc).__name__}: {exc}")
            raise
        finally:
            charge(0)
            if compiler is not None:
                compiler.close()
            for run, study in runs.values():  # studies left unfinished by the slice, the budget, a stop or an error
                res = run_result(run, study, stop)
                if status is not None:
                    res.status, res.message = status[0], status[1][:2000]
                record_run(run, res)
        if stop.is_set():
            self.result.status = "interrupted"
            return False
        left = [k for k in todo if k not in searched]
        if not left:
            return True
        if not over_budget[0]:  # the slice ended (--max-minutes): the next one resumes the studies
            if self.result.status == "finished":
                self.result.status = "paused"
            return False
        # out of budget: each bucket keeps the trials it has (the warm starts at least), none is searched further
        from .study import load_study, open_storage

        for key in left:
            if key not in runs:
                self._prepared_study(key)
            study = load_study(
                self.spec,
                study_name(self.by_key[key], self.cfg.backend),
                self.cfg.seed,
                1,
                storage=open_storage(self.spec),
            )
            alloc[key] = _finished(study)
            searched.append(key)
        self.state.set("alloc", alloc)
        self.state.set("searched", searched)
        self.bar.set(len(searched))
        return True

    def _search_parallel(self, todo: list[str], searched: list[str]) -> bool:
        import multiprocessing as mp

        from .search import open_run_study, record_run, run_result, start_run
        from .worker import WorkerJob

        if not todo:
            return True
        if self.out_of_slice():
            return False
        alloc = self.state.get("alloc")
        deadline = self.t0 + self.cfg.max_minutes * 60.0 if self.cfg.max_minutes is not None else None
        runs, before = [], 0
        for key in todo:
            study = self._prepared_study(key)
            before += _measured_trials(study)
            run = start_run(self.by_key[key], self._tune_config(int(alloc[key])), None)
            runs.append((run, open_run_study(run)))
        jobs = [
            [
                WorkerJob(
                    task=run.task,
                    storage=run.spec,
                    study=run.study,
                    n_trials=int(alloc[run.task.key]),
                    backend=self.cfg.backend,
                    seed=self.cfg.seed,
                    index=i,
                    deadline=deadline,
                    calibration=run.calibration,
                    read_bandwidth_gbps=run.read_bandwidth_gbps,
                )
                for run, _ in runs
            ]
            for i in range(self.cfg.workers)
        ]
        ctx = mp.get_context("spawn")
        procs = [
            ctx.Process(
                target=_campaign_worker, args=(j, self.max_tokens, self.max_batch), name=f"kvsplit-campaign-{i}"
            )
            for i, j in enumerate(jobs)
        ]

        def progress() -> None:
            counts = [(run, _finished(st), int(alloc[run.task.key])) for run, st in runs]
            done = sum(1 for _, k, n in counts if k >= n)
            self.bar.set(len(searched) + done)
            cur = next(((run, k, n) for run, k, n in counts if k < n), None)
            if cur is not None:
                self.bar.bucket(cur[0].task.source, cur[2], cur[1])

        wall, stop = self._run_processes(procs, progress)
        after = sum(_measured_trials(st) for _, st in runs)
        # K GPUs busy for the wall time: K x wall GPU seconds
        self.charge((after - before) * self.cfg.num_train, wall * self.cfg.workers)
        ok = True
        for run, st in runs:
            res = run_result(run, st, stop)
            record_run(run, res)
            if res.status == "finished" and res.n_finished >= int(alloc[run.task.key]):
                searched.append(run.task.key)
            else:
                ok = False
        self.state.set("searched", searched)
        bad = [p.exitcode for p in procs if p.exitcode not in (0, 130)]
        if bad and not stop.is_set():
            raise RuntimeError(f"campaign workers exited with codes {bad}")
        if not ok:
            self.result.status = "interrupted" if stop.is_set() else "paused"
        return ok

    def choose_phase(self) -> None:
        """Each bucket's published params (before the whole-wave rule), :func:`choose_published` over the
        study's trials of the best, the pool pick and the replaced plan."""
        if self.state.get("choice") is not None:
            return
        from .study import load_study, open_storage, study_name
        from .worker import task_params

        choice = {}
        for key in self.state.get("alloc"):
            task = self.by_key[key]
            study = load_study(
                self.spec, study_name(task, self.cfg.backend), self.cfg.seed, 1, storage=open_storage(self.spec)
            )
            warm = study.user_attrs.get("kvsplit:campaign_starts") or {}
            done = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
            if not done:  # no trial finished within the budget: the pool pick, as the pool timed it
                name = (self.state.get("starts") or {}).get(key, [None])[0]
                if name is not None and "pool" in warm:
                    choice[key] = {"params": task_params(task, warm["pool"]), "label": "pool", "value": None}
                continue
            scores: dict[str, float] = {}
            params_of: dict[str, dict[str, Any]] = {}
            best = min(done, key=lambda t: (t.value, t.number))
            scores["best"], params_of["best"] = float(best.value), dict(best.params)
            for label in ("pool", "previous"):
                want = warm.get(label)
                hit = next((t for t in done if want is not None and _canon(t.params) == _canon(want)), None)
                if hit is not None:
                    scores[label], params_of[label] = float(hit.value), dict(hit.params)
            label = choose_published(scores)
            choice[key] = {"params": task_params(task, params_of[label]), "label": label, "value": scores[label]}
        self.state.set("choice", choice)

    def whole_wave_phase(self) -> bool:
        if self.state.get("whole_wave") is not None:
            return True
        choice = self.state.get("choice")
        rows = self.state.get("whole_wave_rows", {})
        probes = self._whole_wave_probes(choice)
        keys = [k for k in list(choice) + list(probes) if k not in rows]
        self.bar.phase("whole-wave", len(choice) + len(probes), len(choice) + len(probes) - len(keys))
        for key in keys:
            if self.out_of_slice():
                return False
            if key in probes:  # a probe batch, with the chosen params of its nearest bucket
                near, lens = probes[key]
                task, params, batches = self.by_key[near], choice[near]["params"], [lens]
            else:
                task, params = self.by_key[key], choice[key]["params"]
                batches = task.train
            t0, n, per = time.time(), 0, []
            for lens in batches:
                base = self._plan(task, lens, params)
                t_base = None
                ratios = []
                for v in WHOLE_WAVE_VARIANTS:
                    try:
                        p = self._plan(task, lens, {**params, **v})
                    except ValueError:
                        ratios.append(None)
                        continue
                    if p.work_key() == base.work_key():
                        ratios.append(1.0)
                        continue
                    if t_base is None:
                        t_base = self.backend.time_plan(base)
                        n += 1
                    try:
                        ratios.append(self.backend.time_plan(p) / t_base)
                    except ValueError:  # the GPU cannot load the variant's kernel: the rule cannot use it here
                        ratios.append(None)
                    n += 1
                per.append(ratios)
            rows[key] = per
            self.state.set("whole_wave_rows", rows)
            self.charge(n, time.time() - t0)
            self.bar.step()
        # each bucket decides on its own training batches and the probes timed with its params
        owner = {k: probes[k][0] if k in probes else k for k in rows if k in probes or k in choice}
        self.state.set("whole_wave", whole_wave_by_bucket(rows, owner, WHOLE_WAVE_VARIANTS))
        return True

    def _probe_timings(self) -> int:
        """Timings the whole-wave step's probe batches will take, estimated with the pool's default plan: the
        probes whose plan a variant of the rule changes, each timed with and without it."""
        if not hasattr(self, "_n_probe_timings"):
            task, n = self.tasks[0], 0
            policy, params = parse_candidate(DEFAULT)
            for _, lens in self._probe_batches():
                try:
                    base = make_plan(lens, policy=policy, params=params, **task.plan_kwargs).work_key()
                    changed = [
                        make_plan(lens, policy=policy, params={**params, **v}, **task.plan_kwargs).work_key() != base
                        for v in WHOLE_WAVE_VARIANTS
                    ]
                except ValueError:
                    continue
                n += sum(changed) + (1 if any(changed) else 0)
            self._n_probe_timings = n
        return self._n_probe_timings

    def _probe_batches(self) -> list[tuple[str, list[int]]]:
        """``(label, kv_lens)`` of the probe batches (each request at least the shape's q_len tokens)."""
        q = self.tasks[0].q_len
        return [
            (f"probe:B{B}:T{T}", [max(T // B, q)] * B)
            for T in WHOLE_WAVE_PROBE_TOTALS
            for B in WHOLE_WAVE_PROBE_BATCH_SIZES
        ]

    def _whole_wave_probes(self, choice: Mapping[str, Any]) -> dict[str, tuple[str, list[int]]]:
        """``{label: (nearest chosen bucket key, kv_lens)}`` of the probe batches (:meth:`_probe_batches`)."""
        from ..kernels.buckets import key_of, nearest

        if not choice:
            return {}
        ctx = self.tasks[0].shape.plan_context()  # the campaign's shape, as its tasks' keys are made
        out = {}
        for label, lens in self._probe_batches():
            hit = nearest(key_of(np.asarray(lens, dtype=np.int64), ctx), sorted(choice), limit=math.inf)
            if hit is not None:
                out[label] = (hit[0], lens)
        return out

    def _plan(self, task: TuneTask, lens, params):
        return make_plan(list(lens), policy="tuned", params=params, **task.plan_kwargs)

    def verify_phase(self) -> bool:
        from .verify import verify_and_store

        choice, ww = self.state.get("choice"), self.state.get("whole_wave") or {}
        verified = dict(self.state.get("verified", {}))
        keys = list(choice)
        self.bar.phase("verify", len(keys), len(verified))
        for key in keys:
            if key in verified:
                continue
            if self.out_of_slice():
                return False
            task = self.by_key[key]
            params = dict(choice[key]["params"])
            params.update((ww.get("buckets") or {}).get(key, {}).get("params", {}))
            with store.session_scope(self.url) as s:
                existing = next(
                    (
                        p
                        for p in store.list_policies(s, bucket_key=key)
                        if p.backend == self.cfg.backend and p.params == params and p.verification
                    ),
                    None,
                )
                if existing is not None:
                    verified[key] = [existing.id, existing.status == "published"]
            if key not in verified:
                t0 = time.time()
                out = verify_and_store(
                    task,
                    params,
                    self.backend,
                    database_url=self.url,
                    bucket_id=self.bucket_ids[key],
                    run_id=None,
                    device_id=self.device_id,
                    train_objective_s=choice[key]["value"],
                    publish=self.cfg.publish,
                    tolerance=MARGIN,
                )
                self.charge(len(task.heldout) * 5, time.time() - t0)
                verified[key] = [out.policy_id, out.published]
            self.state.set("verified", verified)
            self.bar.step()
        return True

    def summary(self) -> None:
        verified = self.state.get("verified", {})
        r = self.result
        r.published = sum(1 for _, pub in verified.values() if pub)
        r.spent_s = self.spent
        r.wall_s = time.time() - self.t0
        r.timings = self.timings
        r.whole_wave = self.state.get("whole_wave") or {}
        choice = self.state.get("choice") or {}
        labels: dict[str, int] = {}
        for c in choice.values():
            labels[c["label"]] = labels.get(c["label"], 0) + 1
        if choice:
            words = {"best": "the Optuna study's best", "pool": "the pool pick", "previous": "the replaced plan"}
            r.lines.append(
                "where each bucket's plan comes from: "
                + ", ".join(f"{words.get(k, k)} {v}" for k, v in sorted(labels.items()))
                + f" (the study's best only where it wins by more than {MARGIN:.0%})"
            )


def _campaign_worker(jobs, max_tokens: int, max_batch: int) -> None:  # pragma: no cover - spawned process
    """One worker process of :meth:`_Campaign._search_parallel`: every bucket's study in turn, one timing backend
    (GPU ``index % device_count``) sized for the campaign's largest batch."""
    import sys

    from .search import Stop
    from .worker import run_worker

    _die_with_parent()
    stop = Stop().install()
    first = jobs[0]
    backend = make_backend(
        first.backend,
        shape=first.task.shape,
        max_tokens=max_tokens,
        max_batch=max_batch,
        calibration=first.calibration,
        read_bandwidth_gbps=first.read_bandwidth_gbps,
        gpu_index=first.index,
    )
    try:
        for job in jobs:
            if stop.is_set() or (job.deadline is not None and time.time() >= job.deadline):
                break
            run_worker(job, stop=stop, backend=backend)
    except KeyboardInterrupt:
        sys.exit(130)


def _distributions(params: Mapping[str, Any]) -> dict[str, Any]:
    """The Optuna distributions :func:`kvsplit.tuner.space.suggest_params` asks ``params``' keys from."""
    import optuna.distributions as od

    from ..kernels.plan import TUNED_PARAM_SPACE

    out = {}
    for name in params:
        spec = TUNED_PARAM_SPACE[name]
        if spec["kind"] == "float":
            out[name] = od.FloatDistribution(float(spec["low"]), float(spec["high"]), log=bool(spec.get("log")))
        elif spec["kind"] == "int":
            out[name] = od.IntDistribution(int(spec["low"]), int(spec["high"]), log=bool(spec.get("log")))
        else:
            out[name] = od.CategoricalDistribution(list(spec["choices"]))
    return out


def _die_with_parent() -> None:
    """Ask Linux to send this worker SIGTERM (stop after the current unit) when the coordinator dies, even by
    ``kill -9``, so a resumed campaign does not run beside orphaned workers. A no-op elsewhere."""
    import ctypes
    import multiprocessing as mp
    import os
    import signal
    import sys

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        except OSError:
            return
        parent = mp.parent_process()
        if parent is not None and os.getppid() != parent.pid:  # it died before the request: stop now
            os.kill(os.getpid(), signal.SIGTERM)


def _record_pool(
    url: str,
    bucket_id: int,
    lens: Sequence[int],
    batch_index: int,
    rows,
    backend: str,
    device_id: int,
    software: Mapping[str, Any],
) -> None:
    """Store one batch's pool timings in one transaction (a batch is timed whole or not at all)."""
    with store.session_scope(url, write=True) as s:
        for name, params, secs, floor in rows:
            store.record_measurement(
                s,
                bucket_id=bucket_id,
                policy_name=name,
                params=params,
                kv_lens=list(lens),
                time_s=secs,
                floor_s=floor,
                backend=backend,
                role="train",
                batch_index=batch_index,
                stage="pool",
                device_id=device_id,
                software=software,
            )


def _pool_worker(
    items,
    index: int,
    url: str,
    backend_name: str,
    pool: tuple[str, ...],
    calibration,
    read_bw,
    device_id: int,
    max_tokens: int,
    max_batch: int,
    deadline,
) -> None:  # pragma: no cover - spawned
    """One pool worker process of :meth:`_Campaign._pool_parallel` (GPU ``index % device_count``)."""
    import sys

    from .search import Stop

    _die_with_parent()
    stop = Stop().install()
    shape = items[0][0].shape
    backend = make_backend(
        backend_name,
        shape=shape,
        max_tokens=max_tokens,
        max_batch=max_batch,
        calibration=calibration,
        read_bandwidth_gbps=read_bw,
        gpu_index=index,
    )
    sim = make_backend("sim", shape=shape, calibration=calibration, read_bandwidth_gbps=read_bw)
    sw = backend.software()
    try:
        for task, i, bucket_id in items:
            if stop.is_set() or (deadline is not None and time.time() >= deadline):
                break
            rows = _time_pool_batch(task, task.train[i], pool, backend, sim)
            _record_pool(url, bucket_id, task.train[i], i, rows, backend_name, device_id, sw)
    except KeyboardInterrupt:
        sys.exit(130)


def _finished(study) -> int:
    return sum(1 for t in study.get_trials(deepcopy=False) if t.state.name in ("COMPLETE", "PRUNED"))


def _measured_trials(study) -> int:
    return sum(
        1 for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE" and "cached_from" not in t.user_attrs
    )


def _time_pool_batch(
    task: TuneTask, lens: Sequence[int], pool: Sequence[str], backend: TimingBackend, sim: TimingBackend
) -> list[tuple[str, dict[str, Any], float, float]]:
    """``(name, params, seconds, floor seconds)`` of every pool candidate the simulator does not prune on one
    batch (an infeasible candidate, ``ValueError`` from ``make_plan`` or from its launch, is left out)."""
    plans = {}
    for name in pool:
        policy, params = parse_candidate(name)
        try:
            plans[name] = (
                params,
                make_plan(list(lens), policy=policy, params=params, **task.plan_kwargs),
            )
        except ValueError:
            continue
    if not plans:
        return []
    pred = {n: sim.time_plan(p) for n, (_, p) in plans.items()}
    lo = min(pred.values())
    floor = backend.hbm_floor_s(lens)
    timed: dict[tuple, float] = {}
    out = []
    for name, (params, plan) in plans.items():
        if pred[name] > SIM_PRUNE_RATIO * lo and name != DEFAULT:
            continue
        sig = plan.work_key()
        if sig not in timed:
            try:
                timed[sig] = float(backend.time_plan(plan))
            except ValueError:  # the GPU cannot load the candidate's kernel (its launch names why): left out
                timed[sig] = math.nan
        if not math.isnan(timed[sig]):
            out.append((name, params, timed[sig], floor))
    return out


class _NoBar:
    def start_overall(self, total: float, done: float) -> None: ...
    def advance_overall(self, x: float) -> None: ...
    def retotal(self, total: float) -> None: ...
    def phase(self, name: str, total: int, done: int) -> None: ...
    def step(self) -> None: ...
    def set(self, done: int) -> None: ...
    def bucket(self, label: str, total: int, done: int) -> None: ...
    def close(self) -> None: ...


class _RichBar:
    """Rich progress rows, each with its ETA: the campaign's GPU (or modelled GPU) seconds against its projected
    total (the budget until the search is allocated, :meth:`_Campaign.projected_s`), the current step (pool
    batches, buckets searched, buckets verified) and, while searching, the current bucket's trials."""

    def __init__(self, label: str) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.p = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self.p.start()
        self.label = label
        self.overall = None
        self.cur = None
        self.bkt, self.bkt_label = None, ""

    def start_overall(self, total: float, done: float) -> None:
        self.budget = round(total)
        self.overall = self.p.add_task(f"{self.label} GPU time (s)", total=self.budget, completed=round(done))

    def advance_overall(self, x: float) -> None:
        if self.overall is not None:
            self.p.advance(self.overall, x)

    def retotal(self, total: float) -> None:
        """The campaign's projected GPU seconds (:meth:`_Campaign.projected_s`): the overall row's total, so its
        ETA is to the campaign's end, not to the budget's."""
        if self.overall is not None:
            self.p.update(
                self.overall,
                total=max(1, round(total)),
                description=f"{self.label} GPU time (s, of a {self.budget} s budget)",
            )

    def phase(self, name: str, total: int, done: int) -> None:
        for t in (self.cur, self.bkt):
            if t is not None:
                self.p.remove_task(t)
        self.bkt = None
        self.cur = self.p.add_task(name, total=total, completed=done)

    def bucket(self, label: str, total: int, done: int) -> None:
        """The current bucket's study: ``done`` of ``total`` trials (its own ETA)."""
        if self.bkt is None or self.bkt_label != label:
            if self.bkt is not None:
                self.p.remove_task(self.bkt)
            self.bkt, self.bkt_label = self.p.add_task(f"  {label} trials", total=total, completed=done), label
        else:
            self.p.update(self.bkt, total=total, completed=done)

    def step(self) -> None:
        if self.cur is not None:
            self.p.advance(self.cur, 1)

    def set(self, done: int) -> None:
        if self.cur is not None:
            self.p.update(self.cur, completed=done)

    def close(self) -> None:
        self.p.stop()


class _LineBar:
    """Plain progress lines for a log (stderr not a terminal, where :class:`_RichBar` draws nothing): a line when a
    step starts, then at most one every ``interval_s`` seconds, e.g. ``sim campaign: pool 40/123; GPU budget 55/132 s``
    (budget in seconds of GPU or modelled GPU time; once the campaign projects to end below it,
    ``GPU time 182 s of about 438 s (budget 900 s)``), with the current bucket's trials while searching."""

    def __init__(self, label: str, say: Callable[[str], None], interval_s: float = 10.0, clock=time.monotonic) -> None:
        self.label, self.say, self.interval_s, self.clock = label, say, interval_s, clock
        self.total = self.spent = self.projected = 0.0
        self.name, self.n, self.done, self.bkt = "", 0, 0, ""
        self.last = -math.inf

    def start_overall(self, total: float, done: float) -> None:
        self.total, self.spent, self.projected = float(total), float(done), float(total)

    def advance_overall(self, x: float) -> None:
        self.spent += x
        self._tick()

    def retotal(self, total: float) -> None:
        """The campaign's projected GPU seconds: the lines say it beside the budget when it is less."""
        self.projected = float(total)

    def phase(self, name: str, total: int, done: int) -> None:
        self.name, self.n, self.done, self.bkt = name, total, done, ""
        self._line()

    def bucket(self, label: str, total: int, done: int) -> None:
        self.bkt = f"; {label} trials {done}/{total}"
        self._tick()

    def step(self) -> None:
        self.done += 1
        self._tick()

    def set(self, done: int) -> None:
        self.done = done
        self._tick()

    def close(self) -> None:
        pass

    def _tick(self) -> None:
        if self.clock() - self.last >= self.interval_s:
            self._line()

    def _line(self) -> None:
        self.last = self.clock()
        parts = [f"{self.name} {self.done}/{self.n}"] if self.name else []
        if self.total and self.projected < self.total - 0.5:
            parts.append(f"GPU time {self.spent:.0f} s of about {self.projected:.0f} s (budget {self.total:.0f} s)")
        elif self.total and self.spent > self.total + 0.5:
            parts.append(f"GPU time {self.spent:.0f} s, over the {self.total:.0f} s budget")
        elif self.total:
            parts.append(f"GPU budget {self.spent:.0f}/{self.total:.0f} s")
        self.say(f"{self.label}: " + "; ".join(parts) + self.bkt)


def _progress(cfg: CampaignConfig, say: Callable[[str], None]):
    """The progress display: rich bars on a terminal, plain lines through ``say`` in a log, none without
    ``cfg.progress``."""
    import sys

    if not cfg.progress:
        return _NoBar()
    if sys.stderr.isatty():
        return _RichBar(f"{cfg.backend} campaign")
    return _LineBar(f"{cfg.backend} campaign", say)


def run_campaign(cfg: CampaignConfig, *, stop=None, say: Callable[[str], None] = lambda s: None) -> CampaignResult:
    """Run (or resume) the campaign ``cfg`` until it is finished, ``cfg.max_minutes`` of this invocation are up
    (status ``paused``: run it again) or ``stop`` is set (``interrupted``). A finished campaign returns at once.

    Raises ValueError for a bucket the store holds with other batches, a bad ``previous`` export or shape;
    RuntimeError for the GPU backend without CUDA."""
    from .study import exclusive_storage

    bar = _progress(cfg, say)
    c = _Campaign(cfg, stop, say, bar)
    try:
        # a SQLite store is one tuner's for the whole campaign (pool timings, studies and campaign state alike):
        # another tuner on it stops here, before it reads or says anything about the campaign's state
        with exclusive_storage(c.spec):
            c.open_state()
            if c.state.get("finished"):
                c.result.buckets = len(c.state.get("alloc") or {})
                c.summary()
                c.result.lines.insert(0, "already finished: nothing timed")
                return c.result
            c.setup()
            steps = (
                c.pool_phase,
                lambda: (c.plan_search(), True)[1],
                c.search_phase,
                lambda: (c.choose_phase(), True)[1],
                c.whole_wave_phase,
                c.verify_phase,
            )
            for step in steps:
                if not step():
                    break
            else:
                c.state.set("finished", True)
            c.summary()
            return c.result
    finally:
        bar.close()
