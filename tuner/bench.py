"""The benchmarks behind ``kvsplit bench``: baseline policies on the reference workload, published policies on trace batches.

``kvsplit bench --backend sim`` predicts, with :mod:`kvsplit.tuner.simulate`, the
time of each baseline policy's plan for the 48 reference cases (docs/concepts/design.md §6:
five families x B in 1..512 at ``--total-tokens``), prints the ratio to the HBM
floor per family x B, writes ``bench.csv`` and one PNG per family (time vs B,
one line per policy) under ``--out``. ``--backend gpu`` times the same plans
with the real kernel through :class:`kvsplit.tuner.gpu.GpuTimer` (CUDA only), and the peers' own kernels of
:data:`PEER_KERNELS` (:mod:`kvsplit.tuner.peers`) on the same cache and batches.
``--kv-dtype float8_e4m3fn`` and ``--q-len N`` (1-8) set the shape's KV cache dtype and query tokens per request:
the plans are made for them, the simulator models them (1 byte per fp8 element, ``G * q_len`` query rows per KV
head of a tile, ``q_len`` merged rows), the GPU timer builds the fp8 cache and ``[B * q_len, H_q, D]`` queries, the
HBM floor counts the bytes actually read, and a kv_len below q_len is raised to q_len (kv_lens count the new
tokens). A peer that is absent, or does not take the q_len (FlashInfer's decode wrapper: one token; its prefill
wrapper: verify steps), is named with the reason and given no figure.
``--anchors h200_peers.csv`` adds the FlashInfer threshold-cliff check
(skewed80 time over uniform time at the same B, simulated vs measured).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

__all__ = [
    "BASELINES",
    "FLASHINFER_KERNEL",
    "PEER_KERNELS",
    "LEGEND",
    "TRACE_BASELINES",
    "legend",
    "run_bench",
    "format_table",
    "cliff_comparison",
    "write_outputs",
    "run_trace_bench",
    "format_trace_table",
]

BASELINES: dict[str, tuple[str, dict[str, Any]]] = {
    "no_split": ("no_split", {}),
    "fixed8": ("fixed", {"num_splits": 8}),
    "fi_rule_tc": ("flashinfer", {"tensor_cores": True}),
    "fi_rule_notc": ("flashinfer", {"tensor_cores": False}),
    "fa3": ("fa3", {}),
    "balanced": ("balanced", {}),
}
"""Label -> (policy, params) of the baselines ``kvsplit bench`` compares (all on kvsplit's kernel)."""

FLASHINFER_KERNEL = "flashinfer_kernel"
"""Label of FlashInfer's own decode kernel (:mod:`kvsplit.tuner.peers`; GPU backend only)."""

PEER_KERNELS: dict[str, str] = {
    FLASHINFER_KERNEL: "flashinfer_decode",
    "flashinfer_prefill": "flashinfer_prefill",
    "flashinfer_batch_attention": "flashinfer_batch_attention",
    "fa3_kernel": "fa3",
}
"""Label -> :data:`kvsplit.tuner.peers.PEERS` name of the peers' own kernels ``kvsplit bench --backend gpu`` times
(``fa3`` is FA3's split *rule* on kvsplit's kernel, ``fa3_kernel`` FA3's kernel)."""

LEGEND = {
    "published": "time/floor column: the plan the service serves for the batch; source column: where its "
    "policy came from (tuned / simulated / fallback)",
    "no_split": "one work item per request, on kvsplit's kernel",
    "fixed8": "8 splits per request (SGLang/vLLM static count), on kvsplit's kernel",
    "fi_rule_tc": "FlashInfer's split rule, tensor-core path (2 CTAs/SM threshold), on kvsplit's kernel",
    "fi_rule_notc": "FlashInfer's split rule, CUDA-core path (occupancy threshold), on kvsplit's kernel",
    "fa3": "FlashAttention-3's varlen split rule (heavy first, persistent), on kvsplit's kernel",
    "balanced": "kvsplit's wave-aware even-chunk rule (the fallback), on kvsplit's kernel",
    FLASHINFER_KERNEL: "FlashInfer's own BatchDecodeWithPagedKVCacheWrapper (tensor cores, fa2 backend; "
    "kv_data_type fp8 for an fp8 cache), q_len 1, on the same cache and batches (GPU backend, when flashinfer imports)",
    "flashinfer_prefill": "FlashInfer's BatchPrefillWithPagedKVCacheWrapper (causal, qo_indptr of q_len per "
    "request), q_len > 1, on the same cache and batches (GPU backend, when flashinfer imports)",
    "flashinfer_batch_attention": "FlashInfer's persistent BatchAttention (causal, qo_indptr of q_len per request), "
    "on the same cache and batches (GPU backend, when flashinfer imports)",
    "fa3_kernel": "FlashAttention-3's flash_attn_with_kvcache (causal, num_splits=0: its own split heuristic), on "
    "the same cache and batches (GPU backend, when flash_attn_interface imports; fp8 only from an FP8 build)",
}
"""What each column of ``kvsplit bench`` is."""

_OLD_LABELS = {"flashinfer_tc": "fi_rule_tc", "flashinfer_notc": "fi_rule_notc"}


def legend(labels: Any) -> str:
    """One line per label saying what the column measures."""
    return "\n".join(f"  {lab:<18} {LEGEND.get(lab, '')}" for lab in labels)


def _load_peers(labels: Any, timer: Any) -> dict[str, Any]:
    """The :class:`kvsplit.tuner.peers.PeerKernel` of each peer label in ``labels`` on ``timer``; a peer that is
    absent or does not take the timer's q_len is printed with the reason (``no figure recorded``) and left out."""
    from . import peers

    out = {}
    for label in labels:
        if label in PEER_KERNELS:
            peer, note = peers.load(timer, PEER_KERNELS[label])
            if peer is None:
                print(f"{label}: {note}; no figure recorded")
            else:
                out[label] = peer
    return out


def _time_peer(label: str, peer: Any, kv_lens: Any, *, check: bool) -> float | None:
    """Seconds of ``peer`` on the batch ``kv_lens`` (CUDA-graph replays, do_bench median), its output first checked
    against the fp32 reference when ``check``; None (printed: the reason, no figure) when the call fails or the
    output is wrong."""
    import torch

    from .gpu import graph_median_s
    from .peers import failure_note, max_rel_error

    try:
        launch, output = peer.prepare(kv_lens)
        launch()
        torch.cuda.synchronize()
        if check:
            err = max_rel_error(peer, kv_lens, output())
            if not err < 2e-2:
                print(f"{label}: output differs from the fp32 reference (max relative error {err:.3g}); no figure")
                return None
        return graph_median_s(launch)
    except Exception as exc:  # noqa: BLE001 - a peer's own error: say why, record nothing
        print(f"{label}: {failure_note(peer.name, exc, fp8=peer.fp8)}; no figure recorded")
        return None


def run_bench(
    *,
    backend: str = "sim",
    gpu: str = "NVIDIA H200",
    num_qo_heads: int = 32,
    num_kv_heads: int = 4,
    head_dim: int = 128,
    dtype: str = "bfloat16",
    page_size: int = 16,
    total_tokens: int = 262_144,
    policies: tuple[str, ...] = tuple(BASELINES),
    calibration: Optional[dict] = None,
    kv_dtype: str | None = None,
    q_len: int = 1,
    database_url: str | None = None,
    say: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Time (or predict) every baseline on the reference cases.

    ``kv_dtype`` (None: ``dtype``; ``"float8_e4m3fn"``/``"fp8"``) and ``q_len`` (1-8) are the shape's KV cache dtype
    and query tokens per request (module docstring). Labels of :data:`PEER_KERNELS` are timed with
    ``backend="gpu"`` only; an absent or inapplicable peer is printed and has no rows.

    With ``backend="sim"`` the simulator (:class:`kvsplit.tuner.backends.SimBackend`, as ``kvsplit tune`` builds it)
    uses ``calibration`` (a :meth:`kvsplit.tuner.simulate.Calibration.to_dict` document) when given, else the
    calibration of the store at ``database_url`` for the shape's GPU, KV dtype and q_len
    (:func:`kvsplit.tuner.search.calibration_for`, with its read bandwidth), else the GPU's defaults; ``say``
    gets one line naming which (``"calibration: ..."``) and the note of one that stands in for the exact shape.

    Returns
    -------
    list of dict
        One row per (policy, family, B): ``policy``, ``family``, ``B``,
        ``time_us``, ``floor_us``, ``ratio`` (time / HBM floor), ``num_work_items`` (0 for a peer's kernel).

    Raises
    ------
    ValueError
        Unknown backend or policy label, a peer label with the simulator, an invalid shape (``kv_dtype`` and
        ``q_len`` named as such); ``--backend gpu`` without CUDA.
    """
    from ..kernels.device import resolve_device
    from ..kernels.limits import cover_q_len
    from ..kernels.plan import make_plan
    from ..kernels.shape import Shape
    from .workloads import family_kv_lens, reference_cases

    if backend not in ("sim", "gpu"):
        raise ValueError(f"backend: expected 'sim' or 'gpu', got {backend!r}")
    policies = tuple(_OLD_LABELS.get(p, p) for p in policies)  # the labels of earlier releases keep working
    unknown = [p for p in policies if p not in BASELINES and p not in PEER_KERNELS]
    if unknown:
        raise ValueError(f"policies: unknown labels {unknown}; known: {list(BASELINES) + list(PEER_KERNELS)}")
    on_gpu = [p for p in policies if p in PEER_KERNELS]
    if on_gpu and backend != "gpu":
        who = "FlashAttention-3" if PEER_KERNELS[on_gpu[0]] == "fa3" else "FlashInfer"
        raise ValueError(f"policies: {on_gpu[0]} is {who}'s kernel, timed on a GPU only (--backend gpu)")
    shape = Shape.of(
        device=gpu,
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        page_size=page_size,
        kv_dtype=kv_dtype,
        q_len=q_len,
    )
    group = shape.group_size
    dtype = shape.dtype
    kd = None if shape.kv_dtype == dtype else shape.kv_dtype
    q_len = shape.q_len

    timer = None
    if backend == "gpu":
        try:
            import torch
        except ImportError as exc:  # pragma: no cover
            raise ValueError("backend: 'gpu' needs torch with CUDA") from exc
        if not torch.cuda.is_available():
            raise ValueError("backend: 'gpu' needs a CUDA device (use --backend sim)")
        from .gpu import GpuTimer  # lazy: imports triton and the kernel

        timer = GpuTimer(
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            page_size=page_size,
            max_tokens=total_tokens + 512 * q_len,
            max_batch=512,
            kv_dtype=kd,
            q_len=q_len,
        )
        dev = resolve_device(torch.cuda.get_device_name())
    else:
        dev = shape.device
    from .simulate import Calibration

    def case_lens(family: str, B: int) -> Any:
        L = family_kv_lens(family, B, total_tokens)
        return cover_q_len(L, q_len)

    sim = None
    if timer is None:
        from .backends import make_backend
        from .calibrate import calibrate_command
        from .search import calibration_for, describe_calibration

        stored, bw = (None, None)
        if calibration is not None:
            Calibration.from_dict(calibration)  # a bad document is refused here, naming the calibration
            stored = {"constants": dict(calibration)}
            text = "the --calibration document"
        else:
            if database_url is not None:
                stored, bw = calibration_for(
                    database_url, shape.gpu, "sim", dtype=dtype, kv_dtype=shape.kv_dtype, q_len=q_len
                )
            text = describe_calibration(stored, bw, shape.gpu)
            if database_url is None:
                text = "no store read, " + text.removeprefix("none stored: ")
            if stored is not None and stored["note"]:
                text += f"\nnote: {stored['note']}"
            elif stored is None:
                text += f"; `{calibrate_command(shape.gpu, dtype, shape.kv_dtype, q_len)}` stores a fit of this shape"
        if say is not None:
            say(f"calibration: {text}")
        sim = make_backend("sim", shape=shape, calibration=stored, read_bandwidth_gbps=bw)
    peer_kernels = _load_peers(policies, timer) if timer is not None else {}
    rows: list[dict[str, Any]] = []
    for label in policies:
        if label in PEER_KERNELS:
            if label not in peer_kernels:
                continue
            got = []
            for i, (family, B) in enumerate(reference_cases(total_tokens)):
                L = case_lens(family, B)
                t = _time_peer(label, peer_kernels[label], L, check=i == 0)
                if t is None:
                    got = []  # no figure for a peer that failed or was wrong on any case
                    break
                floor = timer.hbm_floor_s(L)
                got.append(
                    {
                        "policy": label,
                        "family": family,
                        "B": B,
                        "time_us": t * 1e6,
                        "floor_us": floor * 1e6,
                        "ratio": t / floor,
                        "num_work_items": 0,
                    }
                )
            rows += got
            continue
        policy, params = BASELINES[label]
        params = dict(params)
        if policy == "flashinfer" and not params.get("tensor_cores", True):
            params["group_size"] = group
        for family, B in reference_cases(total_tokens):
            L = case_lens(family, B)
            plan = make_plan(
                L,
                num_kv_heads=num_kv_heads,
                device=dev,
                policy=policy,
                params=params,
                head_dim=head_dim,
                page_size=page_size,
                dtype=dtype,
                kv_dtype=kd,
                q_len=q_len,
                num_qo_heads=shape.num_qo_heads,
            )
            if timer is not None:
                t = timer.time_plan(plan)
                floor = timer.hbm_floor_s(L)
            else:
                t = sim.time_plan(plan)
                floor = sim.hbm_floor_s(L)
            rows.append(
                {
                    "policy": label,
                    "family": family,
                    "B": B,
                    "time_us": t * 1e6,
                    "floor_us": floor * 1e6,
                    "ratio": t / floor,
                    "num_work_items": plan.num_work_items,
                }
            )
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """Ratio-to-floor table: one block per policy, families x B, plus geomean and worst."""
    out = []
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    Bs = sorted({r["B"] for r in rows})
    for p in policies:
        pr = [r for r in rows if r["policy"] == p]
        ratios = [r["ratio"] for r in pr]
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        out.append(f"{p}: time / HBM floor (geomean {geo:.2f}, worst {max(ratios):.2f})")
        out.append("  family    " + "".join(f"{b:>8}" for b in Bs))
        for fam in dict.fromkeys(r["family"] for r in pr):
            cells = {r["B"]: r["ratio"] for r in pr if r["family"] == fam}
            out.append(f"  {fam:<9} " + "".join(f"{cells[b]:8.2f}" if b in cells else f"{'-':>8}" for b in Bs))
        out.append("")
    return "\n".join(out)


def cliff_comparison(rows: list[dict[str, Any]], anchors_csv: Path, total_tokens: int) -> str:
    """Skewed80 / uniform time at the same B: simulated FlashInfer policy vs h200_peers.csv."""
    meas: dict[tuple[str, str, int], float] = {}
    with open(anchors_csv, newline="") as f:
        for r in csv.DictReader(f):
            if int(r["T"]) == total_tokens:
                meas[(r["impl"], r["dist"], int(r["B"]))] = float(r["time_us"])
    sim = {(r["policy"], r["family"], r["B"]): r["time_us"] for r in rows}
    lines = [f"skewed80 / uniform time at the same B (FlashInfer; measured = h200_peers.csv, T={total_tokens})"]
    Bs = sorted({r["B"] for r in rows})
    lines.append("  " + f"{'':<26}" + "".join(f"{b:>7}" for b in Bs))
    for label, impl in (("fi_rule_tc", "flashinfer_decode_tc"), ("fi_rule_notc", "flashinfer_decode_notc")):
        for name, src, key in (("sim " + label, sim, label), ("measured " + impl, meas, impl)):
            cells = []
            for b in Bs:
                a, u = src.get((key, "skewed80", b)), src.get((key, "uniform", b))
                cells.append(f"{a / u:7.2f}" if a and u else f"{'-':>7}")
            lines.append(f"  {name:<26}" + "".join(cells))
    return "\n".join(lines)


def write_outputs(rows: list[dict[str, Any]], out: Path, title: str) -> list[Path]:
    """Write ``bench.csv`` and ``<family>.png`` (time vs B per policy, log-log) under ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = [out / "bench.csv"]
    with open(written[0], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})
    for fam in dict.fromkeys(r["family"] for r in rows):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for p in dict.fromkeys(r["policy"] for r in rows):
            pr = [r for r in rows if r["policy"] == p and r["family"] == fam]
            ax.plot([r["B"] for r in pr], [r["time_us"] for r in pr], marker="o", label=p)
        floor = [r for r in rows if r["family"] == fam and r["policy"] == rows[0]["policy"]]
        ax.plot([r["B"] for r in floor], [r["floor_us"] for r in floor], "k--", label="HBM floor")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size B")
        ax.set_ylabel("time (µs)")
        ax.set_title(f"{title}: {fam}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{fam}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def run_trace_bench(
    trace: str,
    *,
    database_url: str,
    backend: str = "sim",
    gpu: str = "NVIDIA H200",
    num_qo_heads: int = 32,
    num_kv_heads: int = 4,
    head_dim: int = 128,
    dtype: str = "bfloat16",
    page_size: int = 16,
    batch_sizes: tuple[int, ...] = (16, 64, 256),
    batches: int = 3,
    seed: int = 11,
    kv_dtype: str | None = None,
    q_len: int = 1,
) -> list[dict[str, Any]]:
    """The published policy vs every baseline on decode batches replayed from ``trace``.

    ``kv_dtype`` and ``q_len``: the shape's KV cache dtype and query tokens per request, as :func:`run_bench` (the
    table serves their family; kv_lens below q_len are raised to q_len). With ``backend="gpu"`` the peers' kernels
    of :data:`PEER_KERNELS` that are installed and take the q_len are timed too.

    For each target batch size, ``batches`` held-out batches of the trace
    (:func:`kvsplit.tuner.workloads.trace_batches`) are planned by the store's
    :class:`~kvsplit.kernels.policy_table.PolicyTable` (the plan the service would
    answer: tuned / simulated / fallback) and by each baseline, then timed on the
    GPU or predicted by the simulator with the store's calibration of the shape's GPU, KV dtype and q_len
    (:func:`kvsplit.tuner.search.calibration_for`).

    Returns one row per (batch, policy): ``B_target``, ``batch``, ``B``,
    ``tokens``, ``policy``, ``source``, ``time_us``, ``floor_us``, ``ratio``.
    """
    import numpy as np

    from ..kernels.limits import cover_q_len
    from ..kernels.plan import make_plan
    from ..kernels.policy_table import PolicyTable
    from ..kernels.shape import Shape
    from .backends import make_backend
    from .published import load_table_doc
    from .search import calibration_for
    from .workloads import trace_batches

    table = PolicyTable.from_json(load_table_doc(database_url))
    shape = Shape.of(
        device=gpu,
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        page_size=page_size,
        kv_dtype=kv_dtype,
        q_len=q_len,
    )
    cal, bw = calibration_for(
        database_url, shape.gpu, backend, dtype=shape.dtype, kv_dtype=shape.kv_dtype, q_len=shape.q_len
    )
    held_all = [(B, trace_batches(trace, B, num_train=1, num_heldout=batches, seed=seed)[1]) for B in batch_sizes]
    held_all = [(B, [cover_q_len(b, shape.q_len) for b in hs]) for B, hs in held_all]
    max_tokens = max(int(np.sum(b)) for _, hs in held_all for b in hs)
    max_batch = max(len(b) for _, hs in held_all for b in hs)
    be = make_backend(
        backend, shape=shape, calibration=cal, read_bandwidth_gbps=bw, max_tokens=max_tokens, max_batch=max_batch
    )
    make_plan_kw = {**shape.plan_kwargs(), "num_qo_heads": shape.num_qo_heads}
    peer_kernels = _load_peers(PEER_KERNELS, be.timer) if backend == "gpu" else {}
    rows = []
    for B, held in held_all:
        for j, lens in enumerate(held):
            plan, _, info = table.plan(lens, shape)
            plans = [("published", info.get("source", "?"), plan)]
            for label in TRACE_BASELINES:
                pol, params = BASELINES[label]
                plans.append((label, "baseline", make_plan(lens, policy=pol, params=params, **make_plan_kw)))
            floor = be.hbm_floor_s(lens)
            for label, src, pl in plans:
                t = be.time_plan(pl)
                rows.append(
                    {
                        "B_target": B,
                        "batch": j,
                        "B": len(lens),
                        "tokens": int(np.sum(lens)),
                        "policy": label,
                        "source": src,
                        "time_us": t * 1e6,
                        "floor_us": floor * 1e6,
                        "ratio": t / floor,
                    }
                )
            for label in list(peer_kernels):
                t = _time_peer(label, peer_kernels[label], lens, check=j == 0 and B == held_all[0][0])
                if t is None:  # no figure for a peer that failed or was wrong on any batch
                    del peer_kernels[label]
                    rows = [r for r in rows if r["policy"] != label]
                    continue
                rows.append(
                    {
                        "B_target": B,
                        "batch": j,
                        "B": len(lens),
                        "tokens": int(np.sum(lens)),
                        "policy": label,
                        "source": "baseline",
                        "time_us": t * 1e6,
                        "floor_us": floor * 1e6,
                        "ratio": t / floor,
                    }
                )
    return rows


TRACE_BASELINES = ("balanced", "fa3", "fi_rule_tc", "fi_rule_notc", "no_split")
"""Baselines of ``kvsplit bench --trace`` on kvsplit's kernel (plus FlashInfer's kernel on a GPU)."""


def format_trace_table(rows: list[dict[str, Any]]) -> str:
    """Per target B: the published plan's time / floor and its geomean speedup over each baseline."""
    import collections

    by = collections.defaultdict(dict)
    src = collections.defaultdict(set)
    for r in rows:
        by[(r["B_target"], r["batch"])][r["policy"]] = r
        if r["policy"] == "published":
            src[r["B_target"]].add(r["source"])
    have = {r["policy"] for r in rows}
    labels = tuple(lab for lab in (*TRACE_BASELINES, *PEER_KERNELS) if lab in have)

    def gm(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs))

    lines = [
        f"{'B':>5} {'batches':>7} {'source':>10} {'time/floor':>10} " + " ".join(f"{'vs ' + l:>19}" for l in labels)
    ]
    for B in sorted({k[0] for k in by}):
        ks = [k for k in by if k[0] == B]
        ratio = gm([by[k]["published"]["ratio"] for k in ks])
        sp = [gm([by[k][l]["time_us"] / by[k]["published"]["time_us"] for k in ks]) for l in labels]
        lines.append(
            f"{B:>5} {len(ks):>7} {','.join(sorted(src[B])):>10} {ratio:>10.3f} " + " ".join(f"{x:>18.2f}x" for x in sp)
        )
    lines.append("columns: 'vs X' = X's time / the published plan's time (geomean over the batches); the plans:")
    lines.append(legend(("published", *labels)))
    for lab in PEER_KERNELS:
        if lab not in have:
            lines.append(f"  ({lab}: not measured -- GPU backend, the peer installed and taking the q_len only)")
    return "\n".join(lines)
