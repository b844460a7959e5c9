"""DecodeWrapper's CUDA-graph path against the served eager plan, and its merge variants, on the H200.

    python bench/graph_ab.py --out $OUT [--sets trace,ref] [--T 1048576,262144] [--B ...]
                             [--max-batch 1024] [--variants g4,g1,g1ov,b1,b1ov] [--budget-s 200]

An engine that replays one CUDA graph per decode step runs ``DecodeWrapper(use_cuda_graph=True)``: the shipped
table re-picks the rule's parameters on the host, the device planner computes the work list on the GPU, and the
graph's launches never depend on the batch. Its stage 1 runs the persistent schedule with one tile for every step
(from round 17 by default ``limits.graph_default_config``'s, two KV heads per work tile; before, (128, 4, 2) with
one; from round 16 a candidate's ``|hN`` packs N KV heads per tile in graph mode too); its merge grid is
``max_batch_size`` programs per query head, those past the step's merged requests exiting at once.

Per case (bench/data/sweep_cases.json, H_kv = ``--num-kv-heads``, default 4) and in one process, back to back:

- ``served``: the eager hot path of the plan the shipped table serves the batch (``decode_attention``, plan
  uploaded, ``validate=False``), the figure every other table of docs/perf.md is given in;
- for each graph of ``--graphs`` (``LABEL=SPEC``, SPEC one of ``table`` (the shipped table re-picks the rule's
  parameters, on the wrapper's default tile: what an engine gets; ``DecodeWrapper._entry_rule``), ``table+NAME``
  (the same on candidate NAME's tile) or a candidate name (that one rule for every batch), each optionally
  ``@P``: P persistent programs per SM, ``@r`` the tile's residency; default the wrapper's) and each merge variant
  of ``--variants``:
  - ``gN``: the graph path as ``DecodeWrapper.run`` launches it (``--max-batch`` merge programs per query head),
    its merge on N warps (``g4`` is what ``run`` does today);
  - ``bN``: the same with a merge grid of B programs per query head (a wrapper whose ``max_batch_size`` is the
    batch's own size: the cost of the idle merge programs is ``gN - bN``);
  - suffix ``ov``: the overlapped merge (``merge_overlap=True``) on that launch; ``run``: ``DecodeWrapper.run``
    itself (its default merge). From round 15 on ``launch_decode`` holds a device-resident merge grid to B
    programs per query head, so ``gN`` and ``bN`` time the same grid; call 2 of round 15 ran before that.
  SPEC ``tableold``: ``table`` with round 14's re-pick (the entry's rule and ctas_per_sm kept on any tile).

Each is a CUDA-graph replay of the launch alone (the device planner runs once before capture; its cost is
measured in docs/perf.md's engine decode loop), timed with ``triton.testing.do_bench`` (median) on random bf16
KV on shuffled pages above the 60 MB L2. Every graph-path output is checked against the served plan's
(equal to 2e-2: same math, another partition), and the overlapped merge's counters must be zero after replays.
One JSON line per case in OUT/graph_ab.jsonl; stdout gives each time over the read floor.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_sweep import Bench, add_ref_case_args, named, ref_cases  # noqa: E402  (the sweeps' bench and case selection)
from l2_state import graph_of  # noqa: E402  (one warm-up launch, capture, one replay)

from kvsplit.kernels import decode as dec  # noqa: E402
from kvsplit.kernels.plan import make_plan  # noqa: E402
from kvsplit.kernels.policy_table import PolicyTable  # noqa: E402
from kvsplit.kernels.wrapper import DecodeWrapper, GraphOptions  # noqa: E402
from kvsplit.tuner.gpu import software_versions  # noqa: E402

GPU = "NVIDIA H200"


def parse_variant(v: str) -> tuple[bool, int, bool] | None:
    """``(full_grid, merge_warps, overlap)`` of a graph variant name (module doc); None for ``run``."""
    if v == "run":
        return None
    ov = v.endswith("ov")
    core = v[:-2] if ov else v
    if len(core) < 2 or core[0] not in "gb" or not core[1:].isdigit() or int(core[1:]) not in (1, 2, 4, 8):
        raise ValueError(f"--variants: unknown variant {v!r} (expected g1/g2/g4/g8 or b1.., optional suffix ov)")
    return core[0] == "g", int(core[1:]), ov


TILE_KNOBS = ("block_n", "num_warps", "num_stages", "prefetch", "next_item", "heads_per_tile")


def make_wrapper(spec: str, table: PolicyTable, max_batch: int, max_work: int, hkv: int = 4) -> DecodeWrapper:
    """The CUDA-graph DecodeWrapper of a ``--graphs`` SPEC (module doc)."""
    spec, _, per_sm = spec.partition("@")
    kw: dict = {"table": None, "policy": None, "params": None}
    old = spec == "tableold"
    if spec in ("table", "tableold"):
        kw["table"] = table
    elif spec.startswith("table+"):
        kw["table"] = table
        kw["params"] = {k: v for k, v in named(spec[6:])[1][1].items() if k in TILE_KNOBS}
    else:
        pol, prm = named(spec)[1]
        kw["policy"], kw["params"] = pol, dict(prm)
    w = DecodeWrapper(32, hkv, 128, page_size=16, dtype="bfloat16", device="cuda", max_batch_size=max_batch,
                      use_cuda_graph=True, graph=GraphOptions(max_work_items=max_work), **kw)
    if per_sm:
        P = w.graph_residency if per_sm == "r" else int(per_sm)  # the graph tile's resident CTAs per SM
        w = DecodeWrapper(32, hkv, 128, page_size=16, dtype="bfloat16", device="cuda", max_batch_size=max_batch,
                          use_cuda_graph=True, graph=GraphOptions(max_work_items=max_work, num_programs=P * 132),
                          **kw)
    if old:  # round 14's re-pick: the entry's ctas_per_sm on the graph's tile, whatever tile it was tuned on
        w._other_tile = lambda params: False
    return w


def main() -> None:
    ap = argparse.ArgumentParser()
    add_ref_case_args(ap)
    ap.add_argument("--variants", default="g4,g1,g1ov,b4,b1,b1ov")
    ap.add_argument("--graphs", default="table=table", help="comma-separated LABEL=SPEC (module doc)")
    ap.add_argument("--max-batch", type=int, default=1024, help="the wrapper's max_batch_size")
    ap.add_argument("--num-kv-heads", type=int, default=4, help="H_kv of the cases kept (H_q 32): 4, or 8 for "
                                                                "the llama8b set")
    ap.add_argument("--policies", default="kernels/data/h200_policies.json")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--rep-ms", type=float, default=10.0)
    args = ap.parse_args()
    t0 = time.time()
    variants = args.variants.split(",")
    for v in variants:
        parse_variant(v)
    hkv = args.num_kv_heads
    cases = [c for c in ref_cases(args) if c.get("num_kv_heads", 4) == hkv and len(c["kv_lens"]) <= args.max_batch]
    table = PolicyTable.from_export(json.load(open(args.policies)))
    log = open(os.path.join(args.out, "graph_ab.jsonl"), "a")
    log.write(json.dumps({"kind": "versions", **software_versions()}) + "\n")
    bench = Bench(32, hkv, max_tokens=max(sum(c["kv_lens"]) for c in cases) + 4096, max_batch=args.max_batch)
    timer = bench.t
    bw = timer.read_bandwidth()
    log.write(json.dumps({"kind": "bandwidth", "bytes_per_s": bw}) + "\n")
    print(f"read bandwidth {bw / 1e12:.3f} TB/s  [{time.time() - t0:.0f}s]", flush=True)
    max_work = args.max_batch + 64 * 132
    graphs = {}
    for item in args.graphs.split(","):
        label, _, spec = item.partition("=")
        graphs[label] = make_wrapper(spec or label, table, args.max_batch, max_work, hkv)
        c = graphs[label].config
        print(f"graph {label}: {spec} tile ({c.block_n}, {c.num_warps}, {c.num_stages}) prefetch {c.prefetch} "
              f"next_item {c.next_item} heads_per_tile {c.heads_per_tile}, {c.num_programs} programs", flush=True)
    cols = [f"{label}:{v}" for label in graphs for v in variants]
    ratios: dict[str, list[float]] = {k: [] for k in cols}
    print(f"{'case':34s} {'served':>7s} " + " ".join(f"{k:>12s}" for k in cols) + "   (time / read floor)",
          flush=True)
    for c in cases:
        if time.time() - t0 > args.budget_s:
            print("budget reached; stopping", flush=True)
            break
        L = np.asarray(c["kv_lens"], dtype=np.int64)
        B = len(L)
        b = timer.batch(L)
        floor = timer.hbm_floor_s(L)
        pol, prm = c["served"]["policy"], c["served"]["params"]
        p = make_plan(L, num_kv_heads=hkv, device=GPU, policy=pol, params=prm)
        times = {"served": bench.time_plan(p, args.rep_ms)}
        ref = bench.out[B].clone()
        diff, rules = {}, {}
        for label, w in graphs.items():
            try:
                w.plan(b["kv_indptr"], b["kv_indices"], b["kv_lens"], kv_lens_host=L)
            except ValueError as exc:  # e.g. a host plan above max_work_items
                print(f"  {c['id']} {label}: {exc}", flush=True)
                continue
            torch.cuda.synchronize()
            counts = [int(x) for x in w.bufs.counts.tolist()]
            rules[label] = {"policy": w._graph_policy[0], "params": w._graph_policy[1], "planner": w.planner,
                            "counts": counts}
            if counts[0] > max_work:
                print(f"  {c['id']} {label}: {counts[0]} work items over max_work_items", flush=True)
                continue
            for v in variants:
                pv = parse_variant(v)
                out = torch.empty_like(b["q"])
                if pv is None:  # DecodeWrapper.run as it launches by default
                    g = graph_of(lambda: w.run(b["q"], timer.k_cache, timer.v_cache, out=out))
                else:
                    full, warps, ov = pv
                    g = graph_of(lambda: dec.launch_decode(
                        b["q"], timer.k_cache, timer.v_cache, b["kv_indptr"], b["kv_indices"], w.bufs.arrays(),
                        w.config, out=out, workspace=w.workspace, counts=w.bufs.counts,
                        max_merge=args.max_batch if full else B, merge_warps=warps, merge_overlap=ov))
                k = f"{label}:{v}"
                times[k] = triton.testing.do_bench(g.replay, warmup=2, rep=args.rep_ms, return_mode="median") * 1e-3
                del g
                left = int(w.workspace.sync.abs().sum())
                if left:
                    print(f"  {k}: {left} arrivals left in workspace.sync after the replays", flush=True)
                    w.workspace.sync.zero_()
                diff[k] = float((out.float() - ref.float()).abs().max())
                if diff[k] > 2e-2:
                    print(f"  {k}: output differs from the served plan's by {diff[k]:.3g}", flush=True)
        rec = {"kind": "graph_ab", "case": c["id"], "set": c["set"], "family": c["family"], "B": B, "T": c["T"],
               "served": [pol, prm], "graphs": rules, "max_batch": args.max_batch, "floor_s": floor,
               "times": times, "max_abs_diff_vs_served": diff}
        log.write(json.dumps(rec, default=str) + "\n")
        log.flush()
        for k in cols:
            if k in times:
                ratios[k].append(times[k] / times["served"])
        name = f"{c['set']} {c['family']} B={B} T={c['T']}"
        print(f"{name:34s} {times['served'] / floor:7.3f} "
              + " ".join(f"{times[k] / floor if k in times else float('nan'):12.3f}" for k in cols)
              + f"  [{time.time() - t0:.0f}s]", flush=True)
    g = lambda x: math.exp(sum(map(math.log, x)) / len(x)) if x else float("nan")  # noqa: E731
    for v, x in ratios.items():
        if x:
            print(f"{v:16s} / served: geomean {g(x):.4f} range {min(x):.4f}-{max(x):.4f} n={len(x)}")


if __name__ == "__main__":
    main()
