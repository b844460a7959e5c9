"""Compile the stage-1 decode kernel for sm_90 on a machine without a GPU and report its resources.

    python bench/compile_sm90.py [--configs 64,4,3 128,8,3 ...] [--variants plain,prefetch] [--ttgir DIR]
    python bench/compile_sm90.py --groups 1,2,3,4,5,6,7,8,16 --maxnreg none,auto,128 --variants plain --json OUT.jsonl
    python bench/compile_sm90.py --configs 32,4,3 64,4,2 --groups 4,8 --heads 2,4   # KernelConfig.heads_per_tile
    python bench/compile_sm90.py --q-len 4 --kv-dtype fp8 --scales head   # verify steps over an fp8 cache
    python bench/compile_sm90.py --configs 32,4,3 --variants prefetch --heads 2 --kv-dtype fp8 --scales tensor --loop-mix

For every (BLOCK_N, warps, stages) x variant, the arguments :func:`kvsplit.kernels.decode.launch_decode`
passes for a case of the reference shape (H_q 32, H_kv 4, D 128, bf16, page 16, grid schedule) are recorded
(the kernel object is swapped for a recorder, so the launch's own code builds them), specialized as Triton's
launcher does (16-byte divisibility of pointers and integers, ints == 1 as constants, a host
``TensorDescriptor`` as ``tensordesc<...>``), compiled with ``triton.compile`` for ``GPUTarget("cuda", 90,
32)`` and read back: registers and shared memory from ``cuobjdump --dump-resource-usage`` on the cubin (the
same procedure reproduces the registers and shared memory read on the H200 exactly), bytes of
spill stores from ``ptxas -v`` on its PTX,
and from the TTGIR: the K/V loads (cp.async or TMA), the buffers the pipeliner allocates for them and the
depth of its waits; a SHA-256 of the SASS (``cuobjdump -sass``), so that a source refactor can be shown to
compile to the same machine code. ``--ttgir DIR`` also writes each kernel's TTGIR there.

``--groups`` compiles each config at several GQA groups G (H_q = 4 G, H_kv = 4) and ``--maxnreg`` with a
register cap: ``none`` (uncapped), ``auto`` (what ``launch_decode`` applies:
:func:`kvsplit.kernels.residency.register_cap`) or a number; the resident CTAs per SM of each compile are
printed beside the residency kernels/residency.py counts for the config (at the compile's G, q_len and KV dtype) (``--json`` writes one JSON line per
compile). Variants: ``plain``, ``prefetch`` (``KernelConfig.prefetch``) and ``next_item`` (``prefetch`` with
``KernelConfig.next_item``). ``--q-len N`` compiles the kernel of N query tokens per request (G * heads * N rows a
tile), ``--kv-dtype fp8`` the one reading a float8_e4m3fn cache, ``--scales`` with per-tensor (``tensor``) or
per-KV-head (``head``) scales.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.runtime.jit import native_specialize_impl

from kvsplit.kernels import decode as dec
from kvsplit.kernels.limits import KernelConfig
from kvsplit.kernels.plan import make_plan

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
PTXAS = os.path.join(os.path.dirname(CUOBJDUMP), "ptxas")


class _Recorder:
    """Stands in for a JITFunction: ``kernel[grid](*args, **kwargs)`` records the call."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


def record_stage1(
    cfg: KernelConfig,
    *,
    dtype=torch.bfloat16,
    hq=32,
    hkv=4,
    d=128,
    page_size=16,
    lens=(4096, 1000, 17),
    overlap: bool = False,
    q_len=1,
    kv_dtype=None,
    **launch_kw,
):
    """The stage-1 launch of ``launch_decode`` for a small case on CPU tensors: (args, kwargs). ``overlap``:
    with :func:`kvsplit.kernels.decode.launch_rule` forced to the overlapped merge under PDL (what it picks on
    an sm_90 GPU from 256 merged (request, query head) pairs on), so the stage 1 of that regime is recorded."""
    name = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}[dtype]
    plan = make_plan(
        list(lens),
        num_kv_heads=hkv,
        device="NVIDIA H200",
        policy="fixed",
        params={
            "num_splits": 2,
            "block_n": cfg.block_n,
            "num_warps": cfg.num_warps,
            "num_stages": cfg.num_stages,
            "prefetch": cfg.prefetch,
            "heads_per_tile": cfg.heads_per_tile,
            "next_item": cfg.next_item,
        },
        head_dim=d,
        page_size=page_size,
        dtype=name,
    )
    npages = sum(-(-n // page_size) for n in lens) + 8
    k = torch.zeros((npages, page_size, hkv, d), dtype=kv_dtype or dtype)
    q = torch.zeros((len(lens) * q_len, hq, d), dtype=dtype)
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indices = torch.zeros(npages, dtype=torch.int32)
    ws = dec.make_workspace(hq, d, max_partials=plan.num_partials, max_batch=len(lens), device="cpu", q_len=q_len)
    if q_len != 1:
        launch_kw = {**launch_kw, "q_len": q_len, "kv_lens": torch.tensor(lens, dtype=torch.int32)}
    rec, saved = _Recorder(dec._decode_stage1_kernel), dec._decode_stage1_kernel
    rec_m, saved_m = _Recorder(dec._decode_merge_kernel), dec._decode_merge_kernel
    dec._decode_stage1_kernel, dec._decode_merge_kernel = rec, rec_m
    rule, widen = dec.launch_rule, dec._fp8_widen_mode
    dec._fp8_widen_mode = lambda device: 2  # the sm_90 launch's FP8 widening (the CPU tensors here would pick 1)
    if overlap:
        dec.launch_rule = lambda *a, **kw: dataclasses.replace(
            rule(*a, **kw), merge_overlap=True, pdl=True, pdl_last=cfg.schedule != "persistent"
        )
    try:
        dec.launch_decode(
            q,
            k,
            k.clone(),
            indptr,
            indices,
            plan.to("cpu"),
            plan.config,
            out=torch.empty_like(q),
            workspace=ws,
            **plan.launch_sizes(),
            **launch_kw,
        )
    finally:
        dec._decode_stage1_kernel, dec._decode_merge_kernel = saved, saved_m
        dec.launch_rule, dec._fp8_widen_mode = rule, widen
    ((_, args, kwargs),) = rec.calls
    record_stage1.merge_calls = rec_m.calls  # the merge launch(es) of the same call, for --merge
    return args, kwargs


def compile_sm90(fn, args, kwargs):
    """``triton.compile`` of the JITFunction ``fn`` for sm_90 with the specialization of ``fn[grid](*args,
    **kwargs)``."""
    kwargs = dict(kwargs)
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages", "maxnreg", "launch_pdl") if k in kwargs}
    bound = dict(zip(fn.arg_names, args))
    bound.update(kwargs)
    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):
        v = bound[p.name]
        if p.is_constexpr:
            signature[p.name] = "constexpr"
            constexprs[p.name] = v
            continue
        # as the launch's binder (triton.runtime.jit.create_function_from_signature) calls it
        ty, key = native_specialize_impl(
            BaseBackend, v, p.is_const, not p.do_not_specialize, not p.do_not_specialize_on_alignment
        )
        if ty == "constexpr":
            signature[p.name] = "constexpr"
            constexprs[p.name] = key
            continue
        signature[p.name] = ty
        if key == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def resources(kernel) -> dict:
    """Registers, stack frame and shared memory (Triton's dynamic allocation, which the launch asks for) of the
    compiled kernel (cuobjdump on its cubin), and the spill stores ptxas reports for its PTX (``ptxas -v``
    for sm_90a, the arch Triton compiles capability 90 for)."""
    with tempfile.TemporaryDirectory() as d:
        cubin, ptx = os.path.join(d, "k.cubin"), os.path.join(d, "k.ptx")
        with open(cubin, "wb") as f:
            f.write(kernel.asm["cubin"])
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        out = subprocess.run(
            [CUOBJDUMP, "--dump-resource-usage", cubin], capture_output=True, text=True, check=True
        ).stdout
        info = subprocess.run(
            [PTXAS, "-arch=sm_90a", "-v", ptx, "-o", os.path.join(d, "v.cubin")],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
        sass = subprocess.run([CUOBJDUMP, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    regs, stack, shared, local = map(int, m.groups())
    spill = re.search(r"(\d+) bytes spill stores", info)
    # the machine code without cuobjdump's header (file names): equal hashes = the same instructions, so a
    # source refactor that keeps them needs no GPU re-timing
    body = "\n".join(line for line in sass.splitlines() if line.lstrip().startswith(("/*", ".", "Function")))
    return {
        "regs": regs,
        "stack": stack,
        "local": local,
        "shared_static": shared,
        "shared": int(kernel.metadata.shared),
        "spill_stores": int(spill.group(1)) if spill else -1,
        "sass_sha256": hashlib.sha256(body.encode()).hexdigest(),
        "tile_loop": tile_loop_mix(sass),
    }


_SASS_LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+(?:\.[A-Z0-9_]+)*)([^;]*)")


def tile_loop_mix(sass: str) -> dict:
    """The instruction mix of the kernel's innermost loop that holds tensor-core MMAs (the loop over BLOCK_N
    tiles; between a backward branch and its target in the SASS): ``instructions`` in all, ``HMMA``, the
    shared-memory reads by kind (``LDS.U8``: one byte each; ``LDS``: 4-16 bytes; ``LDSM``: ldmatrix), the FP8
    widenings (``F2FP.*.E4M3*``), byte permutes (``PRMT``) and register moves (``IMAD.MOV``), per thread and
    tile. Empty when no such loop is found. A fp8 cache's P @ V operand (keys along the MMA's k, a byte apart
    by 128 in shared memory) shows up as ``LDS.U8``: there is no transposing ldmatrix of bytes."""
    ins = [(int(m[1], 16), m[2], m[3]) for line in sass.splitlines() if (m := _SASS_LINE.match(line))]
    best = None
    for addr, op, rest in ins:
        t = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        top = int(t[1], 16) if t else addr
        if top < addr:  # a backward branch: the loop is [top, addr]
            body = [o for a, o, _ in ins if top <= a <= addr]
            if any(o.startswith("HMMA") for o in body) and (best is None or len(body) < len(best)):
                best = body
    if best is None:
        return {}

    byte_loads = ("LDS.U8", "LDS.S8")

    def n(pred) -> int:
        return sum(1 for o in best if pred(o))

    return {
        "instructions": len(best),
        "HMMA": n(lambda o: o.startswith("HMMA")),
        "LDS.U8": n(lambda o: o.startswith(byte_loads)),
        "LDS": n(lambda o: o.split(".")[0] == "LDS" and not o.startswith(byte_loads)),
        "LDSM": n(lambda o: o.startswith("LDSM")),
        "F2FP.E4M3": n(lambda o: o.startswith("F2FP") and "E4M3" in o),
        "PRMT": n(lambda o: o == "PRMT"),
        "IMAD.MOV": n(lambda o: o.startswith("IMAD.MOV")),
    }


def ttgir_summary(ttgir: str) -> dict:
    """What the pipeliner made of the K/V loads: TMA copies and cp.async in the TTGIR, the pipelined
    shared-memory buffers (``local_alloc`` of ``<depth>x<rows>x<cols>``: one ring of ``depth`` buffers per
    load) and the async_wait depths (cp.async) or barrier waits (TMA)."""
    allocs = re.findall(
        r"ttg\.local_alloc\s*:\s*\(\)\s*->\s*!ttg\.memdesc<(\d+)x(\d+)x(\d+)x(bf16|f16|f32|f8E4M3FN)", ttgir
    )
    rings: dict[str, int] = {}
    for depth, r, c, _dtype in allocs:
        key = f"{depth}x[{r}x{c}]"
        rings[key] = rings.get(key, 0) + 1
    return {
        "tma_copies": len(re.findall(r"ttng\.async_tma_copy_global_to_local", ttgir)),
        "cp_async": len(re.findall(r"ttg\.async_copy_global_to_local", ttgir)),
        "mbarrier_waits": len(re.findall(r"ttng\.wait_barrier", ttgir)),
        "async_wait_nums": sorted(set(int(n) for n in re.findall(r"ttg\.async_wait .*\{num = (\d+) : i32\}", ttgir))),
        "rings": rings,
    }


def main() -> None:
    import json

    from kvsplit.kernels.device import resolve_device
    from kvsplit.kernels.residency import occupancy, q_len_rows, register_cap, resident_ctas_per_sm

    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--configs", nargs="*", default=[f"{n},{w},{s}" for n in (64, 128, 256) for w in (4, 8) for s in (2, 3, 4)]
    )
    ap.add_argument("--variants", default="plain,prefetch")
    ap.add_argument("--groups", default="8", help="GQA groups G to compile at (H_q = 4 G, H_kv = 4)")
    ap.add_argument("--maxnreg", default="none", help="register caps: none, auto (launch_decode's) or numbers")
    ap.add_argument(
        "--heads",
        default="1",
        help="KV heads per work tile (KernelConfig.heads_per_tile); each is "
        "compiled at the groups G with heads * G <= 16",
    )
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--ttgir", default=None, help="write each kernel's TTGIR into this folder")
    ap.add_argument("--json", default=None, help="append one JSON line per compile to this file")
    ap.add_argument(
        "--overlap",
        action="store_true",
        help="the overlapped merge (launch_rule's pick under PDL): stage 1 with the arrival counters and the PDL "
        "trigger",
    )
    ap.add_argument("--merge", action="store_true", help="also compile the call's merge kernel and print its resources")
    ap.add_argument("--q-len", type=int, default=1, help="query tokens per request (1-8)")
    ap.add_argument("--kv-dtype", choices=("same", "fp8"), default="same", help="the cache's dtype: q's, or fp8")
    ap.add_argument("--scales", choices=("none", "tensor", "head"), default="none", help="k_scale/v_scale kind")
    ap.add_argument(
        "--loop-mix",
        action="store_true",
        help="also print each compile's tile-loop instruction mix (tile_loop_mix: per thread and BLOCK_N tile)",
    )
    args = ap.parse_args()
    scale_kw = {
        "none": {},
        "tensor": {"k_scale": 0.5, "v_scale": 2.0},
        "head": {"k_scale": torch.ones(4), "v_scale": torch.ones(4)},
    }[args.scales]
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[args.dtype]
    dev = resolve_device("NVIDIA H200")
    sink = open(args.json, "a") if args.json else None
    print(
        f"triton {triton.__version__}, sm_90, {args.dtype}, H_kv 4 D 128 page {args.page_size}, q_len {args.q_len}, "
        f"kv {args.kv_dtype}, scales {args.scales}"
    )
    print(
        f"{'variant':9s} {'cfg':12s} {'G':>2s} {'h':>2s} {'cap':>4s} {'regs':>4s} {'spill':>5s} {'smem B':>7s} {'CTA/SM':>6s} "
        f"{'table':>5s}  {'cp.async':>8s} {'waits':>8s}  pipelined K/V buffers (rings x depth x [box])"
    )
    for c in args.configs:
        bn, w, s = map(int, c.split(","))
        for variant in args.variants.split(","):
            pf = variant in ("prefetch", "next_item")  # next_item: prefetch + KernelConfig.next_item
            for g, heads in [
                (g, h)
                for g in map(int, args.groups.split(","))
                for h in map(int, args.heads.split(","))
                if h == 1 or h * g <= 16
            ]:
                for capname in args.maxnreg.split(","):
                    cap = (
                        None
                        if capname == "none"
                        else int(capname)
                        if capname != "auto"
                        else register_cap(128, g, bn, w, s, pf, dtype.itemsize)
                    )
                    extra = {"prefetch": pf, "heads_per_tile": heads, "next_item": variant == "next_item"}
                    try:
                        cfg = KernelConfig(block_n=bn, num_warps=w, num_stages=s, **extra)
                        a, kw = record_stage1(
                            cfg,
                            dtype=dtype,
                            hq=4 * g,
                            hkv=4,
                            page_size=args.page_size,
                            overlap=args.overlap,
                            q_len=args.q_len,
                            kv_dtype=torch.float8_e4m3fn if args.kv_dtype == "fp8" else None,
                            **scale_kw,
                        )
                        kw.pop("maxnreg", None)  # the launcher's own cap: this script applies --maxnreg's
                        if cap:
                            kw = {**kw, "maxnreg": cap}
                        k = compile_sm90(dec._decode_stage1_kernel, a, kw)
                    except Exception as e:  # a config the planner rejects, or a compile failure: say which
                        print(
                            f"{variant:9s} {str((bn, w, s)):12s} {g:2d} {heads:2d} -- {type(e).__name__}: "
                            f"{str(e).splitlines()[0][:120]}"
                        )
                        continue
                    r, t = resources(k), ttgir_summary(k.asm["ttgir"])
                    res = occupancy(dev, w, r["regs"], r["shared"])
                    rows, extra_rows = q_len_rows(heads, g, args.q_len)
                    table = resident_ctas_per_sm(
                        dev,
                        128,
                        args.dtype,
                        dtype.itemsize,
                        bn,
                        w,
                        s,
                        prefetch=pf,
                        heads_per_tile=heads,
                        next_item=variant == "next_item",
                        kv_bytes=1 if args.kv_dtype == "fp8" else None,
                        extra_rows=extra_rows,
                        rows=rows,
                    )
                    if args.ttgir:
                        os.makedirs(args.ttgir, exist_ok=True)
                        with open(os.path.join(args.ttgir, f"{variant}_{bn}_{w}_{s}_g{g}_h{heads}.ttgir"), "w") as f:
                            f.write(k.asm["ttgir"])
                    waits = ",".join(map(str, t["async_wait_nums"])) if t["cp_async"] else f"mbar {t['mbarrier_waits']}"
                    print(
                        f"{variant:9s} {str((bn, w, s)):12s} {g:2d} {heads:2d} {cap or '-':>4} {r['regs']:4d} "
                        f"{r['spill_stores']:5d} {r['shared']:7d} {res:6d} {table:5d}  {t['cp_async']:8d} "
                        f"{waits:>8s}  {' '.join(f'{n} x {k}' for k, n in t['rings'].items())}  "
                        f"sass {r['sass_sha256'][:12]}",
                        flush=True,
                    )
                    if args.loop_mix:
                        mix = r["tile_loop"]
                        print("  tile loop: " + (", ".join(f"{k} {v}" for k, v in mix.items()) or "not found"))
                    if args.merge:
                        for grid, ma, mkw in record_stage1.merge_calls:
                            mk = compile_sm90(dec._decode_merge_kernel, ma, mkw)
                            mr = resources(mk)
                            print(
                                f"  merge grid {grid} warps {mkw.get('num_warps')}: regs {mr['regs']} smem "
                                f"{mr['shared']} sass {mr['sass_sha256'][:12]}",
                                flush=True,
                            )
                    if sink:
                        sink.write(
                            json.dumps(
                                {
                                    "variant": variant,
                                    "cfg": [bn, w, s],
                                    "G": g,
                                    "heads_per_tile": heads,
                                    "q_len": args.q_len,
                                    "kv_dtype": args.kv_dtype,
                                    "scales": args.scales,
                                    "maxnreg": cap,
                                    **r,
                                    "resident": res,
                                    "table": table,
                                }
                            )
                            + "\n"
                        )
                        sink.flush()


if __name__ == "__main__":
    sys.exit(main())
