"""One compiled Triton variant per kernel configuration: the specialization key of the decode kernels' launches,
computed by Triton's own launch binder for the CUDA backend (``create_function_from_signature``, what
``JITFunction.run`` computes before it looks up or compiles a kernel), stays the same from batch to batch.

Triton specializes an integer argument on its value class (1, a multiple of 16, other) and a pointer on 16-byte
alignment; an argument that changes class with the batch compiles another variant the first time a server (or a
tuning campaign) meets it. The kernels' launches are recorded here instead of run (no GPU, no interpreter run)."""

from __future__ import annotations

import numpy as np
import torch
from triton.backends.nvidia.compiler import CUDABackend
from triton.runtime.jit import JITFunction, create_function_from_signature

import kvsplit.kernels.decode as decode
from kvsplit.kernels.wrapper import DecodeWrapper

from .paged_case import make_case

_OPTIONS = ("num_warps", "num_stages", "maxnreg", "launch_pdl")


class _Recorder:
    """Stands for a Triton kernel: ``kernel[grid](*args, **kw)`` records the launch's specialization key and the
    values of ``watch`` (arguments that change with the batch), and launches nothing."""

    def __init__(self, kernel, watch: tuple[str, ...]) -> None:
        # under TRITON_INTERPRET=1 the kernel is an InterpretedFunction: the same function and declaration
        fn = kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn, **kernel.kwargs)
        self.names = [p.name for p in fn.params]
        self.binder = create_function_from_signature(fn.signature, fn.params, CUDABackend)
        self.watch = watch
        self.keys: set = set()
        self.seen: dict[str, set] = {w: set() for w in watch}

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            options = tuple(sorted((k, kwargs.pop(k)) for k in _OPTIONS if k in kwargs))
            _, specialization, _ = self.binder(*args, **kwargs)
            self.keys.add((tuple(map(str, specialization)), options))
            bound = dict(zip(self.names, args)) | kwargs
            for w in self.watch:
                self.seen[w].add(int(bound[w]))

        return launch


def _classes(values) -> set[str]:
    return {"1" if v == 1 else "multiple of 16" if v % 16 == 0 else "other" for v in values}


def test_an_eager_decode_loop_compiles_one_stage1_and_one_merge_variant(monkeypatch):
    """A DecodeWrapper loop of one policy over batches whose work-tile counts fall in every value class (1, a
    multiple of 16, other): one stage-1 key and one merge key."""
    stage1 = _Recorder(decode._decode_stage1_kernel, ("num_tiles",))
    merge = _Recorder(decode._decode_merge_kernel, ())
    monkeypatch.setattr(decode, "_decode_stage1_kernel", stage1)
    monkeypatch.setattr(decode, "_decode_merge_kernel", merge)
    h_q, h_kv, d, ps = 4, 1, 64, 16
    params = {"num_splits": 2, "block_n": 32, "num_warps": 4, "num_stages": 2}
    w = DecodeWrapper(
        h_q, h_kv, d, page_size=ps, dtype="float16", device="cpu", max_batch_size=40, policy="fixed", params=params
    )
    rng = np.random.default_rng(0)
    for B in (1, 8, 3, 16, 5, 24, 1, 31):  # fixed 2 splits, one KV head: 2 * B work tiles
        lens = rng.integers(40, 900, B).tolist()
        case = make_case(lens, num_qo_heads=h_q, num_kv_heads=h_kv, head_dim=d, page_size=ps, dtype=torch.float16)
        w.plan(case["kv_indptr"], case["kv_indices"], case["kv_lens"], kv_lens_host=lens,
               kv_indptr_host=case["kv_indptr"].numpy(), kv_indices_host=case["kv_indices"].numpy())  # fmt: skip
        w.run(case["q"], case["k_cache"], case["v_cache"])
    assert _classes(stage1.seen["num_tiles"]) == {"multiple of 16", "other"}, stage1.seen
    assert len(stage1.keys) == 1, stage1.keys
    assert len(merge.keys) == 1, merge.keys
