"""Decode through a real engine: transformers' continuous batching with kvsplit, FlashInfer and paged sdpa.

A random-weight model with Qwen3-30B-A3B's attention (hidden 2048, 32 query heads, 4 KV heads, head_dim 128,
q/k RMS norms, bf16) and a dense MLP as wide as its 8 active experts (8 x 768 = 6144) in place of the MoE, with
``--layers`` layers (no download), serves ``--requests`` requests through ``generate_batch`` (transformers'
continuous batching, synchronous, eager). Prompt lengths are the first ``--requests`` prompts of a shipped trace
(tuner/traces, ``--trace``), capped at ``--max-prompt``; prompt token ids are random (seeded); every request
generates ``--new-tokens`` tokens, greedy (no EOS).

Implementations, each run separately on the same model and prompts:

- ``sdpa``: transformers' own paged sdpa (the reference): its cache reads every request's keys/values back
  per layer and runs torch's scaled_dot_product_attention with a mask;
- ``kvsplit``: :func:`kvsplit.kernels.integrations.transformers.install` (DecodeWrapper on the paged cache for
  decode rows with the shipped tables, ``load_shipped_table()``, or the export ``--table`` names; with
  ``--table ''`` DecodeWrapper's default policy; prefill rows by sdpa);
- ``flashinfer``: FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper`` (NHD, tensor cores by default) behind the
  very same hooks (``install(decoder=...)``): same step metadata, same prefill path; only the decode kernel
  differs. Skipped with a message when ``flashinfer`` does not import.

Reported per implementation:

- decode tokens/s: tokens of the forward passes made only of decode rows, over their GPU time (CUDA events
  around each forward pass: the whole model, the cache write and, for sdpa, the read-back; on transformers 5.17
  the cache update runs inside the attention function, so there "attention" includes it);
- attention ms per decode step: the time in the attention function (all layers; kvsplit's and FlashInfer's
  per-step ``plan`` included), and its share of the step;
- the same on the host's clock: the forward pass's and the attention function's host time per decode step, and
  p50 / p99 host microseconds of each decoder ``plan`` (once per step) and ``run`` (once per layer) call; host
  time close to the GPU time says the host sets the pace; and Python's garbage collections during the pass (count
  per generation, host ms);
- end-to-end wall time of ``generate_batch`` (prefill included);
- the check: each request's first ``--check-steps`` generated tokens must equal the reference's (exit status 1
  otherwise, with the requests that differ and where). A random-weight model's logits are nearly flat, so in bf16
  greedy decoding flips on near-ties between any two correct kernels (measured on the H200: FlashInfer and
  kvsplit each agree with sdpa on about 65-70 % of requests over 16 steps). The check therefore runs in a
  separate pass with the model in ``--check-dtype`` (default float32 on a GPU; kvsplit's kernel computes fp32
  with IEEE dots); implementations without that dtype (FlashInfer: fp16/bf16 only) report their bf16 agreement
  with sdpa for information and are not checked.

Every implementation first runs ``--warmup`` untimed passes of the same workload, so Triton's and FlashInfer's
JIT compiles and the numba planner's first calls fall outside the timed pass.

    python bench/engine_decode.py                        # H200: 256 requests x 128 tokens, 4 layers
    python bench/engine_decode.py --layers 48 --impls kvsplit,sdpa
    TRITON_INTERPRET=1 python bench/engine_decode.py --smoke   # CPU: tiny fp32 model, 12 requests x 8 tokens

Needs torch + triton + transformers (``pip install -e .[transformers]``); FlashInfer (``flashinfer-python``) is
optional. Writes a JSON summary with ``--json PATH``.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from kvsplit.kernels.integrations import transformers as ktf


def _args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    p.add_argument(
        "--trace",
        default="azure_conv",
        help="shipped trace for the prompt lengths (kvsplit.tuner.workloads.TRACES; default azure_conv)",
    )
    p.add_argument("--requests", type=int, default=256, help="requests (default 256)")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens generated per request (default 128)")
    p.add_argument("--max-prompt", type=int, default=8192, help="cap on a prompt's length (default 8192)")
    p.add_argument("--layers", type=int, default=4, help="decoder layers (Qwen3-30B-A3B has 48; default 4)")
    p.add_argument("--vocab", type=int, default=32768, help="vocabulary (default 32768)")
    p.add_argument("--page-size", type=int, default=16, help="tokens per cache page (default 16)")
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        default=4096,
        help="query tokens per forward pass (prefill chunk budget; default 4096)",
    )
    p.add_argument(
        "--check-steps",
        type=int,
        default=16,
        help="first generated tokens of each request compared with the reference (default 16)",
    )
    p.add_argument(
        "--impls",
        default="sdpa,kvsplit,flashinfer",
        help="comma-separated, reference (sdpa) first (default sdpa,kvsplit,flashinfer)",
    )
    p.add_argument(
        "--table",
        default="shipped",
        help="policies export for kvsplit's DecodeWrapper ('shipped', the default: every shipped GPU's table, "
        "load_shipped_table(); '' for none)",
    )
    p.add_argument(
        "--fi-cuda-cores",
        action="store_true",
        help="FlashInfer's CUDA-core decode kernel instead of its tensor-core one",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="CPU check at tiny sizes (fp32, 2 layers, 12 requests x 8 tokens, 4 checked); host clock only",
    )
    p.add_argument(
        "--warmup", type=int, default=1, help="untimed passes of the workload before the timed one (default 1)"
    )
    p.add_argument(
        "--check-dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="dtype of the token check pass (default float32; bfloat16 checks the timed pass itself)",
    )
    p.add_argument("--json", help="write the summary here")
    a = p.parse_args(argv)
    if a.warmup < 0:
        p.error(f"--warmup: expected >= 0, got {a.warmup}")
    for name in ("requests", "new_tokens", "max_prompt", "layers", "vocab", "page_size", "max_batch_tokens"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')}: expected >= 1, got {getattr(a, name)}")
    if not 0 <= a.check_steps <= a.new_tokens:
        p.error(f"--check-steps: expected 0..--new-tokens ({a.new_tokens}), got {a.check_steps}")
    a.impls = [s.strip() for s in a.impls.split(",") if s.strip()]
    bad = [s for s in a.impls if s not in ("sdpa", "kvsplit", "flashinfer")]
    if bad or not a.impls or a.impls[0] != "sdpa":
        p.error(f"--impls: expected sdpa first, then any of kvsplit, flashinfer; got {a.impls}")
    if a.smoke:
        a.requests, a.new_tokens, a.check_steps, a.layers, a.vocab = 12, 8, 4, 2, 512
        a.max_prompt, a.max_batch_tokens, a.table, a.warmup = 96, 64, "", 0
    return a


def _prompts(a) -> list[list[int]]:
    from kvsplit.tuner.workloads import load_trace

    lens = np.minimum(load_trace(a.trace).prompt[: a.requests], a.max_prompt)
    if lens.shape[0] < a.requests:
        raise SystemExit(f"--requests: trace {a.trace!r} has only {lens.shape[0]} requests")
    rng = np.random.default_rng(0)
    return [rng.integers(1, a.vocab, int(n)).tolist() for n in lens]


def _model(a, device, dtype):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if a.smoke:
        cfg = Qwen3Config(
            vocab_size=a.vocab,
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=a.layers,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=64,
            tie_word_embeddings=False,
            max_position_embeddings=4096,
        )
    else:  # Qwen3-30B-A3B's attention; the MLP as wide as its 8 active experts of 768
        cfg = Qwen3Config(
            vocab_size=a.vocab,
            hidden_size=2048,
            intermediate_size=8 * 768,
            num_hidden_layers=a.layers,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            tie_word_embeddings=False,
            max_position_embeddings=a.max_prompt + a.new_tokens + 16,
            rope_theta=1e6,
        )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(device=device, dtype=dtype).eval()
    model.set_attn_implementation(ktf.attention_key())  # sdpa on 5.2x (paged| prefix deprecated), paged|sdpa on 5.17
    return model


class FlashInferDecoder:
    """FlashInfer's BatchDecodeWithPagedKVCacheWrapper behind DecodeWrapper's plan/run (install(decoder=...))."""

    def __init__(self, h_q, h_kv, d, ps, dtype, device, max_batch, use_tensor_cores=True):
        import flashinfer

        self.h_q, self.h_kv, self.d, self.ps, self.dtype = h_q, h_kv, d, ps, dtype
        self.ws = torch.empty(256 << 20, dtype=torch.uint8, device=device)
        self.w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.ws, "NHD", use_tensor_cores=use_tensor_cores)

    def plan(self, kv_indptr, kv_indices, kv_lens):
        last_page_len = torch.where(kv_lens > 0, (kv_lens - 1) % self.ps + 1, kv_lens)
        self.w.plan(
            kv_indptr,
            kv_indices,
            last_page_len,
            self.h_q,
            self.h_kv,
            self.d,
            self.ps,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )

    def run(self, q, k_cache, v_cache):
        return self.w.run(q, (k_cache, v_cache))


class Timer:
    """CUDA events around each forward pass of the model and each call of the attention function; beside them the
    host's clock (``time.perf_counter``) around the same calls and around each decoder ``plan`` / ``run`` call
    (:meth:`host_methods`), to tell where a step's time goes when the host, not the GPU, sets the pace."""

    def __init__(self, model, enabled, cuda=True):
        self.enabled, self.cuda, self.steps, self._cur, self._attn, self.hooks = enabled, cuda, [], None, [], []
        self.calls: dict[str, list[float]] = {}  # host seconds per decoder call, by "plan" / "run"
        self._host_attn: list[float] = []
        self._saved: list[tuple] = []
        self.gc = {"collections": [0, 0, 0], "s": 0.0}  # Python's garbage collections in the pass, by generation
        self._gc_t0 = 0.0
        if enabled:
            self.hooks = [
                model.register_forward_pre_hook(self._pre, with_kwargs=True),
                model.register_forward_hook(self._post, with_kwargs=True),
            ]
            gc.callbacks.append(self._gc)

    def _gc(self, phase, info):
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            self.gc["s"] += time.perf_counter() - self._gc_t0
            self.gc["collections"][info["generation"]] += 1

    def _event(self):
        if not self.cuda:  # the CPU smoke run: the host's clock only
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def _pre(self, module, args, kwargs):
        ev = self._event()
        self._attn, self._host_attn = [], []
        max_q = kwargs.get("max_length_q", kwargs.get("max_seqlen_q"))  # 5.2x / 5.17
        self._cur = (ev, max_q, int(kwargs["input_ids"].shape[-1]), time.perf_counter())

    def _post(self, module, args, kwargs, out):
        ev = self._event()
        start, max_q, tokens, t0 = self._cur
        host = (time.perf_counter() - t0, sum(self._host_attn))
        self.steps.append((start, ev, max_q == 1, tokens, self._attn, host))

    def wrap(self, fn):
        if not self.enabled:
            return fn

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            s = self._event()
            out = fn(*args, **kwargs)
            e = self._event()
            self._host_attn.append(time.perf_counter() - t0)
            self._attn.append((s, e))
            return out

        return timed

    def host_methods(self, cls):
        """Time ``cls.plan`` and ``cls.run`` on the host clock until :meth:`restore` (a decoder class)."""
        if not self.enabled:
            return
        for name in ("plan", "run"):
            fn = cls.__dict__[name]
            calls = self.calls.setdefault(name, [])

            def timed(*args, _fn=fn, _calls=calls, **kwargs):
                t0 = time.perf_counter()
                out = _fn(*args, **kwargs)
                _calls.append(time.perf_counter() - t0)
                return out

            self._saved.append((cls, name, fn))
            setattr(cls, name, timed)

    def restore(self):
        for cls, name, fn in self._saved:
            setattr(cls, name, fn)
        self._saved = []
        if self._gc in gc.callbacks:
            gc.callbacks.remove(self._gc)

    def summary(self):
        if not self.enabled:
            return {}
        dec = [(tok, attn, s, e, host) for s, e, is_dec, tok, attn, host in self.steps if is_dec]
        if not dec:
            return {}
        host = np.array([x[4] for x in dec]) * 1e3  # ms: [step, attention]
        tokens = sum(x[0] for x in dec)
        out = dict(decode_steps=len(dec), decode_tokens=tokens)
        if self.cuda:
            torch.cuda.synchronize()
            ms = np.array([s.elapsed_time(e) for _, _, s, e, _ in dec])
            att = np.array([sum(a.elapsed_time(b) for a, b in attn) for _, attn, _, _, _ in dec])
            out.update(
                decode_tok_s=tokens / (ms.sum() / 1e3),
                step_ms_p50=float(np.median(ms)),
                attn_ms_per_step_p50=float(np.median(att)),
                attn_ms_per_step_mean=float(att.mean()),
                attn_share=float(att.sum() / ms.sum()),
            )
        out.update(
            host_step_ms_p50=float(np.median(host[:, 0])),
            host_attn_ms_per_step_p50=float(np.median(host[:, 1])),
        )
        out["gc_collections"] = list(self.gc["collections"])  # the whole pass, prefill included
        out["gc_ms"] = self.gc["s"] * 1e3
        for name, calls in self.calls.items():  # all calls of the pass (prefill steps' plans included)
            if calls:
                out[f"host_{name}_us_p50"] = float(np.median(calls) * 1e6)
                out[f"host_{name}_us_p99"] = float(np.quantile(calls, 0.99) * 1e6)
        return out


def _run(a, model, prompts, impl, table, device, *, new_tokens=None, timed=True):
    from transformers import AttentionInterface, GenerationConfig

    new_tokens = a.new_tokens if new_tokens is None else new_tokens

    ps = a.page_size
    num_blocks = sum(-(-(len(p) + new_tokens) // ps) for p in prompts) + 2 * len(prompts)
    # synchronous, eager, no switch to flash (ktf.continuous_batching_config), the same for every implementation
    cb = ktf.continuous_batching_config(
        page_size=ps,
        num_blocks=num_blocks,
        max_batch_tokens=a.max_batch_tokens,
        max_requests_per_batch=len(prompts),
        allow_block_sharing=False,
    )
    gc = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    handle = None
    if impl == "kvsplit":
        handle = ktf.install(table=table)
    elif impl == "flashinfer":
        handle = ktf.install(decoder=lambda *s: FlashInferDecoder(*s, use_tensor_cores=not a.fi_cuda_cores))
    timer = Timer(model, enabled=timed, cuda=device.type == "cuda")
    if impl in ("kvsplit", "flashinfer"):
        from kvsplit.kernels.wrapper import DecodeWrapper

        timer.host_methods(DecodeWrapper if impl == "kvsplit" else FlashInferDecoder)
    key = ktf.attention_key()  # sdpa (5.2x) or paged|sdpa (5.17)
    own = AttentionInterface()[key]
    AttentionInterface.register(key, timer.wrap(own))
    try:
        t0 = time.perf_counter()
        out = model.generate_batch(prompts, generation_config=gc, continuous_batching_config=cb, warmup=False)
        wall = time.perf_counter() - t0
    finally:
        AttentionInterface.register(key, own)
        timer.restore()
        if handle is not None:
            handle.uninstall()
        for h in timer.hooks:
            h.remove()
    tokens = [list(out[f"req_{i}"].generated_tokens) for i in range(len(prompts))]
    res = dict(impl=impl, wall_s=wall, **timer.summary())
    if handle is not None:
        res["stats"] = dict(handle.stats)
    return res, tokens


def main(argv=None) -> int:
    a = _args(argv)
    device = torch.device("cpu" if a.smoke else "cuda")
    dtype = torch.float32 if a.smoke else torch.bfloat16
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --smoke (and TRITON_INTERPRET=1) on the CPU")
    ktf.import_transformers()
    from kvsplit.kernels import fastplan
    from kvsplit.kernels.policy_table import PolicyTable, load_shipped_table

    print("compiling the planner (numba; cached on disk after the first run)", flush=True)
    fastplan.warmup()
    table = (
        load_shipped_table()
        if a.table == "shipped"
        else PolicyTable.from_export(json.loads(Path(a.table).read_text()))
        if a.table
        else None
    )
    impls = list(a.impls)
    if "flashinfer" in impls:
        try:
            import flashinfer  # noqa: F401
        except ImportError as e:
            print(f"flashinfer: missing ({e}); skipped", flush=True)
            impls.remove("flashinfer")
    prompts = _prompts(a)
    plen = np.array([len(p) for p in prompts])
    print(
        f"{len(prompts)} requests from {a.trace}: prompt tokens p50 {int(np.median(plen))}, max {plen.max()}, "
        f"total {plen.sum()}; {a.new_tokens} new tokens each; {a.layers} layers; page {a.page_size}; "
        f"{'smoke (CPU, fp32)' if a.smoke else torch.cuda.get_device_name(device) + ', bf16'}",
        flush=True,
    )
    model = _model(a, device, dtype)
    check_fp32 = a.check_dtype == "float32" and dtype != torch.float32 and a.check_steps > 0
    results, ref, failed = [], None, False
    if check_fp32:
        print(f"-- check pass: float32 model, first {a.check_steps} tokens, sdpa against kvsplit", flush=True)
        m32 = model.to(torch.float32)
        cref = None
        for impl in [i for i in impls if i in ("sdpa", "kvsplit")]:
            _, toks = _run(a, m32, prompts, impl, table, device, new_tokens=a.check_steps, timed=False)
            if cref is None:
                cref = toks
                continue
            bad = [i for i in range(len(prompts)) if toks[i] != cref[i]]
            failed |= bool(bad)
            print(
                f"   {impl}: {len(prompts) - len(bad)}/{len(prompts)} requests equal to sdpa in float32"
                + (f"; differing: {bad[:8]}" if bad else ""),
                flush=True,
            )
            results.append(dict(impl=impl, check_float32=dict(steps=a.check_steps, requests_differing=len(bad))))
        model = m32.to(dtype)
        del m32
    for impl in impls:
        for w in range(a.warmup):
            print(f"-- {impl}: warm-up pass {w + 1}/{a.warmup} (untimed) ...", flush=True)
            _run(a, model, prompts, impl, table, device, timed=False)
        print(f"-- {impl}: generate_batch ...", flush=True)
        res, toks = _run(a, model, prompts, impl, table, device)
        if ref is None:
            ref = toks
        else:
            bad = [
                (i, next(j for j in range(a.check_steps) if toks[i][j] != ref[i][j]))
                for i in range(len(prompts))
                if toks[i][: a.check_steps] != ref[i][: a.check_steps]
            ]
            res["check"] = dict(
                dtype=str(dtype).removeprefix("torch."), steps=a.check_steps, requests_differing=len(bad), first=bad[:8]
            )
            failed |= bool(bad) and not check_fp32  # with the float32 pass, bf16 agreement is information
            same_all = sum(toks[i] == ref[i] for i in range(len(prompts)))
            res["check"]["requests_equal_all_tokens"] = same_all
            print(
                f"   first {a.check_steps} tokens ({res['check']['dtype']}): {len(prompts) - len(bad)}/{len(prompts)} "
                f"requests equal to sdpa{'' if not bad else f'; differing (request, first step): {bad[:8]}'}; "
                f"all {a.new_tokens} tokens equal: {same_all}/{len(prompts)}",
                flush=True,
            )
        if "decode_tok_s" in res:
            print(
                f"   decode {res['decode_tok_s']:,.0f} tok/s over {res['decode_steps']} decode steps; step p50 "
                f"{res['step_ms_p50']:.2f} ms, attention p50 {res['attn_ms_per_step_p50']:.2f} ms/step "
                f"({res['attn_share']:.1%} of decode time); generate_batch {res['wall_s']:.1f} s",
                flush=True,
            )
        if "host_step_ms_p50" in res:
            calls = "".join(
                f", {name}() p50 {res[f'host_{name}_us_p50']:.1f} us (p99 {res[f'host_{name}_us_p99']:.1f})"
                for name in ("plan", "run")
                if f"host_{name}_us_p50" in res
            )
            print(
                f"   host clock{'' if device.type == 'cuda' else ' (the CPU interpreter: not a speed)'}: step p50 "
                f"{res['host_step_ms_p50']:.2f} ms, attention "
                f"{res['host_attn_ms_per_step_p50']:.2f} ms/step{calls}; garbage collections in the pass "
                f"{res['gc_collections']} (gen 0/1/2), {res['gc_ms']:.1f} ms",
                flush=True,
            )
        if "stats" in res:
            print(f"   hooks: {res['stats']}", flush=True)
        results.append(res)
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                dict(
                    args=vars(a),
                    results=results,
                    torch=torch.__version__,
                    transformers=sys.modules["transformers"].__version__,
                ),
                indent=1,
            )
        )
    print("check: " + ("FAILED" if failed else "ok"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
