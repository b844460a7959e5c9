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
    python bench/peers.py --impls all --kv-dtype fp8 --out-dir fp8/   # every implementation, one process each,
                                                                       # then the summary of their CSVs
    python bench/peers.py --impls all --kv-dtype bfloat16,fp8 --q-len 1,2,4,8 --out-dir sweep/   # every setting

Implementations (``--impl``):

- ``kvsplit``: the plan the shipped tables (:func:`kvsplit.kernels.load_shipped_table`: the H200's and the H100's)
  serve each batch of the run's shape on this GPU (KV dtype and q_len included: another family of the table), on
  the hot path (``decode_attention(..., out=, workspace=, validate=False)``, plan uploaded);
- ``kvsplit_balanced``: the ``balanced`` fallback plan (``make_plan(..., policy="balanced")``, the rule a batch gets
  where no tuned bucket is near) on the same kernel and hot path: what the tuned table gains over not tuning;
- the peers ``fa3``, ``flashinfer_batch_attention``, ``flashinfer_decode`` (q_len = 1 only) and
  ``flashinfer_prefill`` (``--q-len`` > 1 only): :mod:`kvsplit.tuner.peers` (the calls, their fp8 and q_len
  arguments and the fp32 reference), the one implementation ``kvsplit bench --backend gpu`` times too.

``--kv-dtype fp8``: the cache is the same random data stored as ``torch.float8_e4m3fn`` (1 byte per element) by
``kvsplit.tuner.gpu.GpuTimer(kv_dtype=...)``, read with per-tensor scales :data:`K_SCALE`, :data:`V_SCALE` (q and the
output stay bf16); the read floor is the timer's (``GpuTimer.hbm_floor_s``: the bytes actually read, 1 per element,
over the measured streaming-read bandwidth). Where a peer refuses the call (FA3 without its FP8 build flag) the bench
says so and records no figure.
``--q-len N`` (1-8): N query tokens per request (``[B * N, H_q, D]``, the timer's q), causal within the new tokens,
which the kv_lens count (kv_lens below N are raised to N). Both options tag the CSV's ``set`` (``T262144/fp8``,
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
measured in the same process, ``GpuTimer.hbm_floor_s``). Every output is checked against the fp32 reference on batches of at most
``--check-tokens`` tokens (a mismatch stops the run: no figure is written for a wrong kernel).

``--impls a,b`` (or ``all``: every implementation that takes the run's KV dtype and q_len,
:func:`applicable_impls`) runs this script once per implementation, each in its own process, writing
``<out-dir>/<impl><tag>.csv``; with ``--q-len`` N > 1 it also times kvsplit at q_len 1, so that the summary it then
prints gives the verify-step ratio. With ``--impls``, ``--kv-dtype`` and ``--q-len`` take comma-separated lists and
every (KV dtype, q_len) pair is run (:func:`run_each`), then summarised together. ``--impl-timeout S`` stops an implementation's process after S seconds (its
CSV is not written). The exit status is 1 if any process failed.

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

from kvsplit.kernels.limits import KV_DTYPE_SHORT, MAX_Q_LEN, kv_dtype_named
from kvsplit.tuner.peers import (
    CHECK_LIMIT,
    PEERS,
    PeerKernel,
    failure_note,
    import_peer,
    reference_output,
    unsupported,
)

IMPLS = ("kvsplit", "kvsplit_balanced", *PEERS)
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
    """The implementation's module, or ``(None, why)`` when it does not import (checked before any CUDA work); the
    peers' through :func:`kvsplit.tuner.peers.import_peer`."""
    if impl in PEERS:
        return import_peer(impl)
    try:
        import kvsplit.kernels.decode as mod
    except Exception as exc:  # noqa: BLE001 - any import failure means kvsplit's kernel is missing here
        return None, f"{type(exc).__name__}: {exc}"
    from importlib.metadata import version

    return mod, f"kvsplit {version('kvsplit')}"


def make_runner(impl: str, mod: Any, timer: Any) -> tuple[Callable[[np.ndarray], tuple[Callable[[], Any], Any]], Any]:
    """``(prepare, peer)``: ``prepare(kv_lens) -> (launch, output)`` for one implementation on ``timer``'s cache and
    batches (its KV dtype and q_len, :class:`kvsplit.tuner.gpu.GpuTimer`): ``launch()`` runs the decode (CUDA-graph
    capturable), ``output()`` returns its last output ``[B * q_len, H_q, D]``. An fp8 cache is read with the scales
    :data:`K_SCALE`, :data:`V_SCALE`. ``peer``: the :class:`kvsplit.tuner.peers.PeerKernel` of a peer (its ``note``
    and the q rounding its output is checked with, ``q_dtype``), None for kvsplit.

    Raises
    ------
    ValueError
        ``impl`` unknown, or not applicable to the timer's q_len (:func:`kvsplit.tuner.peers.unsupported`).
    """
    import torch

    t = timer
    fp8 = t.kv_dtype != t.dtype
    scales = {"k_scale": K_SCALE, "v_scale": V_SCALE} if fp8 else {}
    if impl in PEERS:
        peer = PeerKernel(impl, mod, t, k_scale=K_SCALE, v_scale=V_SCALE)
        return peer.prepare, peer
    if impl not in ("kvsplit", "kvsplit_balanced"):
        raise ValueError(f"--impl: expected one of {IMPLS}, got {impl!r}")
    from kvsplit.kernels.decode import decode_attention

    gpu = torch.cuda.get_device_name()
    shape = {**SHAPE, "kv_dtype": t.kv_dtype, "q_len": t.q_len}
    if impl == "kvsplit_balanced":
        from kvsplit.kernels.plan import make_plan
        from kvsplit.kernels.policy_table import FALLBACK_POLICY

        def plan_of(lens):
            return make_plan(
                lens, policy=FALLBACK_POLICY, device=gpu, **{k: v for k, v in shape.items() if k != "num_qo_heads"}
            ), ""
    else:
        from kvsplit.kernels.policy_table import load_shipped_table

        table = load_shipped_table()  # every shipped GPU's table, as the service and DecodeWrapper serve them

        def plan_of(lens):
            plan, _, info = table.plan(lens, gpu=gpu, **shape)
            return plan, info["source"]

    def prepare(lens):
        plan, source = plan_of(lens)
        b = t.batch(lens)
        out = torch.empty_like(b["q"])
        ws = t.workspace_for(plan)  # partials and LSE rows of the timer's q_len
        plan.to(t.device)
        args = (b["q"], t.k_cache, t.v_cache, b["kv_indptr"], b["kv_indices"], b["kv_lens"], plan)
        kw = {"out": out, "workspace": ws, **({"q_len": t.q_len} if t.q_len > 1 else {}), **scales}
        decode_attention(*args, **kw, validate=True)
        prepare.last_source = source
        return (lambda: decode_attention(*args, **kw, validate=False)), (lambda: out)

    return prepare, None


LABELS = {
    "kvsplit": "kvsplit (served plan of the shipped table, hot path)",
    "kvsplit_balanced": "kvsplit kernel, balanced fallback plan (untuned), hot path",
    **PEERS,
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
    why = unsupported(impl, q_len) if impl in PEERS else None
    if why:
        print(f"{impl}: not run at --q-len {q_len} ({why}); no figure recorded")
        return 0
    mod, note = _import_peer(impl)
    if mod is None:
        print(f"{impl}: not importable here ({note}); no figure recorded")
        return 0
    import torch

    if not torch.cuda.is_available():
        print(f"{impl}: needs a CUDA GPU (torch.cuda.is_available() is False); no figure recorded", file=sys.stderr)
        return 1
    from kvsplit.kernels.limits import cover_q_len
    from kvsplit.tuner.gpu import GpuTimer, graph_median_s, software_versions

    cases = build_cases(kind)
    # the same random data as the bf16 runs, stored as float8_e4m3fn by the timer for --kv-dtype fp8; q of q_len
    # rows per request
    timer = GpuTimer(
        **SHAPE,
        max_tokens=max(c["total_tokens"] for c in cases),
        max_batch=max(c["B"] for c in cases),
        kv_dtype="float8_e4m3fn" if kv_dtype == "fp8" else None,
        q_len=q_len,
    )
    fp8 = kv_dtype == "fp8"
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
        "kv_scales": [K_SCALE, V_SCALE] if fp8 else None,
        "kv_cache_bytes": 2 * timer.k_cache.numel() * timer.k_cache.element_size(),
    }
    print(json.dumps(meta), flush=True)
    prepare, peer = make_runner(impl, mod, timer)
    if peer is not None and peer.note:
        print(f"{impl}: {peer.note}", flush=True)
    rows = []
    for c in cases:
        lens = cover_q_len(c["kv_lens"], q_len)
        try:
            launch, output = prepare(lens)
            launch()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a peer's own error: say which call failed, record nothing
            if impl == "fa3" and fp8 and not rows:
                print(f"fa3: {failure_note(impl, exc, fp8=True)}; no figure recorded")
                return 0
            print(
                f"{impl}: failed on {c['set']} {c['family']} B={c['B']} ({type(exc).__name__}: {exc}); "
                "stopping, no figure recorded",
                file=sys.stderr,
            )
            return 1
        if int(lens.sum()) <= check_tokens:
            ref = reference_output(
                timer, lens, k_scale=K_SCALE, v_scale=V_SCALE, q_dtype=peer.q_dtype if peer is not None else None
            )
            err = float((output().float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
            if not err < (peer.check_limit if peer is not None else CHECK_LIMIT):
                print(
                    f"{impl}: output differs from the fp32 reference on {c['set']} {c['family']} B={c['B']} "
                    f"(max relative error {err:.3g}); stopping, no figure recorded",
                    file=sys.stderr,
                )
                return 1
        sec = graph_median_s(launch, warmup_ms=10.0, rep_ms=rep_ms)
        ratio = sec / timer.hbm_floor_s(lens)  # bytes actually read (1 per fp8 element) / measured read bandwidth
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
    peer_note = getattr(getattr(prepare, "__self__", None), "note", "")
    if peer_note:
        print(f"{impl}: {peer_note}")
    write_csv(out, rows)
    Path(str(out) + ".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{len(rows)} rows -> {out}")
    return 0


def applicable_impls(q_len: int) -> list[str]:
    """The implementations of :data:`IMPLS` that time ``q_len`` query tokens per request (the peers'
    :func:`kvsplit.tuner.peers.unsupported`), in :data:`IMPLS` order."""
    return [i for i in IMPLS if i not in PEERS or unsupported(i, q_len) is None]


def run_each(
    impls: Sequence[str] | None,
    out_dir: Path,
    *,
    cases: str,
    settings: Sequence[tuple[str, int]],
    rep_ms: float,
    check_tokens: int,
    timeout_s: float | None = None,
) -> tuple[list[Path], list[str]]:
    """Run this script once per implementation and setting, each in its own process, writing
    ``out_dir/<impl><tag>.csv``.

    ``settings`` are ``(kv_dtype, q_len)`` pairs (``kv_dtype`` one of :data:`KV_DTYPES`, ``q_len`` 1-8); ``impls``
    None means every implementation that takes each q_len (:func:`applicable_impls`). For a setting of q_len > 1,
    kvsplit is also run at q_len 1 with the same KV dtype (the verify-step ratio's denominator), once. Returns
    ``(CSVs written, runs whose process failed or timed out)``, a run named ``impl`` or ``impl (kv_dtype, q_len N)``
    when the sweep has more than one setting."""
    import subprocess

    out_dir.mkdir(parents=True, exist_ok=True)
    runs: list[tuple[str, str, int]] = []
    for kv_dtype, q_len in settings:
        for impl in impls if impls is not None else applicable_impls(q_len):
            runs.append((impl, kv_dtype, q_len))
        if q_len > 1 and (impls is None or "kvsplit" in impls):
            runs.append(("kvsplit", kv_dtype, 1))
    runs = list(dict.fromkeys(runs))  # a q_len-1 kvsplit run asked for twice runs once
    written, failed = [], []
    for impl, kv_dtype, ql in runs:
        csv_path = out_dir / f"{impl}{set_tag(kv_dtype, ql).replace('/', '_')}.csv"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--impl", impl, "--cases", cases, "--out", str(csv_path)]
        cmd += [
            "--kv-dtype",
            kv_dtype,
            "--q-len",
            str(ql),
            "--rep-ms",
            str(rep_ms),
            "--check-tokens",
            str(check_tokens),
        ]
        print(f"== {impl} (--kv-dtype {kv_dtype} --q-len {ql}), its own process", flush=True)
        try:
            rc = subprocess.run(cmd, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            print(f"{impl}: stopped after {timeout_s:g} s (--impl-timeout); no figure recorded", flush=True)
            rc = -1
        if rc != 0:
            if len(settings) > 1:
                failed.append(f"{impl} ({kv_dtype}, q_len {ql})")
            else:
                failed.append(impl if ql == settings[0][1] else f"{impl} (q_len {ql})")
        if rc == 0 and csv_path.exists():
            written.append(csv_path)
    return written, failed


def _kv_dtypes(text: str) -> list[str]:
    """``--kv-dtype``'s comma-separated values, ``float8_e4m3fn`` read as ``fp8`` (the kernels' alias,
    :data:`~kvsplit.kernels.limits.KV_DTYPE_SHORT`); ValueError naming the flag."""
    out = []
    for v in text.split(","):
        v = KV_DTYPE_SHORT.get(kv_dtype_named(v), v)
        if v not in KV_DTYPES:
            raise ValueError(
                f"--kv-dtype: expected {', '.join(KV_DTYPES)} or float8_e4m3fn (comma-separated), got {text!r}"
            )
        out.append(v)
    return list(dict.fromkeys(out))


def _q_lens(text: str) -> list[int]:
    """``--q-len``'s comma-separated values, each 1 to :data:`~kvsplit.kernels.limits.MAX_Q_LEN`; ValueError naming
    the flag."""
    out = []
    for v in text.split(","):
        try:
            q = int(v)
        except ValueError:
            q = 0
        if not 1 <= q <= MAX_Q_LEN:
            raise ValueError(
                f"--q-len: expected 1 to {MAX_Q_LEN} query tokens per request (comma-separated), got {text!r}"
            )
        out.append(q)
    return list(dict.fromkeys(out))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", choices=IMPLS, help="the implementation this process times")
    ap.add_argument(
        "--impls",
        metavar="LIST",
        help="comma-separated implementations, or 'all' (those that take --q-len): each in its own process, then "
        "the summary of their CSVs",
    )
    ap.add_argument("--out-dir", type=Path, default=Path("."), help="--impls: where the CSVs go")
    ap.add_argument("--impl-timeout", type=float, default=None, help="--impls: seconds per implementation's process")
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
        default="bfloat16",
        help="the KV cache's dtype: bfloat16, or fp8 (alias float8_e4m3fn; scales K_SCALE/V_SCALE); q stays bf16; "
        "with --impls a comma-separated list",
    )
    ap.add_argument(
        "--q-len",
        default="1",
        help="query tokens per request, 1-8 (speculative-decoding verify steps); with --impls a comma-separated list",
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
    try:
        kv_dtypes, q_lens = _kv_dtypes(args.kv_dtype), _q_lens(args.q_len)
    except ValueError as exc:
        ap.error(str(exc))
    if args.impls is not None:
        if args.impl is not None:
            ap.error("--impls: give --impl or --impls, not both")
        impls = None if args.impls == "all" else [i for i in args.impls.split(",") if i]
        bad = [i for i in impls or () if i not in IMPLS]
        if bad or impls == []:
            ap.error(f"--impls: expected 'all' or a comma-separated list of {', '.join(IMPLS)}, got {args.impls!r}")
        if args.impl_timeout is not None and not args.impl_timeout > 0:
            ap.error(f"--impl-timeout: expected seconds > 0, got {args.impl_timeout:g}")
        if impls is None:
            for q in q_lens:
                for impl in (i for i in IMPLS if i not in applicable_impls(q)):
                    print(f"{impl}: not run at --q-len {q} ({unsupported(impl, q)}); no figure recorded")
        written, failed = run_each(
            impls,
            args.out_dir,
            cases=args.cases,
            settings=[(k, q) for k in kv_dtypes for q in q_lens],
            rep_ms=args.rep_ms,
            check_tokens=args.check_tokens,
            timeout_s=args.impl_timeout,
        )
        if written:
            print(format_summary(summary(read_csvs(written), args.baseline)))
        else:
            print("no CSV was written: no summary")
        if failed:
            print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1 if failed else 0
    if args.impl is None:
        ap.error("--impl or --impls is required unless --summary is given")
    if len(kv_dtypes) > 1 or len(q_lens) > 1:
        ap.error("--kv-dtype, --q-len: one value each with --impl (lists are for --impls)")
    args.kv_dtype, args.q_len = kv_dtypes[0], q_lens[0]
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
