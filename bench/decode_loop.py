"""Decode loop under CUDA graphs: kvsplit (device plan, host plan) vs FlashInfer.

A random-weight model with Qwen3-30B-A3B's attention shape (32 q heads, 4 KV
heads, head_dim 128, bf16, page 16, hidden 2048; per layer a qkv projection,
the K/V append into the paged cache, decode attention and the o projection;
no download) runs ``--steps`` decode steps with kv_lens growing by one token per
step. Per backend, one CUDA graph holds all layers; every step the host calls
the attention wrapper's ``plan()`` outside the graph, then replays it.

Reported per backend: GPU time per step (CUDA events around the step), host
overhead per step (the ``plan()`` call and step bookkeeping, wall clock), and
max |o - reference| of layer 0's attention at sampled steps (fp32 torch
reference, ``kvsplit.kernels.decode.reference_decode_attention``). Then the
device planner's cost = graph(device plan + decode) - graph(decode), both graphs
holding the attention of all layers only. Exit status 1 if a check fails.

    python bench/decode_loop.py                    # H200: 500 steps, 4 layers, B = 64 (about a minute)
    python bench/decode_loop.py --steps 200 --layers 2 --batch 128
    TRITON_INTERPRET=1 python bench/decode_loop.py --dry-run   # CPU: tiny shapes, no graphs, checks only

Needs torch + triton + kvsplit (``pip install -e .[gpu]``); FlashInfer
(``flashinfer-python``) is optional: printed as "missing" when it does not import.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
import torch

from kvsplit.kernels.decode import reference_decode_attention
from kvsplit.kernels.device_plan import device_plan
from kvsplit.kernels.wrapper import DecodeWrapper, GraphOptions


class Model:
    """Random attention layers sharing one batch's page table (each layer has its own cache)."""

    def __init__(self, args, device, dtype):
        g = torch.Generator(device="cpu").manual_seed(0)
        self.Hq, self.Hkv, self.D, self.ps = args.num_qo_heads, args.num_kv_heads, args.head_dim, args.page_size
        self.hidden, self.layers, self.B = args.hidden, args.layers, args.batch
        qkv = (self.Hq + 2 * self.Hkv) * self.D
        s = 1.0 / math.sqrt(self.hidden)
        self.wqkv = [(torch.randn(self.hidden, qkv, generator=g) * s).to(device, dtype) for _ in range(self.layers)]
        self.wo = [
            (torch.randn(self.Hq * self.D, self.hidden, generator=g) * s).to(device, dtype) for _ in range(self.layers)
        ]
        rng = np.random.default_rng(1)
        # skewed batch: a few long requests among short ones
        lens = rng.integers(16, args.max_len // 8, self.B)
        lens[: max(1, self.B // 16)] = rng.integers(args.max_len // 2, args.max_len, max(1, self.B // 16))
        self.lens0 = lens.astype(np.int64)
        cap = self.lens0 + args.steps + 1
        pages = -(-cap // self.ps)
        num_pages = int(pages.sum()) + 8
        order = torch.randperm(num_pages, generator=g)[: int(pages.sum())]
        self.kv_indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32, device=device)
        self.kv_indices = order.to(torch.int32).to(device)
        self.kv_lens = torch.tensor(self.lens0, dtype=torch.int32, device=device)
        shape = (num_pages, self.ps, self.Hkv, self.D)
        self.k = [torch.randn(shape, generator=g).to(device, dtype) for _ in range(self.layers)]
        self.v = [torch.randn(shape, generator=g).to(device, dtype) for _ in range(self.layers)]
        self.x = (torch.randn(self.B, self.hidden, generator=g)).to(device, dtype)
        self.q0 = torch.empty(self.B, self.Hq, self.D, device=device, dtype=dtype)
        self.outs = [torch.empty(self.B, self.Hq, self.D, device=device, dtype=dtype) for _ in range(self.layers)]
        self.ar = torch.arange(self.B, device=device)

    def step(self, attn):
        """One decode step of every layer (graph-capturable): kv_lens already count the new token."""
        x = self.x
        pos = (self.kv_lens - 1).long()
        page = self.kv_indices[(self.kv_indptr[:-1].long() + pos // self.ps)].long()
        off = pos % self.ps
        for i in range(self.layers):
            qkv = x @ self.wqkv[i]
            q = qkv[:, : self.Hq * self.D].view(self.B, self.Hq, self.D)
            k = qkv[:, self.Hq * self.D : (self.Hq + self.Hkv) * self.D].view(self.B, self.Hkv, self.D)
            v = qkv[:, (self.Hq + self.Hkv) * self.D :].view(self.B, self.Hkv, self.D)
            self.k[i][page, off] = k
            self.v[i][page, off] = v
            if i == 0:
                self.q0.copy_(q)
            o = attn(i, q.contiguous(), self.outs[i])
            x = torch.tanh(x + o.reshape(self.B, -1) @ self.wo[i])
        self.x.copy_(x)

    def reset(self):
        self.kv_lens.copy_(torch.tensor(self.lens0, dtype=torch.int32, device=self.kv_lens.device))


def kvsplit_backend(m, args, device, planner, policy="auto", params=None):
    """policy "auto": the wrapper's graph default (stream_k at the graph tile's residency)."""
    w = DecodeWrapper(
        m.Hq,
        m.Hkv,
        m.D,
        page_size=m.ps,
        dtype=args.dtype,
        device=device,
        max_batch_size=m.B,
        policy=policy,
        params=params,
        use_cuda_graph=True,
        graph=GraphOptions(planner=planner, num_programs=args.num_programs),
    )
    assert w.planner == planner, (w.planner, planner)

    def plan(lens_host):
        w.plan(m.kv_indptr, m.kv_indices, m.kv_lens, kv_lens_host=lens_host)

    def attn(i, q, out):
        return w.run(q, m.k[i], m.v[i], out=out)

    return plan, attn, w


def flashinfer_backend(m, args, device):
    try:
        import flashinfer
    except Exception as exc:  # noqa: BLE001 - any import failure means "missing"
        return None, f"missing ({type(exc).__name__}: {exc})"
    ws = torch.empty(128 * 2**20, dtype=torch.uint8, device=device)
    last = torch.empty(m.B, dtype=torch.int32, device=device)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws,
        "NHD",
        use_cuda_graph=True,
        use_tensor_cores=True,
        paged_kv_indptr_buffer=m.kv_indptr.clone(),
        paged_kv_indices_buffer=m.kv_indices.clone(),
        paged_kv_last_page_len_buffer=last,
        backend="fa2",
    )
    dt = getattr(torch, args.dtype)

    # FlashInfer derives each request's length from its page count and last-page length, so its page table
    # must hold exactly ceil(kv_len / page_size) pages per request at every step (kvsplit's kernel takes kv_lens
    # and reads only the pages it needs, so the model keeps one page table sized for the last step). The host
    # builds that table per step from its copy of the page lists, as an engine would.
    indptr_cap = m.kv_indptr.cpu().numpy().astype(np.int64)
    indices_cap = m.kv_indices.cpu().numpy()

    def plan(lens_host):
        lens_host = np.asarray(lens_host, dtype=np.int64)
        pages = -(-lens_host // m.ps)
        take = np.concatenate([indices_cap[s : s + n] for s, n in zip(indptr_cap[:-1], pages)])
        indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        lp = ((lens_host - 1) % m.ps + 1).astype(np.int32)
        w.plan(
            torch.from_numpy(indptr).to(device),
            torch.from_numpy(take.astype(np.int32)).to(device),
            torch.from_numpy(lp).to(device),
            m.Hq,
            m.Hkv,
            m.D,
            m.ps,
            q_data_type=dt,
            kv_data_type=dt,
        )

    def attn(i, q, out):
        return w.run(q, (m.k[i], m.v[i]), out=out)

    return (plan, attn, w), f"flashinfer {flashinfer.__version__}"


def run_loop(name, m, plan, attn, args, use_graph, check_steps):
    """Returns (gpu µs/step, host µs/step, max error, steps run)."""
    m.reset()
    lens = m.lens0.copy()
    # warm up (compiles) and capture at the first step's lengths
    lens += 1
    m.kv_lens.add_(1)
    plan(lens.astype(np.int32))
    m.step(attn)
    graph = None
    if use_graph:
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            m.step(attn)
    host_t, max_err = 0.0, 0.0
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))] if use_graph else []
    gpu_ms = 0.0
    m.reset()
    lens = m.lens0.copy()
    if use_graph:
        torch.cuda.synchronize()
    for s in range(args.steps):
        t0 = time.perf_counter()
        lens += 1
        m.kv_lens.add_(1)
        plan(lens.astype(np.int32))
        host_t += time.perf_counter() - t0
        if use_graph:
            ev[0][0].record()
            graph.replay()
            ev[0][1].record()
        else:
            m.step(attn)
        if s in check_steps:
            ref = reference_decode_attention(m.q0, m.k[0], m.v[0], m.kv_indptr, m.kv_indices, m.kv_lens)
            err = (m.outs[0].float() - ref.float()).abs().max().item()
            max_err = max(max_err, err)
        if use_graph:
            ev[0][1].synchronize()
            gpu_ms += ev[0][0].elapsed_time(ev[0][1])
    return gpu_ms * 1e3 / args.steps, host_t * 1e6 / args.steps, max_err


def planning_cost(m, args, w, reps):
    """graph(device plan + attention of all layers) - graph(attention), µs."""
    qs = [torch.randn(m.B, m.Hq, m.D, device=m.k[0].device).to(m.k[0].dtype) for _ in range(m.layers)]

    def attn_only():
        for i in range(m.layers):
            w.run(qs[i], m.k[i], m.v[i], out=m.outs[i])

    def with_plan():
        device_plan(m.kv_lens, w._rule, w.bufs, w.workspace.counter)
        attn_only()

    out = []
    for fn in (with_plan, attn_only):
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        samples = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            samples.append(a.elapsed_time(b) * 1e3)
        out.append(float(np.median(samples)))
    return out[0], out[1], out[0] - out[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=16384, help="longest initial kv_len")
    ap.add_argument("--num-programs", type=int, default=None, help="persistent programs (default 4 per SM)")
    ap.add_argument("--checks", type=int, default=5, help="steps checked against the reference")
    ap.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes, no graphs")
    args = ap.parse_args(argv)
    args.num_qo_heads, args.num_kv_heads, args.head_dim, args.page_size = 32, 4, 128, 16
    args.hidden, args.dtype = 2048, "bfloat16"
    tol = 2e-2
    if args.dry_run:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("--dry-run needs TRITON_INTERPRET=1 in the environment (set before triton is imported)")
            return 2
        device, use_graph = torch.device("cpu"), False
        args.num_qo_heads, args.num_kv_heads, args.head_dim, args.hidden = 4, 2, 64, 64
        args.dtype, tol = "float16", 5e-3
        args.steps, args.layers, args.batch, args.max_len = min(args.steps, 3), min(args.layers, 2), 5, 300
        args.num_programs = args.num_programs or 3
    else:
        if not torch.cuda.is_available():
            print("needs a CUDA GPU (or --dry-run under TRITON_INTERPRET=1)")
            return 2
        device, use_graph = torch.device("cuda"), True
    dtype = getattr(torch, args.dtype)
    m = Model(args, device, dtype)
    checks = set(np.linspace(0, args.steps - 1, max(1, args.checks)).astype(int).tolist())
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)"
    print(
        f"{gpu}; torch {torch.__version__}; B={m.B}, layers={m.layers}, steps={args.steps}, "
        f"H_q/H_kv/D={m.Hq}/{m.Hkv}/{m.D}, {args.dtype}, page {m.ps}, initial tokens {int(m.lens0.sum())}"
    )
    rows, ok = [], True
    t_start = time.perf_counter()
    dev_wrapper = None
    # the wrapper's graph default (limits.graph_default_config's tile, stream_k at its residency) planned
    # on the device and the same rule on the host (the device planner's graph must run as fast), and the earlier
    # default tile (128, 4, 2) under stream_k's own default (2 CTAs per SM), as this bench ran it before
    r16 = {"block_n": 128, "num_warps": 4, "num_stages": 2}
    for name, planner, policy, params in (
        ("kvsplit device plan (default)", "device", "auto", None),
        ("kvsplit host plan (default rule)", "host", "auto", None),
        ("kvsplit device plan (stream_k, r16 tile)", "device", "stream_k", r16),
    ):
        plan, attn, w = kvsplit_backend(m, args, device, planner, policy, params)
        if dev_wrapper is None and planner == "device":
            dev_wrapper = w
        g, h, e = run_loop(name, m, plan, attn, args, use_graph, checks)
        rows.append((name, g, h, e))
    fi, fi_note = flashinfer_backend(m, args, device) if device.type == "cuda" else (None, "missing (CPU dry run)")
    if fi is not None:
        plan, attn, _ = fi
        g, h, e = run_loop(fi_note, m, plan, attn, args, use_graph, checks)
        rows.append((fi_note + " (tensor cores, fa2)", g, h, e))
    else:
        rows.append((f"flashinfer: {fi_note}", None, None, None))
    print(f"\n{'backend':<44}{'GPU µs/step':>12}{'host µs/step':>14}{'max |o-ref|':>13}  check")
    for name, g, h, e in rows:
        if g is None:
            print(f"{name:<44}{'-':>12}{'-':>14}{'-':>13}  -")
            continue
        good = e < tol
        ok &= good
        gs = f"{g:.1f}" if use_graph else "-"
        print(f"{name:<44}{gs:>12}{h:>14.1f}{e:>13.2e}  {'ok' if good else 'FAIL'}")
    if use_graph and dev_wrapper is not None:
        both, attn_only, cost = planning_cost(m, args, dev_wrapper, reps=200)
        print(
            f"\ndevice planning cost: graph(plan + decode) {both:.1f} µs - graph(decode) {attn_only:.1f} µs "
            f"= {cost:.1f} µs per step ({m.layers} layers of attention)"
        )
    print(f"\ntotal {time.perf_counter() - t_start:.1f} s; {'all checks passed' if ok else 'CHECK FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
