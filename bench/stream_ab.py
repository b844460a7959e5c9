"""Where the decode kernel's time above the read floor goes, and A/B of its K/V load path (H200; issue 12).

    python bench/stream_ab.py --out $OUT [--budget-s 300] [--rep-ms 10] [--plans P1,P2] [--variants decode,h2]
        [--cases T:family:B,...]

For each case (Qwen3-30B-A3B's shape: H_q 32, H_kv 4, D 128, bf16, page 16) and plan, timed back to back in
one process, CUDA-graph replays under ``triton.testing.do_bench`` (median), the hot path:

- ``decode``: the kernel as shipped (stage 1 + merge, ``launch_decode``'s defaults);
- ``s1``: stage 1 alone (no merge launch): the merge's share;
- ``pf``: the same plan with ``prefetch=True`` (page ids of the next tile loaded one iteration ahead);
- ``seq_pages``: ``decode`` on a page table of consecutive pages (the cache's first pages in order) instead
  of the shuffled one: what the page shuffle costs;
- ``gather``: a read-only kernel walking the plan's work tiles exactly as stage 1 does (same CTAs, tile
  order, BLOCK_N, warps, page-table walk with the page ids one tile ahead) and summing K and V, no softmax:
  the *layout floor* of the plan, i.e. what streaming the paged cache in this order costs without the
  attention math;
- ``stream``: the project's streaming-read kernel (``kvsplit.tuner.gpu``) over the same number of
  contiguous bytes;
- ``paged`` (per case, not per plan): the *paged read floor*, a read-only kernel that reads the batch's pages
  whole, in the shuffled page table's order: each program reads a few pages, each page's K and V
  as one contiguous ``[page_size * H_kv * D]`` box (16 KB each at the reference shape), page ids loaded
  independently of each other, and sums them (``paged_p{P}w{W}``: P pages per program, W warps; the fastest
  of them is the floor): what any kernel over this paged cache pays before the attention
  math, the split and the merge; ``paged_seq`` the same on consecutive pages; ``pg1cta_u{U}w{W}`` the same
  read by one program per SM (a grid-stride loop, U pages' loads issued together, W warps): what one CTA
  per SM can stream from this cache;
- ``h2``: the plan's own work list with ``KernelConfig.heads_per_tile = 2`` (two KV heads per work tile,
  half the tiles; its output is compared with ``decode``'s). Round 8's run (docs/data/h200_r8/heads2_ab.*)
  passed the knob through a temporary launcher keyword into the same kernel code.

- ``nx`` (plans with ``prefetch``): the same plan with ``KernelConfig.next_item`` toggled (the look-ahead over a
  CTA's work items: the next items' work entries, page-table offsets, q and first page ids loaded while the
  current item streams); output compared with ``decode``'s. Round 11's runs passed it as ``launch_decode``'s
  ``next_item`` keyword: ``nx2`` of docs/data/h200_r11/nx2_ab.log is this knob. Two earlier variants of that run
  (docs/data/h200_r11/nx_ab.log: ``nx1`` carried the entries only, its ``nx2`` also prefetched the next item's
  first K/V tiles into L2 with PTX ``prefetch.global.L2``) lost and were removed;
- ``hnd``, ``hnd_s1``, ``gather_hnd``: ``decode``, ``s1`` and ``gather`` over the same K/V values stored HND
  (``[pages, H_kv, page_size, D]`` in memory, FlashInfer's other layout: one KV head's rows of a page are one
  contiguous ``page_size * D`` block instead of ``page_size`` rows ``H_kv * D`` apart), passed as the NHD-shaped
  strided view ``launch_decode`` takes (``hnd``'s output is compared with ``decode``'s: the same values);
- ``decode_b``: ``decode`` again, timed after the other variants (the noise of a back-to-back pair).

Round 10 timed ``flat`` and ``flat3`` variants (one pipelined loop over every block of a tile's items,
docs/data/h200_r10/flat_items.patch, flat_ab.log, flat3_ab.log): lost, removed.

Round 8 also timed a ``swap`` variant, both products transposed so that ``tl.dot`` compiles to wgmma
(docs/data/h200_r8/swap_ab.patch, swap_ab.log): 0.8-5.5 % slower per case, removed.

Round 6's run (docs/data/h200_r6/stream_ab.jsonl) also timed an ``evict_first`` variant (the K/V loads with
that L2 hint, through a ``launch_decode`` keyword added for the run): within 0.4 % of ``decode`` everywhere, so
the keyword was removed again.

Ratios are to the read floor (KV bytes / streaming-read bandwidth over 4 GiB, measured in this run). One
JSON line per (case, plan) in OUT/stream_ab.jsonl; a table is printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_sweep import named  # noqa: E402  (candidate names of the sweeps)
from l2_state import graph_of  # noqa: E402

from kvsplit.kernels import decode as dec  # noqa: E402
from kvsplit.kernels.plan import make_plan  # noqa: E402
from kvsplit.tuner.gpu import GpuTimer, _stream_read_kernel, software_versions  # noqa: E402
from kvsplit.tuner.workloads import family_kv_lens  # noqa: E402

GPU = "NVIDIA H200"
CASES = [(1 << 20, "uniform", 1), (1 << 20, "uniform", 8), (1 << 20, "uniform", 64), (1 << 20, "skewed80", 64),
         (1 << 18, "uniform", 8), (1 << 18, "uniform", 64), (1 << 18, "skewed80", 128), (1 << 18, "skewed80", 512)]
PLANS = ["balanced|c4|n64w4s2", "stream_k|c3|n128w4s2", "stream_k|c1|n128w8s3|pf"]


@triton.jit
def _gather_read_kernel(
    K, V, OUT, KV_INDPTR, KV_INDICES, WORK_REQ, WORK_START, WORK_END, CTA_INDPTR,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
    PAGE_SIZE: tl.constexpr, H_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # stage 1's walk (kernels/decode.py, the prefetching loop) with the attention math replaced by a sum
    tile = tl.program_id(0)
    c = tile // H_KV
    h = tile % H_KV
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for it in range(tl.load(CTA_INDPTR + c), tl.load(CTA_INDPTR + c + 1)):
        req = tl.load(WORK_REQ + it).to(tl.int64)
        start = tl.load(WORK_START + it)
        end = tl.load(WORK_END + it)
        page_base = tl.load(KV_INDPTR + req)
        t = start + offs_n
        page_nx = tl.load(KV_INDICES + page_base + t // PAGE_SIZE, mask=t < end, other=0)
        for n0 in range(start, end, BLOCK_N):
            page = page_nx.to(tl.int64)
            t = n0 + offs_n
            mask_n = t < end
            t1 = t + BLOCK_N
            page_nx = tl.load(KV_INDICES + page_base + t1 // PAGE_SIZE, mask=t1 < end, other=0)
            in_page = (t % PAGE_SIZE).to(tl.int64)
            k = tl.load(K + (page * stride_kp + in_page * stride_ks + h * stride_kh)[:, None] + offs_d[None, :],
                        mask=mask_n[:, None], other=0.0)
            v = tl.load(V + (page * stride_vp + in_page * stride_vs + h * stride_vh)[:, None] + offs_d[None, :],
                        mask=mask_n[:, None], other=0.0)
            acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(OUT + tile, tl.sum(tl.sum(acc, axis=1), axis=0))


@triton.jit
def _paged_read_kernel(K, V, OUT, KV_INDICES, n_pages, stride_kp, stride_vp,
                       PAGE_ELEMS: tl.constexpr, PAGES_PER_PROG: tl.constexpr):
    # the paged read floor: whole pages (all KV heads, K and V each one contiguous box), no attention math
    pid = tl.program_id(0)
    offs = tl.arange(0, PAGE_ELEMS).to(tl.int64)
    acc = tl.zeros([PAGE_ELEMS], dtype=tl.float32)
    for i in tl.static_range(PAGES_PER_PROG):
        j = pid * PAGES_PER_PROG + i
        ok = j < n_pages
        page = tl.load(KV_INDICES + j, mask=ok, other=0).to(tl.int64)
        k = tl.load(K + page * stride_kp + offs, mask=ok & (offs >= 0), other=0.0)
        v = tl.load(V + page * stride_vp + offs, mask=ok & (offs >= 0), other=0.0)
        acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc, axis=0))


@triton.jit
def _paged_read_one_cta_kernel(K, V, OUT, KV_INDICES, n_pages, stride_kp, stride_vp,
                               PAGE_ELEMS: tl.constexpr, UNROLL: tl.constexpr):
    # the same read with one program per SM: a grid-stride loop over groups of UNROLL pages (UNROLL pages'
    # K and V loads issued together per iteration)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs = tl.arange(0, PAGE_ELEMS).to(tl.int64)
    acc = tl.zeros([PAGE_ELEMS], dtype=tl.float32)
    for j0 in range(pid * UNROLL, n_pages, nprog * UNROLL):
        for i in tl.static_range(UNROLL):
            ok = j0 + i < n_pages
            page = tl.load(KV_INDICES + j0 + i, mask=ok, other=0).to(tl.int64)
            k = tl.load(K + page * stride_kp + offs, mask=ok & (offs >= 0), other=0.0)
            v = tl.load(V + page * stride_vp + offs, mask=ok & (offs >= 0), other=0.0)
            acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc, axis=0))


ONE_CTA_CONFIGS = {"pg1cta_u2w8": (2, 8), "pg1cta_u4w8": (4, 8), "pg1cta_u2w16": (2, 16)}  # (UNROLL, warps)
PAGED_CONFIGS = {"paged_p4w8": (4, 8), "paged_p8w8": (8, 8), "paged_p2w4": (2, 4)}  # (pages per program, warps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--rep-ms", type=float, default=10.0)
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--variants", default=None, help="comma-separated subset of the variants (default: all)")
    ap.add_argument("--cases", default=None, help="comma-separated T:family:B (default: CASES)")
    args = ap.parse_args()
    cases = CASES if not args.cases else [(int(T), f, int(B)) for T, f, B in (c.split(":") for c in args.cases.split(","))]
    t0 = time.time()
    log = open(os.path.join(args.out, "stream_ab.jsonl"), "a")

    def emit(rec: dict) -> None:
        log.write(json.dumps(rec) + "\n")
        log.flush()

    emit({"kind": "versions", **software_versions()})
    hq, hkv, d = 32, 4, 128
    t = GpuTimer(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, dtype="bfloat16", page_size=16,
                 max_tokens=1 << 20, max_batch=1024)
    bw = t.read_bandwidth()
    emit({"kind": "bandwidth", "bytes_per_s": bw})
    print(f"read bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    ws = dec.make_workspace(hq, d, max_partials=1 << 16, max_batch=1024, device="cuda")
    seq_indices = torch.arange(t.num_pages, dtype=torch.int32, device="cuda")
    # contiguous bytes for the streaming read (as many as the largest case's K + V)
    sbuf = torch.randn(max(t.kv_bytes(family_kv_lens(f, n, T)) for T, f, n in cases) // 2, dtype=torch.bfloat16,
                       device="cuda")
    variants = ("decode", "s1", "pf", "seq_pages", "gather", "stream", *PAGED_CONFIGS, "paged_seq", *ONE_CTA_CONFIGS,
                "h2", "nx", "hnd", "hnd_s1", "gather_hnd", "decode_b")
    if args.variants:
        variants = tuple(v for v in variants if v in args.variants.split(","))
    hnd = bool({"hnd", "hnd_s1", "gather_hnd"} & set(variants))
    if hnd:
        # the same K/V values stored HND ([pages, H_kv, page_size, D] in memory: one KV head's rows of a page are one
        # contiguous page_size * D block), passed as the NHD-shaped strided view the kernel takes
        k_hnd = t.k_cache.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
        v_hnd = t.v_cache.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    print(f"{'case':24s} {'plan':26s} " + " ".join(f"{v:>11s}" for v in variants), flush=True)
    for T, fam, B in cases:
        lens = family_kv_lens(fam, B, T)
        b = t.batch(lens)
        out = torch.empty((B, hq, d), dtype=torch.bfloat16, device="cuda")
        floor = t.hbm_floor_s(lens)
        nbytes = t.kv_bytes(lens)
        for name in args.plans.split(","):
            if time.time() - t0 > args.budget_s:
                print("budget reached", flush=True)
                return
            pol, params = named(name)[1]
            plan = make_plan(lens, num_kv_heads=hkv, head_dim=d, page_size=16, dtype="bfloat16", device=GPU,
                             policy=pol, params=params)
            arr = plan.to("cuda")
            cfg = plan.config
            sizes = plan.launch_sizes()
            base = (b["q"], t.k_cache, t.v_cache, b["kv_indptr"])

            def launch(indices=b["kv_indices"], **kw):
                return lambda: dec.launch_decode(*base, indices, arr, cfg, out=out, workspace=ws, **{**sizes, **kw})

            n_pages = int(b["kv_indptr"][-1])
            fns = {
                "decode": launch(),
                "s1": launch(num_merge=0),
                "pf": launch(prefetch=not cfg.prefetch),
                "seq_pages": launch(indices=seq_indices[:n_pages]),
            }
            if cfg.heads_per_tile == 1 and hkv % 2 == 0:
                # the same work list with two KV heads per work tile (KernelConfig.heads_per_tile): half the tiles
                cfg2 = dataclasses.replace(cfg, heads_per_tile=2)
                fns["h2"] = lambda: dec.launch_decode(*base, b["kv_indices"], arr, cfg2, out=out, workspace=ws,
                                                      **{**sizes, "num_tiles": plan.num_work_tiles // 2})
            if cfg.prefetch and cfg.heads_per_tile <= 2:  # the same plan with the look-ahead over items toggled
                fns["nx"] = launch(next_item=not cfg.next_item)
            if hnd:
                hbase = (b["q"], k_hnd, v_hnd, b["kv_indptr"], b["kv_indices"])
                fns["hnd"] = lambda: dec.launch_decode(*hbase, arr, cfg, out=out, workspace=ws, **sizes)
                fns["hnd_s1"] = lambda: dec.launch_decode(*hbase, arr, cfg, out=out, workspace=ws,
                                                          **{**sizes, "num_merge": 0})
            fns["decode_b"] = launch()  # decode again, timed last: the run-to-run noise of one pair
            gout = torch.empty(plan.num_ctas * hkv, dtype=torch.float32, device="cuda")

            def gather(kc, vc):  # stage 1's walk over caches kc, vc with a sum for the math
                return lambda: _gather_read_kernel[(plan.num_ctas * hkv,)](
                    kc, vc, gout, b["kv_indptr"], b["kv_indices"], arr["work_request"],
                    arr["work_kv_start"], arr["work_kv_end"], arr["cta_indptr"],
                    kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2),
                    PAGE_SIZE=16, H_KV=hkv, HEAD_DIM=d, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
                    num_stages=max(cfg.num_stages, 3))

            fns["gather"] = gather(t.k_cache, t.v_cache)
            if hnd:
                fns["gather_hnd"] = gather(k_hnd, v_hnd)
            n_el = nbytes // 2
            blk, iters = 4096, 8
            sgrid = (triton.cdiv(n_el, blk * iters),)
            sout = torch.empty(sgrid[0], dtype=torch.float32, device="cuda")
            fns["stream"] = lambda: _stream_read_kernel[sgrid](sbuf, sout, n_el, BLOCK=blk, ITERS=iters, num_warps=8)
            pout = torch.empty(n_pages, dtype=torch.float32, device="cuda")
            assert t.k_cache.stride(1) == hkv * d and t.k_cache.is_contiguous() and t.v_cache.is_contiguous()
            for vname, idx, (ppp, w) in [(v, b["kv_indices"], c) for v, c in PAGED_CONFIGS.items()] + [
                    ("paged_seq", seq_indices, PAGED_CONFIGS["paged_p4w8"])]:
                fns[vname] = functools.partial(
                    _paged_read_kernel[(triton.cdiv(n_pages, ppp),)], t.k_cache, t.v_cache, pout, idx, n_pages,
                    t.k_cache.stride(0), t.v_cache.stride(0), PAGE_ELEMS=16 * hkv * d, PAGES_PER_PROG=ppp,
                    num_warps=w)
            n_sm = torch.cuda.get_device_properties(0).multi_processor_count
            for vname, (unroll, w) in ONE_CTA_CONFIGS.items():
                fns[vname] = functools.partial(
                    _paged_read_one_cta_kernel[(n_sm,)], t.k_cache, t.v_cache, pout, b["kv_indices"], n_pages,
                    t.k_cache.stride(0), t.v_cache.stride(0), PAGE_ELEMS=16 * hkv * d, UNROLL=unroll, num_warps=w)
            fns = {v: fn for v, fn in fns.items() if v in variants}
            times, errs = {}, {}
            for cmp in ("h2", "nx", "hnd"):  # the variant's output against the shipped kernel's
                if cmp not in fns or "decode" not in fns:
                    continue
                try:
                    fns["decode"]()
                    ref_out = out.float().clone()
                    out.fill_(float("nan"))
                    fns[cmp]()
                    errs[cmp] = float((out.float() - ref_out).abs().max())
                except Exception as exc:  # noqa: BLE001
                    errs[cmp] = repr(exc)[:200]
            for v, fn in fns.items():
                try:
                    g = graph_of(fn)
                    times[v] = triton.testing.do_bench(g.replay, warmup=2, rep=args.rep_ms,
                                                       return_mode="median") * 1e-3
                    del g
                except Exception as exc:  # noqa: BLE001  (record and go on: one variant must not end the run)
                    emit({"kind": "error", "case": [T, fam, B], "plan": name, "variant": v, "error": repr(exc)})
            emit({"kind": "case", "T": T, "family": fam, "B": B, "plan": name, "floor_s": floor,
                  "kv_bytes": nbytes, "times": times, "max_abs_diff": errs})
            row = " ".join(f"{times[v] / floor:11.4f}" if v in times else f"{'-':>11s}" for v in variants)
            print(f"{fam + ' B=' + str(B) + ' T=' + str(T):24s} {name:26s} {row}  {errs or ''} "
                  f"[{time.time() - t0:.0f}s]", flush=True)
    print(f"done [{time.time() - t0:.0f}s]", flush=True)


if __name__ == "__main__":
    main()
