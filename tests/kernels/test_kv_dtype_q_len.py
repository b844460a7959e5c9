"""FP8 K/V and q_len > 1 in the shape, the bucket key, the policy table and the planner's rules.

Keys of 16-bit q_len-1 batches keep their string (the shipped table still parses and serves); another KV dtype or
q_len is another family, never served across; residency and the wave-aware chunk count FP8's bytes and the extra
query rows, checked against hand-computed occupancy; plans of the new shapes keep every invariant and equal the
NumPy oracle's (hypothesis).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvsplit.kernels.buckets import BucketKey, bucket_key, distance, key_of
from kvsplit.kernels.device import DeviceSpec, resolve_device
from kvsplit.kernels.limits import KernelConfig, default_config
from kvsplit.kernels.plan import make_plan
from kvsplit.kernels.policy_table import PolicyTable, check_policy_entry, load_shipped_table, shipped_policies
from kvsplit.kernels.residency import arch, occupancy, resident_ctas_per_sm
from kvsplit.kernels.rulespec import (
    RULE_WAVE,
    RULE_WAVE1,
    RULE_WAVE2,
    PlanContext,
    fit_heads_per_tile,
    resident_slots,
    resolve,
    shared_memory_refused,
    wave_target,
    wave_tile_cost,
    whole_wave_tiles,
)
from kvsplit.kernels.shape import Shape, shape_family

from . import oracle
from .test_plan_policies import POLICY_CASES, check_invariants, kv_lens_st

H200 = DeviceSpec.known("NVIDIA H200")
FP8 = "float8_e4m3fn"
QWEN = dict(device="h200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)


# --------------------------------------------------------------------------- Shape


def test_shape_defaults_and_aliases():
    s = Shape.of(**QWEN)
    assert (s.kv_dtype, s.q_len) == ("bfloat16", 1)
    assert Shape.of(**QWEN, kv_dtype="bfloat16") == s == Shape.of(**QWEN, kv_dtype="bf16")
    f = Shape.of(**QWEN, kv_dtype="fp8", q_len=4)
    assert (f.kv_dtype, f.q_len) == (FP8, 4)
    assert f.family == ("nvidia-h200", 4, 128, "bfloat16", 16, FP8, 4)
    assert f.family != s.family and s.family == shape_family("NVIDIA H200", 4, 128, "bfloat16", 16)
    # the direct constructor's default kv_dtype is the dtype itself
    assert Shape(H200, 32, 4, 128, "float16").kv_dtype == "float16"


@pytest.mark.parametrize(
    "over,field",
    [
        ({"q_len": 0}, "q_len"),
        ({"q_len": 9}, "q_len"),
        ({"q_len": True}, "q_len"),
        ({"q_len": 2.0}, "q_len"),
        ({"kv_dtype": "int8"}, "kv_dtype"),
        ({"kv_dtype": "float16"}, "kv_dtype"),  # a 16-bit cache of another dtype than q's
        ({"kv_dtype": FP8, "dtype": "float32"}, "kv_dtype"),  # FP8 K/V need a 16-bit q
        ({"kv_dtype": 1}, "kv_dtype"),
        ({"num_qo_heads": 64, "q_len": 8}, "q_len"),  # G = 16 x 8 = 128 query rows > 64
    ],
)
def test_shape_errors_name_the_argument(over, field):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        Shape.of(**{**QWEN, **over})


def test_largest_tile_rows_accepted():
    assert Shape.of(**{**QWEN, "num_qo_heads": 32, "q_len": 8}).q_len == 8  # G 8 x 8 = 64 rows
    assert Shape.of(**{**QWEN, "num_qo_heads": 64, "q_len": 4}).q_len == 4  # G 16 x 4 = 64 rows


# --------------------------------------------------------------------------- bucket keys


def test_default_keys_keep_their_string_and_the_shipped_table_still_parses():
    L = [4096, 17, 9000, 300]
    k = bucket_key(L, num_kv_heads=4, head_dim=128, dtype="bfloat16", device="NVIDIA H200")
    assert str(k).startswith("nvidia-h200.kv4.d128.bf16.p16.b") and ".kvfp8" not in str(k) and ".q" not in str(k)
    assert k == bucket_key(
        L, num_kv_heads=4, head_dim=128, dtype="bfloat16", device="NVIDIA H200", kv_dtype="bfloat16", q_len=1
    )
    families: dict[tuple, int] = {}
    for p in shipped_policies()["policies"]:
        key = BucketKey.parse(p["bucket"]["key"])
        assert str(key) == p["bucket"]["key"]
        fam = (key.gpu, key.num_kv_heads, key.kv_dtype, key.q_len)
        families[fam] = families.get(fam, 0) + 1
    # every shipped family is a default one (KV in the model's dtype, q_len 1) but the H100 table's Qwen3-30B-A3B
    # families of an fp8 cache and of q_len 2 (122 buckets each), of q_len 4 and of q_len 8 (123 each)
    other = {f: n for f, n in families.items() if f[2:] != (None, 1)}
    assert other == {
        ("nvidia-h100-80gb-hbm3", 4, FP8, 1): 122,
        ("nvidia-h100-80gb-hbm3", 4, None, 2): 122,
        ("nvidia-h100-80gb-hbm3", 4, None, 4): 123,
        ("nvidia-h100-80gb-hbm3", 4, None, 8): 123,
    }


@pytest.mark.parametrize("kv_dtype,q_len,part", [(FP8, 1, ".kvfp8.b"), (None, 4, ".q4.b"), ("fp8", 8, ".kvfp8.q8.b")])
def test_new_family_parts_round_trip(kv_dtype, q_len, part):
    L = np.array([5000, 17, 0, 9000], dtype=np.int64)
    kw = dict(num_kv_heads=4, head_dim=128, dtype="bfloat16", device="NVIDIA H200")
    k = bucket_key(L, **kw, kv_dtype=kv_dtype, q_len=q_len)
    base = bucket_key(L, **kw)
    s = str(k)
    assert s == str(base).replace(".p16.b", ".p16" + part, 1)
    assert part in s and BucketKey.parse(s) == k
    # the NumPy oracle builds the same key from its own histogram
    assert oracle.bucket_key(L, **kw, kv_dtype=None if kv_dtype is None else FP8, q_len=q_len) == k
    # the same signature in another family is infinitely far away
    assert (k.batch_class, k.tokens_class, k.hist) == (base.batch_class, base.tokens_class, base.hist)
    assert distance(k, base) == math.inf and distance(k, k) == 0.0
    shape = Shape.of(**QWEN, kv_dtype=kv_dtype, q_len=q_len)
    assert key_of(L, shape.plan_context()) == k and k.family == shape.family


@pytest.mark.parametrize(
    "text",
    [
        "nvidia-h200.kv4.d128.bf16.p16.q1.b2.t14.w26x16",  # q_len 1 is written by leaving the part out
        "nvidia-h200.kv4.d128.bf16.p16.q9.b2.t14.w26x16",
        "nvidia-h200.kv4.d128.bf16.p16.q04.b2.t14.w26x16",
        "nvidia-h200.kv4.d128.bf16.p16.kvfp16.b2.t14.w26x16",
        "nvidia-h200.kv4.d128.f32.p16.kvfp8.b2.t14.w26x16",  # FP8 K/V with an fp32 q
        "nvidia-h200.kv4.d128.bf16.p16.q4.kvfp8.b2.t14.w26x16",  # the parts in the wrong order
    ],
)
def test_bad_key_strings_refused(text):
    with pytest.raises(ValueError):
        BucketKey.parse(text)


# --------------------------------------------------------------------------- policy table families


def _entry(pid, key, *, backend="gpu", **extra):
    k = BucketKey.parse(key)
    return {
        "id": pid,
        "version": 1,
        "bucket": key,
        "gpu": "NVIDIA H200",
        "num_kv_heads": k.num_kv_heads,
        "head_dim": k.head_dim,
        "dtype": k.dtype,
        "page_size": k.page_size,
        "name": "tuned",
        "params": {"ctas_per_sm": 2.0, "block_n": 64},
        "backend": backend,
        **extra,
    }


def test_table_never_serves_across_kv_dtype_or_q_len():
    L = [9000, 4000, 300, 17] * 8
    kw = dict(num_kv_heads=4, head_dim=128, dtype="bfloat16", device="NVIDIA H200")
    k16 = str(bucket_key(L, **kw))
    k8 = str(bucket_key(L, **kw, kv_dtype=FP8))
    kq = str(bucket_key(L, **kw, q_len=4))
    ask = dict(gpu="NVIDIA H200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16")
    only16 = PolicyTable.from_json(PolicyTable.document([_entry(1, k16)], version=1))
    _, b, pol = only16.plan(L, **ask)
    assert pol["source"] == "tuned" and b["matched"] == k16
    for extra in ({"kv_dtype": FP8}, {"q_len": 4}, {"kv_dtype": FP8, "q_len": 4}):
        _, b, pol = only16.plan(L, **ask, **extra)
        assert pol["source"] == "fallback" and b["matched"] is None and b["key"] != k16
    both = PolicyTable.from_json(
        PolicyTable.document([_entry(1, k16), _entry(2, k8, backend="sim"), _entry(3, kq)], version=1)
    )
    p8, b, pol = both.plan(L, **ask, kv_dtype="fp8")
    assert (pol["id"], pol["source"], b["key"], b["matched"]) == (2, "simulated", k8, k8)
    assert p8 == make_plan(L, policy="tuned", params={"ctas_per_sm": 2.0, "block_n": 64}, kv_dtype=FP8, **kw)
    pq, b, pol = both.plan(L, **ask, q_len=4)
    assert (pol["id"], b["key"]) == (3, kq)
    assert pq == make_plan(
        L, policy="tuned", params={"ctas_per_sm": 2.0, "block_n": 64}, q_len=4, num_qo_heads=32, **kw
    )
    # a Shape carries the same family as the keywords
    _, b, pol = both.plan(L, Shape.of(**QWEN, kv_dtype=FP8))
    assert pol["id"] == 2


def test_entry_fields_must_agree_with_the_key():
    k8 = str(bucket_key([100, 200], num_kv_heads=4, head_dim=128, dtype="bfloat16", device="h200", kv_dtype=FP8))
    ok = _entry(1, k8, kv_dtype=FP8, q_len=1)
    assert len(PolicyTable.from_json(PolicyTable.document([ok], version=1))) == 1
    check_policy_entry(ok)
    for bad in (_entry(1, k8, kv_dtype="bfloat16"), _entry(1, k8, q_len=2)):
        with pytest.raises(ValueError, match="do not match bucket"):
            PolicyTable.from_json(PolicyTable.document([bad], version=1))
        with pytest.raises(ValueError, match="bucket.key: its (kv_dtype|q_len)"):
            check_policy_entry(bad)


def test_shipped_table_serves_16_bit_q_len_1_as_before():
    table = load_shipped_table()
    L = [32768] + [2000] * 63
    ask = dict(gpu="NVIDIA H200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16")
    _, b, pol = table.plan(L, **ask)
    assert pol["source"] == "tuned"
    _, b8, pol8 = table.plan(L, **ask, kv_dtype=FP8)
    assert pol8["source"] == "fallback" and b8["key"] == b["key"].replace(".p16.", ".p16.kvfp8.")


# --------------------------------------------------------------------------- residency and tile weights


def _occ(regs, smem, warps):
    """Hand-computed occupancy on the H200 (CUDA occupancy rules; 64K registers, 228 KB shared memory)."""
    by_regs = 65536 // (math.ceil(regs * 32 / 256) * 256 * warps)
    by_smem = (228 * 1024) // (math.ceil(smem / 128) * 128 + 1024)
    return max(1, min(by_regs, by_smem, 2048 // (32 * warps), 32))


def test_fp8_halves_the_kv_buffers():
    # (128, 4, 3) with the prefetch: 168 registers, 139,264 B of shared memory (measured, 16-bit), two K/V buffers
    # of 2 x 128 x 128 x 2 B: one CTA per SM; at 1 byte per element 139,264 - 65,536 = 73,728 B: three
    bf16 = resident_ctas_per_sm(H200, 128, "bfloat16", 2, 128, 4, 3, prefetch=True)
    fp8 = resident_ctas_per_sm(H200, 128, "bfloat16", 2, 128, 4, 3, prefetch=True, kv_bytes=1)
    assert (bf16, fp8) == (_occ(168, 139264, 4), _occ(168, 139264 - 65536, 4)) == (1, 3)
    # a config the FP8 compiles have (COMPILED_FP8) takes their figures instead: (128, 4, 2) runs 204 registers and
    # 73,728 B with an FP8 cache (V widened into a float16 buffer), 2 CTAs per SM, where halving the 16-bit kernel's
    # K/V buffer would count 3
    assert resident_ctas_per_sm(H200, 128, "bfloat16", 2, 128, 4, 2, kv_bytes=1) == _occ(204, 73728, 4) == 2
    assert _occ(168, 73728 - 32768, 4) == 3
    ctx8 = PlanContext(H200, 4, 128, 16, "bfloat16", FP8)
    assert resident_slots(ctx8, KernelConfig(128, 4, 3, prefetch=True)) == 3 * 132


def test_fp8_residency_is_the_compiled_kernels():
    # the FP8 stage-1 kernel widens e4m3 in registers: (64, 4, 2) compiled for sm_90 takes 140 registers and
    # 38,912 B (COMPILED_FP8) where the 16-bit kernel takes 118 and 38,912 B: 3 CTAs per SM, not the 4 that halving
    # the 16-bit kernel's K/V buffers gives
    assert resident_ctas_per_sm(H200, 128, "bfloat16", 2, 64, 4, 2) == _occ(118, 38912, 4) == 4
    assert resident_ctas_per_sm(H200, 128, "bfloat16", 2, 64, 4, 2, kv_bytes=1) == _occ(140, 38912, 4) == 3
    # and the fallback's tile, (32, 4, 3) with the prefetch and two heads: 128 registers, 46,080 B -> 4 (the same
    # figures on the H100: the table is the sm_90 compile's)
    fb = dict(prefetch=True, heads_per_tile=2, kv_bytes=1)
    assert resident_ctas_per_sm(H200, 128, "bfloat16", 2, 32, 4, 3, **fb) == _occ(128, 46080, 4) == 4
    assert resident_ctas_per_sm(resolve_device("h100"), 128, "bfloat16", 2, 32, 4, 3, **fb) == 4
    # so a plan of 4 tiles per SM on that tile aims at whole resident waves, 3 x 132 tiles (not 4 x 132: one
    # partial wave); 16-bit K/V keep 4 x 132
    fp8 = PlanContext(H200, 4, 128, 16, "bfloat16", FP8)
    bf16 = PlanContext(H200, 4, 128, 16, "bfloat16", None)
    assert wave_target(fp8, KernelConfig(64, 4, 2), 4.0) == 3 * 132
    assert wave_target(bf16, KernelConfig(64, 4, 2), 4.0) == 4 * 132
    # the rows hold for float16 q, and a q_len > 1 tile over an FP8 cache counts its own compiled verify-step kernel
    # (COMPILED_QLEN): (128, 4, 2) at q_len 4 takes 255 registers and 81,920 B (the 16-bit kernel 232 and 81,920 B)
    assert resident_ctas_per_sm(H200, 128, "float16", 2, 64, 4, 2, kv_bytes=1) == 3
    q4 = PlanContext(H200, 4, 128, 16, "bfloat16", FP8, 4, 8)
    assert resident_slots(q4, KernelConfig(128, 4, 2)) == _occ(255, 81920, 4) * 132 == 2 * 132
    # where widening e4m3 costs a CTA: (128, 8, 2) takes 166 registers over FP8 (128 over 16 bits): 1 CTA per SM,
    # where halving the 16-bit kernel's K/V buffers would count 2
    assert resident_slots(q4, KernelConfig(128, 8, 2)) == _occ(166, 81920, 8) * 132 == 132
    assert _occ(128, 81920 - 32768, 8) == 2


def test_q_len_rows_cost_registers():
    # G = 8: q_len 4 makes 32 query rows; (128, 4, 2)'s verify-step kernel compiled at 32 rows (COMPILED_QLEN): 232
    # registers, 81,920 B -> 2 CTAs per SM (3 at q_len 1); at q_len 8 (64 rows) 255 registers, 147,968 B -> 1
    ctx = PlanContext(H200, 4, 128, 16, "bfloat16", None, 4, 8)
    assert resident_slots(ctx, KernelConfig(128, 4, 2)) == _occ(232, 81920, 4) * 132 == 2 * 132
    assert resident_slots(dataclasses.replace(ctx, q_len=8), KernelConfig(128, 4, 2)) == _occ(255, 147968, 4) * 132
    assert resident_slots(dataclasses.replace(ctx, q_len=8), KernelConfig(128, 4, 2)) == 132
    assert resident_slots(dataclasses.replace(ctx, q_len=1), KernelConfig(128, 4, 2)) == 3 * 132
    assert occupancy(H200, 4, 168, 73728) == 3
    # q_len 2 at G = 8 is 16 rows, the q_len-1 tile's padded dot, but the verify-step kernel (causal mask, a row's
    # token and head) compiles to 238 registers where the q_len-1 kernel takes 168: 2 CTAs per SM, not 3
    assert resident_slots(dataclasses.replace(ctx, q_len=2), KernelConfig(128, 4, 2)) == _occ(238, 73728, 4) * 132
    assert resident_slots(dataclasses.replace(ctx, q_len=2), KernelConfig(128, 4, 2)) == 2 * 132
    # (64, 4, 2): 150 registers at q_len 2 (118 at q_len 1): 3 CTAs per SM, not 4; 168 at q_len 4 (32 rows): 3
    assert resident_slots(dataclasses.replace(ctx, q_len=2), KernelConfig(64, 4, 2)) == _occ(150, 38912, 4) * 132
    assert resident_slots(dataclasses.replace(ctx, q_len=2), KernelConfig(64, 4, 2)) == 3 * 132
    assert resident_slots(ctx, KernelConfig(64, 4, 2)) == _occ(168, 45056, 4) * 132 == 3 * 132
    # the compiled kernel is the sm_90 target's: the H100 (estimates at q_len 1, no measured table of its own) reads
    # the same verify-step figures
    h100 = DeviceSpec.known("NVIDIA H100 80GB HBM3")
    assert arch(h100) == arch(H200) == "sm_90"
    for q, cfg, want in (
        (2, KernelConfig(128, 4, 2), 2),
        (4, KernelConfig(64, 4, 2), 3),
        (8, KernelConfig(64, 4, 2), 2),
    ):
        c = dataclasses.replace(ctx, q_len=q)
        assert resident_slots(dataclasses.replace(c, device=h100), cfg) == resident_slots(c, cfg) == want * 132
    # (32, 8, 2) at q_len 4, compiled: 125 registers, 26,624 B -> 2 CTAs per SM (3 at q_len 1)
    assert resident_slots(ctx, KernelConfig(32, 8, 2)) == _occ(125, 26624, 8) * 132 == 2 * 132
    assert resident_slots(dataclasses.replace(ctx, q_len=1), KernelConfig(32, 8, 2)) == 3 * 132
    # a shape the compiles lack (head_dim 64): the q_len-1 estimate (128 registers, one 2 x 32 x 64 x 2 B K/V buffer)
    # plus the count of live values for 16 more rows, 1.5 x 16 x (64 + 32) / 256 = 9 registers: 137 -> 1 CTA (2 at
    # q_len 1)
    d64 = dataclasses.replace(ctx, head_dim=64)
    assert resident_slots(d64, KernelConfig(32, 8, 2)) == _occ(128 + 9, 8192, 8) * 132 == 1 * 132
    assert resident_slots(dataclasses.replace(d64, q_len=1), KernelConfig(32, 8, 2)) == 2 * 132
    # above 32 rows the default tile takes BLOCK_N 64 (the 128-token tile would spill)
    assert default_config(128, "bfloat16", query_rows=64).block_n == 64
    assert default_config(128, "bfloat16", query_rows=32) == default_config(128, "bfloat16")
    assert resolve("balanced", num_kv_heads=4, device=H200, q_len=8, num_qo_heads=32).config.block_n == 64


def test_a_tile_whose_compiled_kernel_exceeds_the_shared_memory_of_a_cta_is_refused():
    # (128, 4, 2) with two KV heads per tile: the sm_90 compile at G = 8 (bench/compile_sm90.py --q-len N --heads 2)
    # takes 147,456 B at q_len 2 (32 rows) and 279,552 B at q_len 4 (64 rows); Hopper lets a CTA have 227 KB
    # (232,448 B, the CUDA programming guide's sm_90 limit, DeviceSpec.smem_per_block_bytes)
    assert H200.smem_per_block_bytes == 227 * 1024 == 232448
    h100 = DeviceSpec.known("NVIDIA H100 80GB HBM3")
    params = {"block_n": 128, "num_warps": 4, "num_stages": 2, "heads_per_tile": 2}
    for dev in (H200, h100):
        ctx = PlanContext(dev, 4, 128, 16, "bfloat16", None, 4, 8)
        cfg = KernelConfig(128, 4, 2, heads_per_tile=2)
        assert shared_memory_refused(dataclasses.replace(ctx, q_len=2), cfg) is None
        why = shared_memory_refused(ctx, cfg)
        assert why is not None and "279552 bytes of shared memory" in why and "232448" in why
        plan = make_plan(
            [4096] * 8, policy="balanced", params=params, device=dev.name, q_len=2, num_qo_heads=32, num_kv_heads=4
        )
        assert plan.config.heads_per_tile == 2
        with pytest.raises(ValueError, match=r"^params: block_n=128, .*heads_per_tile=2 at q_len=4 needs 279552 bytes"):
            make_plan(
                [4096] * 8, policy="balanced", params=params, device=dev.name, q_len=4, num_qo_heads=32, num_kv_heads=4
            )
    # the whole-wave rule's two-head tile, (64, 4, 3) with the prefetch: 212,992 B at q_len 4, so it stays a candidate
    ctx = PlanContext(H200, 4, 128, 16, "bfloat16", None, 4, 8)
    assert KernelConfig(64, 4, 3, prefetch=True, heads_per_tile=2) in whole_wave_tiles(ctx, heads=2)
    # (64, 4, 4) with the prefetch and two heads, whose launch stopped a q_len-4 campaign on the H100 (Triton:
    # "Required: 278528, Hardware limit: 232448"), is refused at planning from its compile
    why = shared_memory_refused(ctx, KernelConfig(64, 4, 4, prefetch=True, heads_per_tile=2))
    assert why is not None and "278528 bytes" in why


def test_fp8_charges_two_blocks_per_tile_at_one_wave():
    cfg = KernelConfig(128, 4, 2)
    # one resident wave of (128, 4, 2): 3 CTAs per SM with 16-bit K/V, 2 with FP8 (COMPILED_FP8)
    assert wave_tile_cost(PlanContext(H200, 4, 128, 16, "bfloat16"), cfg, 3 * 132) == 128
    assert wave_tile_cost(PlanContext(H200, 4, 128, 16, "bfloat16", FP8), cfg, 2 * 132) == 256
    assert wave_tile_cost(PlanContext(H200, 4, 128, 16, "bfloat16", FP8), cfg, 2 * 132 - 1) == 0
    assert wave_tile_cost(PlanContext(H200, 4, 128, 16, "bfloat16", FP8), cfg, 3 * 132) == 0
    # balanced's default 4 tiles per SM on that tile: one resident wave of 3 x 132 with 16-bit K/V; two waves of
    # 2 x 132 with FP8 (no fixed cost: it is charged at exactly one wave), one at 2 tiles per SM
    sp16 = resolve("balanced", num_kv_heads=4, device=H200)
    sp8 = resolve("balanced", num_kv_heads=4, device=H200, kv_dtype=FP8)
    assert (sp16.chunk_rule, sp16.chunk_arg, sp8.chunk_rule, sp8.chunk_arg) == (RULE_WAVE1, 396, RULE_WAVE, 528)
    sp8 = resolve("balanced", {"ctas_per_sm": 2}, num_kv_heads=4, device=H200, kv_dtype=FP8)
    assert (sp8.chunk_rule, sp8.chunk_arg) == (RULE_WAVE2, 264)


def test_heads_per_tile_fit_counts_q_len():
    # G = 4 (16/4): 4 heads fill 16 rows at q_len 1; at q_len 4 each head is 16 rows: 4 heads = 64 rows still fit
    # the kernel's one 64-row tile, but only heads whose G fits 16 rows share a tile, as at q_len 1
    assert fit_heads_per_tile({"heads_per_tile": 4}, 16, 4, 4) == {"heads_per_tile": 4}
    assert fit_heads_per_tile({"heads_per_tile": 4}, 16, 4, 8) == {"heads_per_tile": 2}  # 2 x 4 x 8 = 64
    assert fit_heads_per_tile({"heads_per_tile": 2}, 32, 4, 8) == {"heads_per_tile": 1}  # 2 x 8 x 8 = 128
    with pytest.raises(ValueError, match="^params.heads_per_tile: 8 tokens x GQA group G=8 x heads_per_tile=2 are 128"):
        resolve("balanced", {"heads_per_tile": 2}, num_kv_heads=4, device=H200, q_len=8, num_qo_heads=32)


# --------------------------------------------------------------------------- plans (hypothesis)

NEW_SHAPES = [(FP8, 1), (None, 2), (None, 4), (FP8, 4), (FP8, 8), (None, 8)]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kv=kv_lens_st,
    case=st.sampled_from(POLICY_CASES),
    shape=st.sampled_from(NEW_SHAPES),
    hkv=st.sampled_from([1, 4, 8]),
    group=st.sampled_from([1, 4, 8]),
)
def test_plans_of_new_shapes_keep_invariants_and_match_the_oracle(kv, case, shape, hkv, group):
    kv_dtype, q_len = shape
    assume(group * q_len <= 64)
    kv = [max(int(n), q_len) for n in kv]  # a verify step's kv_len counts its q_len tokens (shorter: refused)
    policy, params = case
    kw = dict(
        num_kv_heads=hkv,
        device=H200,
        policy=policy,
        params=params,
        kv_dtype=kv_dtype,
        q_len=q_len,
        num_qo_heads=group * hkv,
    )
    plan = make_plan(kv, **kw)
    check_invariants(plan)
    assert plan.to_dict() == oracle.make_plan(kv, **kw).to_dict()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kv=st.lists(st.integers(1, 40_000), min_size=1, max_size=300),
    hkv=st.sampled_from([1, 2, 4, 8]),
    ctas=st.sampled_from([1.0, 2.0, 3.0, 4.0]),
)
def test_fp8_never_makes_more_tiles_than_bf16(kv, hkv, ctas):
    """The same resident waves, a heavier fixed cost per tile: the wave-aware chunk of an FP8 cache is at least
    the 16-bit one's, so it never plans more work tiles (its tie-break goes to fewer tiles sooner). The tile is
    (64, 8, 3), 2 CTAs per SM with either cache (MEASURED, COMPILED_FP8)."""
    tile = {"block_n": 64, "num_warps": 8, "num_stages": 3}
    kw = dict(num_kv_heads=hkv, device=H200, policy="balanced", params={"ctas_per_sm": ctas, **tile})
    p16 = make_plan(kv, **kw)
    p8 = make_plan(kv, **kw, kv_dtype=FP8)
    assert p8.config == p16.config
    cfg = KernelConfig(64, 8, 3)
    slots = resident_slots(PlanContext(H200, hkv, 128, 16, "bfloat16"), cfg)
    assert resident_slots(PlanContext(H200, hkv, 128, 16, "bfloat16", FP8), cfg) == slots == 2 * 132
    assert p8.num_work_items <= p16.num_work_items
    check_invariants(p8)


def test_fp8_spellings_mean_one_family_everywhere():
    """``"float8_e4m3fn"``, ``"fp8"`` and ``torch.float8_e4m3fn`` are one KV dtype for the planner, the bucket key,
    the policy table and the engine wrapper; an unknown one is refused naming kv_dtype and listing the alias."""
    torch = pytest.importorskip("torch")
    from kvsplit.kernels.limits import check_kv_dtype
    from kvsplit.kernels.wrapper import DecodeWrapper

    L = [4096, 17, 9000, 300]
    kw = dict(num_kv_heads=4, head_dim=128, dtype="bfloat16", device="NVIDIA H200")
    spellings = (FP8, "fp8", torch.float8_e4m3fn)
    assert {check_kv_dtype(s, "bfloat16") for s in spellings} == {FP8}
    assert check_kv_dtype(torch.bfloat16, "bfloat16") == "bfloat16" and check_kv_dtype(None, "float16") == "float16"
    keys = {str(bucket_key(L, **kw, kv_dtype=s)) for s in spellings}
    assert len(keys) == 1 and ".kvfp8." in keys.pop()
    plans = [make_plan(L, num_kv_heads=4, device="h200", kv_dtype=s) for s in spellings]
    assert all(p.config == plans[0].config and np.array_equal(p.work_kv_end, plans[0].work_kv_end) for p in plans)
    for s in spellings:
        w = DecodeWrapper(32, 4, 128, dtype="float16", device="cpu", kv_dtype=s)
        assert w.kv_dtype == torch.float8_e4m3fn
    with pytest.raises(ValueError, match=r"^kv_dtype: expected 'bfloat16' \(q's dtype, the default\) or "):
        check_kv_dtype("int8", "bfloat16")
    with pytest.raises(ValueError, match=r"'float8_e4m3fn' \(or 'fp8'\), got torch\.int8$"):
        check_kv_dtype(torch.int8, "bfloat16")
    with pytest.raises(ValueError, match=r"^kv_dtype: float8_e4m3fn needs a float16 or bfloat16 q"):
        DecodeWrapper(32, 4, 128, dtype="float32", device="cpu", kv_dtype="fp8")


def test_kv_len_below_q_len_refused_by_planner_and_table():
    """make_plan and PolicyTable.plan refuse a kv_len below q_len (0 included) naming the entry, as the wrapper and
    the launch do; a range error of the same batch comes first; at q_len 1 a 0 is an empty slot."""
    table = load_shipped_table()
    shape = dict(gpu="h200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)
    for lens, q_len, i in (([4096, 3, 9000], 4, 1), ([0, 8], 2, 0), ([7, 7, 6], 7, 2)):
        msg = rf"^kv_lens\[{i}\]: {lens[i]} tokens, fewer than q_len={q_len} "
        with pytest.raises(ValueError, match=msg):
            make_plan(lens, num_kv_heads=4, device="h200", q_len=q_len)
        with pytest.raises(ValueError, match=msg):
            table.plan(lens, **shape, q_len=q_len)
    with pytest.raises(ValueError, match=r"^kv_lens\[1\]: expected 0 <= kv_len"):
        make_plan([9, -1, 2], num_kv_heads=4, device="h200", q_len=4)
    assert make_plan([4, 4096], num_kv_heads=4, device="h200", q_len=4).kv_lens.tolist() == [4, 4096]
    assert table.plan([0, 4096], **shape)[0].kv_lens.tolist() == [0, 4096]


def test_fp8_families_fall_back_to_the_fp8_rule_unless_the_table_names_its_own():
    from kvsplit.kernels.policy_table import FALLBACK_POLICY, FP8_FALLBACK

    default = PolicyTable.from_json(PolicyTable.document([], version=1))
    assert default.fallback_for(None) == default.fallback_for("bfloat16") == (FALLBACK_POLICY, {})
    assert default.fallback_for(FP8) == FP8_FALLBACK
    # measured at q_len 1 only: an FP8 verify-step family keeps the table's fallback
    assert default.fallback_for(FP8, 4) == (FALLBACK_POLICY, {})
    _, _, pol = default.plan([900, 40_000], Shape.of(**QWEN, kv_dtype=FP8, q_len=4))
    assert (pol["name"], pol["source"]) == (FALLBACK_POLICY, "fallback")
    doc = PolicyTable.document([], version=1)
    doc["fallback"] = {"name": "balanced", "params": {"ctas_per_sm": 2.0}}
    own = PolicyTable.from_json(doc)
    assert own.fallback_for(FP8) == own.fallback_for(None) == ("balanced", {"ctas_per_sm": 2.0})
    # G = 16 (H_q 32 / H_kv 2): two heads per tile would be 32 rows; the fallback's tile keeps one
    L = [5000, 120, 77_000]
    ask = dict(gpu="NVIDIA H200", num_qo_heads=32, num_kv_heads=2, head_dim=128, dtype="bfloat16", kv_dtype=FP8)
    p, _, pol = default.plan(L, **ask)
    assert pol["name"] == "stream_k" and p.config.heads_per_tile == 1
    assert p == make_plan(
        L,
        policy="stream_k",
        params={**FP8_FALLBACK[1], "heads_per_tile": 1},
        num_kv_heads=2,
        num_qo_heads=32,
        device="h200",
        kv_dtype=FP8,
    )


@settings(max_examples=200, deadline=None)
@given(
    lens=st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=12),
    q_len=st.integers(min_value=1, max_value=8),
)
def test_cover_q_len_raises_only_the_short_requests_and_the_planner_accepts_the_batch(lens, q_len):
    from kvsplit.kernels.limits import check_covers_q_len, cover_q_len

    got = cover_q_len(lens, q_len)
    assert got.dtype == np.int64 and got.shape == (len(lens),)
    for x, y in zip(lens, got.tolist(), strict=True):
        # q_len 1: the lengths as they are (an empty slot stays empty); else a short request holds q_len tokens
        assert y == (x if q_len == 1 or x >= q_len else q_len)
    if q_len > 1:
        check_covers_q_len(got, q_len)  # raises on a kv_len below q_len
        assume(min(lens) < q_len)
        with pytest.raises(ValueError, match="fewer than q_len"):
            check_covers_q_len(np.asarray(lens, dtype=np.int64), q_len)
