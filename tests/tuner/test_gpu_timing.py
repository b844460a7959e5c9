"""kvsplit.tuner.gpu, the timing every GPU benchmark shares: CUDA-graph medians, the read floors, the plan timer.

The GPU tests check physical bounds against figures measured in the same process: no kernel reads the batch's
pages faster than the streaming read, and the decode kernel, which reads the same pages and does the attention
math besides, is no faster than the paged read floor.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvsplit.tuner.workloads import family_kv_lens


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_graph_median_without_cuda_is_a_clear_error():
    from kvsplit.tuner.gpu import graph_median_s

    with pytest.raises(RuntimeError, match="CUDA is not available"):
        graph_median_s(lambda: None)


@pytest.mark.gpu
def test_graph_median_times_a_copy_at_memory_speed():
    from kvsplit.tuner.gpu import graph_median_s, measure_read_bandwidth

    bw = measure_read_bandwidth(1 << 30)
    x = torch.randn(128 << 20, device="cuda")  # 512 MiB, far above the L2
    y = torch.empty_like(x)
    t = graph_median_s(lambda: y.copy_(x), warmup_ms=5, rep_ms=20)
    # a copy reads and writes every byte: not faster than reading them twice at the streaming-read rate,
    # and (HBM writes are not much slower than reads) within 3x of that
    assert 2 * x.numel() * 4 / bw * 0.9 <= t <= 3 * 2 * x.numel() * 4 / bw
    torch.testing.assert_close(y, x)


@pytest.mark.gpu
def test_graph_median_refuses_a_function_that_cannot_be_captured():
    from kvsplit.tuner.gpu import graph_median_s

    x = torch.ones(4, device="cuda")
    with pytest.raises(RuntimeError, match="capture failed"):
        graph_median_s(lambda: float(x.sum()))  # a host read inside the capture


@pytest.mark.gpu
def test_read_floors_bound_the_decode_time():
    from kvsplit.kernels.plan import make_plan
    from kvsplit.tuner.gpu import GpuTimer

    T = 262_144
    timer = GpuTimer(num_qo_heads=32, num_kv_heads=4, head_dim=128, max_tokens=T, max_batch=64)
    for fam, B in (("uniform", 64), ("skewed80", 8)):
        L = family_kv_lens(fam, B, T)
        paged = timer.paged_read_floor_s(L, warmup_ms=5, rep_ms=20)
        hbm = timer.hbm_floor_s(L)
        assert 0.9 * hbm <= paged <= 3 * hbm, (fam, B, paged, hbm)
        plan = make_plan(L, num_kv_heads=4, device=torch.cuda.get_device_name(), policy="balanced")
        t = timer.time_plan(plan, warmup_ms=5, rep_ms=20)
        assert t >= 0.95 * paged, (fam, B, t, paged)
        assert timer.max_error(plan) < 2e-2
    with pytest.raises(ValueError, match="power of two"):
        GpuTimer(num_qo_heads=24, num_kv_heads=3, head_dim=128, max_tokens=4096, max_batch=4).paged_read_floor_s(
            np.array([100, 200])
        )
