"""kvsplit against the strongest peer decode kernels on the same GPU, one implementation per process.

    python bench/peers.py --impl kvsplit --out kvsplit.csv                  # the reference workload, 98 cases
    python bench/peers.py --impl fa3 --out fa3.csv
    python bench/peers.py --impl flashinfer_batch_attention --out fi_ba.csv
    python bench/peers.py --impl flashinfer_decode --out fi_dec.csv
    python bench/peers.py --impl kvsplit --cases traces --out kvsplit_traces.csv   # held-out trace batches
    python bench/peers.py --summary kvsplit.csv fa3.csv fi_ba.csv fi_dec.csv       # CPU: the comparison table
    python bench/peers.py --impl kvsplit --kv-dtype fp8 --out kvsplit_fp8.csv      # fp8 KV cache
    python bench/peers.py --impl flashinfer_prefill --q-len 4 --out fi_pf_q4.csv   # verify steps, 4 tokens
    python bench/peers.py --summary kvsplit.csv kvsplit_q4.csv                     # + the verify-step ratio

Implementations (``--impl``):

- ``kvsplit``: the plan the shipped table (kernels/data/h200_policies.json) serves each batch, on the hot path
  (``decode_attention(..., out=, workspace=, validate=False)``, plan uploaded);
- ``kvsplit_balanced``: the ``balanced`` fallback plan (``make_plan(..., policy="balanced")``, the rule a batch gets
  where no tuned bucket is near) on the same kernel and hot path: what the tuned table gains over not tuning;
- ``fa3``: FlashAttention-3 ``flash_attn_interface.flash_attn_with_kvcache(q [B, 1, H_q, D], k_cache, v_cache,
  cache_seqlens=, page_table=, causal=True, num_splits=0)``: its own split heuristic, SGLang's Hopper default
  (build: ../shared/tools/fa3_for_device);
- ``flashinfer_batch_attention``: FlashInfer's persistent ``BatchAttention`` (``plan`` with qo_indptr = 0..B,
  one query token per request, then ``run``);
- ``flashinfer_decode``: FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True, backend="fa2")``
  (``kvsplit.tuner.flashinfer_kernel``); with ``--kv-dtype fp8`` planned with ``kv_data_type=torch.float8_e4m3fn``
  and run with ``k_scale``/``v_scale`` (how SGLang runs an fp8 cache); q_len = 1 only;
- ``flashinfer_prefill`` (``--q-len`` > 1 only): FlashInfer's ``BatchPrefillWithPagedKVCacheWrapper`` (NHD,
  ``plan(qo_indptr = arange(B + 1) * q_len, ..., causal=True)``, ``run(q, (k, v), k_scale=, v_scale=, out=)``),
  the path engines take for speculative-decoding verify steps.

``--kv-dtype fp8``: the cache is the same random data stored as ``torch.float8_e4m3fn`` (1 byte per element) with
per-tensor scales :data:`K_SCALE`, :data:`V_SCALE` (q and the output stay bf16); the read floor counts the bytes
actually read (1 per element). FA3 takes fp8 only with an fp8 q (``q.to(float8_e4m3fn)`` with ``q_descale``,
``k_descale``, ``v_descale``, as SGLang calls it) and only from a build with its FP8 flag on (the device build of
../shared/tools/fa3_for_device disables it: NOTES.md): where the call is refused the bench says so and records no
figure. A peer whose ``run`` takes no ``v_scale`` (``BatchAttention``) gets ``k_scale`` folded into its softmax
scale and runs without ``v_scale`` (the bench says so; it is one multiply of the output).
``--q-len N`` (1-8): N query tokens per request (``[B * N, H_q, D]``), causal within the new tokens, which the
kv_lens count (kv_lens below N are raised to N); FA3 takes q ``[B, N, H_q, D]`` with ``causal=True`` (its causal
mask is aligned to the end of the KV, as kvsplit's). Both options tag the CSV's ``set`` (``T262144/fp8``,
``T262144/q4``), so runs of different settings never mix in a comparison; ``--summary`` of a q_len = 1 and a
q_len = N CSV of the same implementation also prints the verify-step ratio time(q_len = N) / time(q_len = 1)
per case.

Each runs in its own process (a peer's JIT modules and allocator state do not touch the others' timings). The
workload is Qwen3-30B-A3B's attention: H_q 32, H_kv 4, head_dim 128, bf16, page 16, one query token per request.
``--cases reference`` (default) is the reference grid of ``kvsplit.tuner.workloads.peer_reference_cases``: five
length families (uniform; skewed40/60/80: one request holds that share of T; 2x40: two hold 40 % each) x B 1..512
x T 262,144 and 1,048,576, 49 cases per T; ``--cases traces`` the held-out trace batches of
``kvsplit.tuner.workloads.trace_cases``. The KV cache is random normal bf16 over shuffled pages, above the L2
(``kvsplit.tuner.gpu.GpuTimer``); every figure is the median of CUDA-graph replays under ``triton.testing.do_bench``
(``kvsplit.tuner.gpu.graph_median_s``). ``ratio_to_read_floor`` = time / (KV bytes / streaming-read bandwidth
measured in the same process). Every output is checked against the fp32 reference on batches of at most
``--check-tokens`` tokens (a mismatch stops the run: no figure is written for a wrong kernel).

Output: a CSV with the columns of :data:`COLUMNS`, one row per case, and ``<out>.json`` with the software versions,
GPU and bandwidth. A peer that does not import prints why and writes nothing (exit status 0: no figure is not an
error). ``--summary`` reads any number of such CSVs and prints, per implementation and set, the worst and
geometric-mean ratio to the read floor, then each implementation's time over the baseline's (``--baseline``,
default the implementation named ``kvsplit...``) per case.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

IMPLS = ("kvsplit", "kvsplit_balanced", "fa3", "flashinfer_batch_attention", "flashinfer_decode", "flashinfer_prefill")
COLUMNS = ("implementation", "set", "family", "B", "total_tokens", "time_us", "ratio_to_read_floor")
SHAPE = {"num_qo_heads": 32, "num_kv_heads": 4, "head_dim": 128, "dtype": "bfloat16", "page_size": 16}
K_SCALE, V_SCALE = 0.5, 2.0
"""Per-tensor dequantization scales of the fp8 cache (``--kv-dtype fp8``), passed to every peer that takes them."""
KV_DTYPES = ("bfloat16", "fp8")


def set_tag(kv_dtype: str = "bfloat16", q_len: int = 1) -> str:
    """The suffix of a case's ``set`` for a run's options: ``""`` (bf16 cache, one token), ``"/fp8"``, ``"/q4"``,
    ``"/fp8/q4"``."""
    return ("/fp8" if kv_dtype == "fp8" else "") + (f"/q{q_len}" if q_len != 1 else "")


# ----------------------------------------------------------------------------- cases (CPU)


def build_cases(kind: str) -> list[dict[str, Any]]:
    """The cases of ``--cases``: dicts with ``set`` (``T262144`` / ``T1048576`` for the reference grid, ``trace``),
    ``family`` (a length family or a trace's name), ``B``, ``total_tokens`` and ``kv_lens`` (int64 ``[B]``).

    Raises
    ------
    ValueError
        ``kind`` is neither ``reference`` nor ``traces``.
    """
    from kvsplit.tuner.workloads import REFERENCE_TOTALS, family_kv_lens, peer_reference_cases, trace_cases

    if kind == "reference":
        return [
            {"set": f"T{T}", "family": fam, "B": B, "total_tokens": T, "kv_lens": family_kv_lens(fam, B, T)}
            for T in REFERENCE_TOTALS
            for fam, B in peer_reference_cases(T)
        ]
    if kind == "traces":
        return [
            {
                "set": "trace",
                "family": c["family"],
                "B": c["B"],
                "total_tokens": c["T"],
                "kv_lens": np.asarray(c["kv_lens"], dtype=np.int64),
            }
            for c in trace_cases()
        ]
    raise ValueError(f"--cases: expected 'reference' or 'traces', got {kind!r}")


# ----------------------------------------------------------------------------- CSV and summary (CPU)


def write_csv(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Write rows with the :data:`COLUMNS` (time in us to 2 decimals, the ratio to 4)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow(
                [
                    r["implementation"],
                    r["set"],
                    r["family"],
                    int(r["B"]),
                    int(r["total_tokens"]),
                    f"{r['time_us']:.2f}",
                    f"{r['ratio_to_read_floor']:.4f}",
                ]
            )


def read_csvs(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """The rows of one or more peer CSVs (numbers parsed).

    Raises
    ------
    ValueError
        A file lacks one of :data:`COLUMNS`, or a number does not parse (the file and row are named).
    """
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = set(COLUMNS) - set(reader.fieldnames or ())
            if missing:
                raise ValueError(f"{path}: missing columns {sorted(missing)}")
            for i, r in enumerate(reader, start=2):
                try:
                    rows.append(
                        {
                            "implementation": r["implementation"],
                            "set": r["set"],
                            "family": r["family"],
                            "B": int(r["B"]),
                            "total_tokens": int(r["total_tokens"]),
                            "time_us": float(r["time_us"]),
                            "ratio_to_read_floor": float(r["ratio_to_read_floor"]),
                        }
                    )
                except ValueError as exc:
                    raise ValueError(f"{path}, line {i}: {exc}") from exc
    return rows


def geomean(xs: Sequence[float]) -> float:
    """Geometric mean of positive numbers (nan for none)."""
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def summary(rows: Sequence[dict[str, Any]], baseline: str | None = None) -> dict[str, Any]:
    """The figures ``--summary`` prints.

    Returns a dict: ``per_set[impl][set] = (worst, geomean, n)`` of ``ratio_to_read_floor``; ``cliff[impl][set]``,
    the largest time of a skewed80 or 2x40 batch over the uniform batch of the same B and T (the split-KV cliff:
    1.0 for a kernel whose time depends on the total only; sets without uniform batches have none); ``baseline`` (the
    implementation compared against: ``baseline``, else the first whose name starts with ``kvsplit``, else None);
    ``vs_baseline[impl][set] = (min, geomean, max, n)`` of ``time / baseline time`` over the cases both timed
    (keyed by set, family, B, total_tokens); ``per_case[(set, family, B, total_tokens)][impl] = time / baseline
    time``.

    Raises
    ------
    ValueError
        ``baseline`` names no implementation of the rows.
    """
    impls = list(dict.fromkeys(r["implementation"] for r in rows))
    if baseline is not None and baseline not in impls:
        raise ValueError(f"--baseline: {baseline!r} is none of the implementations {impls}")
    if baseline is None:
        baseline = "kvsplit" if "kvsplit" in impls else next((i for i in impls if i.startswith("kvsplit")), None)
    per_set: dict[str, dict[str, tuple[float, float, int]]] = defaultdict(dict)
    by_impl_set: dict[tuple[str, str], list[float]] = defaultdict(list)
    times: dict[str, dict[tuple, float]] = defaultdict(dict)
    for r in rows:
        by_impl_set[(r["implementation"], r["set"])].append(r["ratio_to_read_floor"])
        times[r["implementation"]][(r["set"], r["family"], r["B"], r["total_tokens"])] = r["time_us"]
    for (impl, s), xs in by_impl_set.items():
        per_set[impl][s] = (max(xs), geomean(xs), len(xs))
    cliff: dict[str, dict[str, float]] = defaultdict(dict)
    for impl, tm in times.items():
        for (s, fam, B, T), t in tm.items():
            u = tm.get((s, "uniform", B, T))
            if fam in ("skewed80", "2x40") and u:
                cliff[impl][s] = max(cliff[impl].get(s, 0.0), t / u)
    vs: dict[str, dict[str, tuple[float, float, float, int]]] = defaultdict(dict)
    per_case: dict[tuple, dict[str, float]] = defaultdict(dict)
    if baseline is not None:
        base = times[baseline]
        for impl in impls:
            if impl == baseline:
                continue
            by_set: dict[str, list[float]] = defaultdict(list)
            for key, t in times[impl].items():
                if key in base:
                    by_set[key[0]].append(t / base[key])
                    per_case[key][impl] = t / base[key]
            for s, xs in by_set.items():
                vs[impl][s] = (min(xs), geomean(xs), max(xs), len(xs))
    # verify step: time of a q_len = N set over the same implementation's q_len = 1 set (same family, B, T)
    verify: dict[str, dict[tuple, float]] = defaultdict(dict)
    for impl, tm in times.items():
        for (st, fam, B, T), t in tm.items():
            head, _, last = st.rpartition("/q")
            one = tm.get((head, fam, B, T)) if head and last.isdigit() else None
            if one:
                verify[impl][(st, fam, B, T)] = t / one
    return {
        "impls": impls,
        "per_set": dict(per_set),
        "cliff": dict(cliff),
        "baseline": baseline,
        "vs_baseline": dict(vs),
        "per_case": dict(per_case),
        "verify": dict(verify),
    }


def format_summary(s: dict[str, Any]) -> str:
    """Markdown tables of :func:`summary`'s figures."""
    verify = _format_verify(s.get("verify") or {})
    sets = list(dict.fromkeys(k for d in s["per_set"].values() for k in d))
    cliff_sets = [st for st in sets if any(st in d for d in s["cliff"].values())]
    out = [
        "time / read floor: worst / geomean (cases); cliff: max over B of skewed80 or 2x40 time / uniform time",
        "",
        "| implementation | " + " | ".join(sets + [f"cliff {st}" for st in cliff_sets]) + " |",
        "|---|" + "---|" * (len(sets) + len(cliff_sets)),
    ]
    for impl in s["impls"]:
        cells = []
        for st in sets:
            v = s["per_set"].get(impl, {}).get(st)
            cells.append(f"{v[0]:.3f} / {v[1]:.3f} ({v[2]})" if v else "-")
        cells += [f"{s['cliff'][impl][st]:.2f}" if st in s["cliff"].get(impl, {}) else "-" for st in cliff_sets]
        out.append(f"| {impl} | " + " | ".join(cells) + " |")
    out += verify
    if s["baseline"] is None or not s["vs_baseline"]:
        return "\n".join(out)
    b = s["baseline"]
    out += [
        "",
        f"time / {b}'s time per case: min / geomean / max (cases); above 1: {b} is faster",
        "",
        "| implementation | " + " | ".join(sets) + " |",
        "|---|" + "---|" * len(sets),
    ]
    for impl, d in s["vs_baseline"].items():
        cells = [f"{d[st][0]:.3f} / {d[st][1]:.3f} / {d[st][2]:.3f} ({d[st][3]})" if st in d else "-" for st in sets]
        out.append(f"| {impl} | " + " | ".join(cells) + " |")
    others = list(s["vs_baseline"])
    out += [
        "",
        f"per case, time / {b}'s time",
        "",
        "| set | family | B | " + " | ".join(others) + " |",
        "|---|---|---:|" + "---:|" * len(others),
    ]
    for (st, fam, B, _T), d in s["per_case"].items():
        out.append(f"| {st} | {fam} | {B} | " + " | ".join(f"{d[i]:.3f}" if i in d else "-" for i in others) + " |")
    return "\n".join(out)


def _format_verify(verify: dict[str, dict[tuple, float]]) -> list[str]:
    """The verify-step table of :func:`summary`: per implementation and case, time(q_len = N) / time(q_len = 1)."""
    if not any(verify.values()):
        return []
    out = ["", "verify step: time(q_len = N) / time(q_len = 1) of the same implementation, batch and cache", ""]
    out += ["| implementation | set | family | B | ratio |", "|---|---|---|---:|---:|"]
    for impl, d in verify.items():
        for (st, fam, B, _T), r in d.items():
            out.append(f"| {impl} | {st} | {fam} | {B} | {r:.3f} |")
        if d:
            xs = list(d.values())
            out.append(f"| {impl} | all | geomean / max | {len(xs)} | {geomean(xs):.3f} / {max(xs):.3f} |")
    return out


def plot_summary(
    rows: Sequence[dict[str, Any]], out_dir: str | Path, families: Sequence[str] = ("uniform", "skewed80")
) -> list[Path]:
    """One PNG per reference set (``<out_dir>/peers_<set>.png``): time / read floor against B, one line per
    (implementation, family), log2 B axis. Sets without the given families (trace batches) are not drawn.

    Returns the paths written.

    Raises
    ------
    ValueError
        ``rows`` hold no case of ``families``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sets = list(dict.fromkeys(r["set"] for r in rows if r["family"] in families))
    if not sets:
        raise ValueError(f"--plot: no case of the families {list(families)} in the CSVs")
    impls = list(dict.fromkeys(r["implementation"] for r in rows))
    written = []
    for st in sets:
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        for i, impl in enumerate(impls):
            for fam, style in zip(families, ("-", "--"), strict=False):
                pts = sorted(
                    (r["B"], r["ratio_to_read_floor"])
                    for r in rows
                    if r["set"] == st and r["implementation"] == impl and r["family"] == fam
                )
                if pts:
                    ax.plot(
                        [b for b, _ in pts],
                        [y for _, y in pts],
                        style,
                        marker="o",
                        ms=3,
                        color=f"C{i}",
                        label=f"{impl} ({fam})",
                    )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("B (requests)")
        ax.set_ylabel("time / read floor")
        ax.set_title(f"{st}: time / HBM read floor (lower is better)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = out_dir / f"peers_{st}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


# ----------------------------------------------------------------------------- runners (GPU)


def _import_peer(impl: str) -> tuple[Any, str]:
    """The peer's module, or ``(None, why)`` when it does not import (checked before any CUDA work)."""
    try:
        if impl == "fa3":
            import flash_attn_interface as mod
        elif impl.startswith("flashinfer"):
            import flashinfer as mod
        else:
            import kvsplit.kernels.decode as mod
    except Exception as exc:  # noqa: BLE001 - any import failure means the peer is missing here
        return None, f"{type(exc).__name__}: {exc}"
    if impl.startswith("kvsplit"):
        from importlib.metadata import version

        return mod, f"kvsplit {version('kvsplit')}"
    return mod, f"{mod.__name__} {getattr(mod, '__version__', '?')}"


def queries(timer: Any, kv_lens: np.ndarray, q_len: int = 1) -> Any:
    """q of a batch with ``q_len`` tokens per request: ``[B * q_len, H_q, D]`` in the timer's dtype (the timer's
    own q for ``q_len`` 1; else random rows drawn once per batch and kept)."""
    import torch

    b = timer.batch(kv_lens)
    if q_len == 1:
        return b["q"]
    key = f"q{q_len}"
    if key not in b:
        B = int(np.asarray(kv_lens).shape[0])
        b[key] = torch.randn(
            (B * q_len, timer.num_qo_heads, timer.head_dim),
            generator=torch.Generator(device=timer.device).manual_seed(B * 8 + q_len),
            dtype=b["q"].dtype,
            device=timer.device,
        )
    return b[key]


def reference_output(timer: Any, kv_lens: np.ndarray, *, kv_dtype: str = "bfloat16", q_len: int = 1) -> Any:
    """fp32 reference ``[B * q_len, H_q, D]`` of a batch on the timer's cache: token j of request b is the
    single-token reference (:func:`kvsplit.kernels.reference.reference_decode_attention`) over the first
    ``kv_len - q_len + 1 + j`` positions; an fp8 cache is dequantized by the reference's fp32 math, its scales
    applied as ``sm_scale * K_SCALE`` and ``o * V_SCALE``."""
    import torch

    from kvsplit.kernels.reference import reference_decode_attention

    b = timer.batch(kv_lens)
    q = queries(timer, kv_lens, q_len)
    ks, vs = (K_SCALE, V_SCALE) if kv_dtype == "fp8" else (1.0, 1.0)
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for j in range(q_len):
        lens_j = b["kv_lens"] - (q_len - 1 - j)
        o = reference_decode_attention(
            q[j::q_len],
            timer.k_cache,
            timer.v_cache,
            b["kv_indptr"],
            b["kv_indices"],
            lens_j,
            sm_scale=ks / math.sqrt(timer.head_dim),
        )
        out[j::q_len] = o.float() * vs
    return out


def make_runner(
    impl: str, mod: Any, timer: Any, *, kv_dtype: str = "bfloat16", q_len: int = 1
) -> Callable[[np.ndarray], tuple[Callable[[], Any], Callable[[], Any]]]:
    """``prepare(kv_lens) -> (launch, output)`` for one implementation on ``timer``'s cache and batches:
    ``launch()`` runs the decode (CUDA-graph capturable), ``output()`` returns its last output ``[B * q_len, H_q,
    D]``. With ``kv_dtype="fp8"`` the timer's cache must already be float8_e4m3fn (:func:`run` converts it); the
    scales are :data:`K_SCALE`, :data:`V_SCALE`.

    Raises
    ------
    ValueError
        ``impl`` unknown, or not applicable to ``q_len`` (``flashinfer_decode`` takes one token per request,
        ``flashinfer_prefill`` is for ``q_len`` > 1).
    """
    import torch

    t = timer
    scale = 1.0 / math.sqrt(t.head_dim)
    fp8 = kv_dtype == "fp8"
    scales = {"k_scale": K_SCALE, "v_scale": V_SCALE} if fp8 else {}
    if impl == "flashinfer_decode" and q_len != 1:
        raise ValueError("--impl flashinfer_decode: FlashInfer's decode wrapper takes one query token per request")
    if impl == "flashinfer_prefill" and q_len == 1:
        raise ValueError("--impl flashinfer_prefill: for --q-len > 1 (verify steps); q_len 1 is flashinfer_decode")
    if impl == "kvsplit_balanced":
        if fp8 or q_len != 1:
            raise ValueError("--impl kvsplit_balanced: times the bf16, q_len 1 reference workload only")
        from kvsplit.kernels.decode import decode_attention
        from kvsplit.kernels.plan import make_plan
        from kvsplit.kernels.policy_table import FALLBACK_POLICY

        gpu = torch.cuda.get_device_name()
        shape = {k: v for k, v in SHAPE.items() if k != "num_qo_heads"}

        def prepare_balanced(lens):
            plan = make_plan(lens, policy=FALLBACK_POLICY, device=gpu, **shape)
            b = t.batch(lens)
            out = torch.empty_like(b["q"])
            ws = t.workspace_for(plan)
            plan.to(t.device)
            args = (b["q"], t.k_cache, t.v_cache, b["kv_indptr"], b["kv_indices"], b["kv_lens"], plan)
            decode_attention(*args, out=out, workspace=ws, validate=True)
            return (lambda: decode_attention(*args, out=out, workspace=ws, validate=False)), (lambda: out)

        return prepare_balanced
    if impl == "kvsplit":
        from kvsplit.kernels.decode import decode_attention
        from kvsplit.kernels.policy_table import PolicyTable

        raw = json.loads((Path(__file__).resolve().parents[1] / "kernels/data/h200_policies.json").read_text())
        table = PolicyTable.from_export(raw, version=raw.get("policies_version"))
        gpu = torch.cuda.get_device_name()

        from kvsplit.kernels.decode import make_workspace

        spaces: dict[str, Any] = {}

        def prepare(lens):
            plan, _, info = table.plan(lens, gpu=gpu, **SHAPE)
            b = t.batch(lens)
            q = queries(t, lens, q_len)
            out = torch.empty_like(q)
            if q_len == 1:
                ws = t.workspace_for(plan)
            else:  # partials and LSE rows of q_len tokens per request
                ws = spaces.get("ws")
                if ws is None or ws.max_partials < plan.num_partials or ws.max_batch < plan.batch_size:
                    spaces["ws"] = None
                    ws = spaces["ws"] = make_workspace(
                        t.num_qo_heads,
                        t.head_dim,
                        max_partials=max(plan.num_partials, 1 << 12),
                        max_batch=t.max_batch,
                        device=t.device,
                        q_len=q_len,
                    )
            plan.to(t.device)
            args = (q, t.k_cache, t.v_cache, b["kv_indptr"], b["kv_indices"], b["kv_lens"], plan)
            kw = {"out": out, "workspace": ws, "q_len": q_len, **scales}
            decode_attention(*args, **kw, validate=True)
            prepare.last_source = info["source"]
            return (lambda: decode_attention(*args, **kw, validate=False)), (lambda: out)

        return prepare
    if impl == "flashinfer_decode":
        from kvsplit.tuner.flashinfer_kernel import FlashInferDecode

        fi = FlashInferDecode(t, mod)

        def prepare(lens):
            launch, out = fi.prepare(lens, **scales)
            return launch, (lambda: out)

        return prepare

    def page_table(b, lens):
        indptr = b["kv_indptr"].cpu().numpy()
        indices = b["kv_indices"].cpu().numpy()
        pages = np.diff(indptr)
        pt = np.zeros((len(lens), int(pages.max())), dtype=np.int32)
        for i in range(len(lens)):
            pt[i, : pages[i]] = indices[indptr[i] : indptr[i + 1]]
        return torch.from_numpy(pt).to(t.device)

    if impl == "fa3":

        def prepare(lens):
            b = t.batch(lens)
            B = len(lens)
            q4 = queries(t, lens, q_len).view(B, q_len, t.num_qo_heads, t.head_dim)
            pt = page_table(b, lens)
            res: dict[str, Any] = {}
            fp8_kw = {}
            if fp8:  # FA3's fp8 path takes q, k and v in fp8 with their descales [B, H_kv] (SGLang's call)
                q4 = q4.to(torch.float8_e4m3fn)
                ones = torch.ones((B, t.num_kv_heads), dtype=torch.float32, device=t.device)
                fp8_kw = {"q_descale": ones, "k_descale": ones * K_SCALE, "v_descale": ones * V_SCALE}

            def launch():
                o = mod.flash_attn_with_kvcache(
                    q4,
                    t.k_cache,
                    t.v_cache,
                    cache_seqlens=b["kv_lens"],
                    page_table=pt,
                    softmax_scale=scale,
                    causal=True,
                    num_splits=0,
                    **fp8_kw,
                )
                res["out"] = o[0] if isinstance(o, tuple) else o

            return launch, (lambda: res["out"].reshape(B * q_len, t.num_qo_heads, t.head_dim))

        return prepare
    if impl == "flashinfer_batch_attention":
        import inspect

        wrapper = mod.BatchAttention(kv_layout="NHD", device=str(t.device))
        run_params = inspect.signature(wrapper.run).parameters
        soft_cap = {"logits_soft_cap": 0.0} if "logits_soft_cap" in run_params else {}
        # fp8: the scales where run() takes them; else k_scale folded into the softmax scale (exact) and no v_scale
        ba_scales = {k: v for k, v in scales.items() if k in run_params}
        fold_k = fp8 and "k_scale" not in run_params
        if fp8 and "v_scale" not in run_params:
            print("flashinfer_batch_attention: run() takes no v_scale; timed without it (k_scale in sm_scale)")
        prepare_ref = {"v_scale": V_SCALE if fp8 and "v_scale" not in run_params else 1.0}

        def prepare(lens):
            b = t.batch(lens)
            B = len(lens)
            q = queries(t, lens, q_len)
            qo_indptr = torch.arange(B + 1, dtype=torch.int32, device=t.device) * q_len
            wrapper.plan(
                qo_indptr,
                b["kv_indptr"],
                b["kv_indices"],
                b["kv_lens"],
                t.num_qo_heads,
                t.num_kv_heads,
                t.head_dim,
                t.head_dim,
                t.page_size,
                causal=True,
                sm_scale=scale * (K_SCALE if fold_k else 1.0),
                q_data_type=q.dtype,
                kv_data_type=t.k_cache.dtype,
            )
            out = torch.empty_like(q)
            lse = torch.empty((B * q_len, t.num_qo_heads), dtype=torch.float32, device=t.device)
            kv = (t.k_cache, t.v_cache)
            # the output the check compares: v_scale applied outside the timed call when run() has none
            return (lambda: wrapper.run(q, kv, out=out, lse=lse, **soft_cap, **ba_scales)), (
                lambda: out.float() * prepare_ref["v_scale"]
            )

        return prepare
    if impl == "flashinfer_prefill":
        ws_buf = torch.empty(256 << 20, dtype=torch.uint8, device=t.device)
        prefill = mod.BatchPrefillWithPagedKVCacheWrapper(ws_buf, "NHD")

        def prepare(lens):
            b = t.batch(lens)
            B = len(lens)
            q = queries(t, lens, q_len)
            qo_indptr = torch.arange(B + 1, dtype=torch.int32, device=t.device) * q_len
            ps = t.page_size
            last = (lens - (-(-lens // ps) - 1) * ps).astype(np.int32)  # tokens in each request's last page
            prefill.plan(
                qo_indptr,
                b["kv_indptr"],
                b["kv_indices"],
                torch.from_numpy(last).to(t.device),
                t.num_qo_heads,
                t.num_kv_heads,
                t.head_dim,
                ps,
                causal=True,
                sm_scale=scale,
                q_data_type=q.dtype,
                kv_data_type=t.k_cache.dtype,
            )
            out = torch.empty_like(q)
            kv = (t.k_cache, t.v_cache)
            return (lambda: prefill.run(q, kv, out=out, **scales)), (lambda: out)

        return prepare
    raise ValueError(f"--impl: expected one of {IMPLS}, got {impl!r}")


LABELS = {
    "kvsplit": "kvsplit (served plan of the shipped table, hot path)",
    "kvsplit_balanced": "kvsplit kernel, balanced fallback plan (untuned), hot path",
    "fa3": "FlashAttention-3 flash_attn_with_kvcache(num_splits=0)",
    "flashinfer_batch_attention": "FlashInfer BatchAttention",
    "flashinfer_decode": "FlashInfer BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True)",
    "flashinfer_prefill": "FlashInfer BatchPrefillWithPagedKVCacheWrapper(causal=True)",
}


def run(
    impl: str,
    kind: str,
    out: Path,
    *,
    rep_ms: float,
    check_tokens: int,
    kv_dtype: str = "bfloat16",
    q_len: int = 1,
) -> int:
    """Time ``impl`` on the cases of ``kind`` (``kv_dtype`` ``"bfloat16"`` or ``"fp8"``, ``q_len`` query tokens
    per request) and write the CSV; the exit status."""
    if impl == "flashinfer_decode" and q_len != 1 or impl == "flashinfer_prefill" and q_len == 1:
        print(f"{impl}: not run at --q-len {q_len} (decode: one token per request; prefill: verify steps); no figure")
        return 0
    mod, note = _import_peer(impl)
    if mod is None:
        print(f"{impl}: not importable here ({note}); no figure recorded")
        return 0
    import torch

    if not torch.cuda.is_available():
        print(f"{impl}: needs a CUDA GPU (torch.cuda.is_available() is False); no figure recorded", file=sys.stderr)
        return 1
    from kvsplit.tuner.gpu import GpuTimer, graph_median_s, software_versions

    cases = build_cases(kind)
    timer = GpuTimer(
        num_qo_heads=SHAPE["num_qo_heads"],
        num_kv_heads=SHAPE["num_kv_heads"],
        head_dim=SHAPE["head_dim"],
        dtype=SHAPE["dtype"],
        page_size=SHAPE["page_size"],
        max_tokens=max(c["total_tokens"] for c in cases),
        max_batch=max(c["B"] for c in cases),
    )
    if kv_dtype == "fp8":  # the same random data stored as float8_e4m3fn (the bf16 copy freed first)
        for name in ("k_cache", "v_cache"):
            setattr(timer, name, getattr(timer, name).to(torch.float8_e4m3fn))
        torch.cuda.empty_cache()
    bw = timer.read_bandwidth()
    tag = set_tag(kv_dtype, q_len)
    meta = {
        **software_versions(),
        "implementation": impl,
        "label": LABELS[impl],
        "peer_version": note,
        "read_bandwidth_bytes_per_s": bw,
        "cases": kind,
        "shape": SHAPE,
        "kv_dtype": str(timer.k_cache.dtype),
        "q_len": q_len,
        "kv_scales": [K_SCALE, V_SCALE] if kv_dtype == "fp8" else None,
        "kv_cache_bytes": 2 * timer.k_cache.numel() * timer.k_cache.element_size(),
    }
    print(json.dumps(meta), flush=True)
    prepare = make_runner(impl, mod, timer, kv_dtype=kv_dtype, q_len=q_len)
    # bytes actually read (K and V, at the cache's element size: 1 for fp8) over the measured streaming bandwidth
    bytes_per_token = 2 * timer.num_kv_heads * timer.head_dim * timer.k_cache.element_size()
    rows = []
    for c in cases:
        lens = np.maximum(c["kv_lens"], q_len)  # kv_lens count the q_len new tokens
        try:
            launch, output = prepare(lens)
            launch()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a peer's own error: say which call failed, record nothing
            if impl == "fa3" and kv_dtype == "fp8" and not rows:
                print(
                    f"fa3: no fp8 in this FlashAttention-3 build ({type(exc).__name__}: {str(exc)[:200]}); the "
                    "device build disables it (FLASH_ATTENTION_DISABLE_FP8, ../shared/tools/fa3_for_device/"
                    "NOTES.md); no figure recorded"
                )
                return 0
            print(
                f"{impl}: failed on {c['set']} {c['family']} B={c['B']} ({type(exc).__name__}: {exc}); "
                "stopping, no figure recorded",
                file=sys.stderr,
            )
            return 1
        if int(lens.sum()) <= check_tokens:
            ref = reference_output(timer, lens, kv_dtype=kv_dtype, q_len=q_len)
            err = float((output().float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
            if not err < 2e-2:
                print(
                    f"{impl}: output differs from the fp32 reference on {c['set']} {c['family']} B={c['B']} "
                    f"(max relative error {err:.3g}); stopping, no figure recorded",
                    file=sys.stderr,
                )
                return 1
        sec = graph_median_s(launch, warmup_ms=10.0, rep_ms=rep_ms)
        ratio = sec / (int(lens.sum()) * bytes_per_token / bw)
        rows.append(
            {
                "implementation": impl,
                "set": c["set"] + tag,
                "family": c["family"],
                "B": c["B"],
                "total_tokens": c["total_tokens"],
                "time_us": sec * 1e6,
                "ratio_to_read_floor": ratio,
            }
        )
        src = getattr(prepare, "last_source", "")
        print(
            f"{impl} {c['set'] + tag} {c['family']:>10} B={c['B']:<4} {sec * 1e6:9.2f} us  {ratio:.4f}x floor"
            + (f"  ({src})" if src else ""),
            flush=True,
        )
    write_csv(out, rows)
    Path(str(out) + ".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{len(rows)} rows -> {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", choices=IMPLS, help="the implementation this process times")
    ap.add_argument("--cases", choices=("reference", "traces"), default="reference")
    ap.add_argument("--out", type=Path, help="the CSV to write (default: <impl>.csv)")
    ap.add_argument("--rep-ms", type=float, default=40.0, help="do_bench's repetition time per case (ms)")
    ap.add_argument(
        "--check-tokens",
        type=int,
        default=262_144,
        help="check the output against the fp32 reference on batches of at most this many tokens",
    )
    ap.add_argument(
        "--kv-dtype",
        choices=KV_DTYPES,
        default="bfloat16",
        help="the KV cache's dtype: bfloat16, or fp8 (float8_e4m3fn, scales K_SCALE/V_SCALE); q stays bf16",
    )
    ap.add_argument(
        "--q-len", type=int, default=1, help="query tokens per request, 1-8 (speculative-decoding verify steps)"
    )
    ap.add_argument("--summary", nargs="+", metavar="CSV", help="print the comparison of these CSVs (no GPU)")
    ap.add_argument("--baseline", default=None, help="--summary: the implementation the others are divided by")
    ap.add_argument("--plot", type=Path, metavar="DIR", help="--summary: also draw peers_<set>.png into DIR")
    args = ap.parse_args(argv)
    if args.summary:
        try:
            rows = read_csvs(args.summary)
            text = format_summary(summary(rows, args.baseline))
            drawn = plot_summary(rows, args.plot) if args.plot else []
        except (OSError, ValueError) as exc:
            ap.error(str(exc))
        print(text)
        for path in drawn:
            print(f"wrote {path}")
        return 0
    if args.impl is None:
        ap.error("--impl is required unless --summary is given")
    if not 1 <= args.q_len <= 8:
        ap.error(f"--q-len: expected 1 to 8 query tokens per request, got {args.q_len}")
    default_out = Path(f"{args.impl}{set_tag(args.kv_dtype, args.q_len).replace('/', '_')}.csv")
    return run(
        args.impl,
        args.cases,
        args.out or default_out,
        rep_ms=args.rep_ms,
        check_tokens=args.check_tokens,
        kv_dtype=args.kv_dtype,
        q_len=args.q_len,
    )


if __name__ == "__main__":
    sys.exit(main())
