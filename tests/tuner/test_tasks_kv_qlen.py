"""Tuning tasks and campaign configs of an FP8-cache or q_len > 1 family: their keys, plans and
identity."""

from __future__ import annotations

from kvsplit.kernels.buckets import BucketKey
from kvsplit.kernels.plan import make_plan
from kvsplit.tuner.campaign import CampaignConfig, campaign_name, campaign_tasks
from kvsplit.tuner.tasks import family_task

SHAPE = dict(gpu="NVIDIA H200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)
FP8 = "float8_e4m3fn"


def test_family_task_keys_and_plans_carry_the_family():
    base = family_task("skewed80", 64, 262_144, **SHAPE, num_train=1, num_heldout=1)
    t = family_task("skewed80", 64, 262_144, **SHAPE, num_train=1, num_heldout=1, kv_dtype="fp8", q_len=4)
    assert (t.kv_dtype, t.q_len) == (FP8, 4) and t.shape.family[5:] == (FP8, 4)
    assert t.key == base.key.replace(".p16.", ".p16.kvfp8.q4.") and BucketKey.parse(t.key).q_len == 4
    assert t.train == base.train  # the same batches: only the family differs
    lens = list(t.train[0])
    want = make_plan(lens, num_kv_heads=4, device="NVIDIA H200", kv_dtype=FP8, q_len=4, num_qo_heads=32)
    assert make_plan(lens, **t.plan_kwargs) == want


def test_campaign_identity_keeps_the_default_and_separates_families(tmp_path):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    kw = dict(database_url=url, batch_sizes=(64,), totals=(262_144,), traces=())
    plain = CampaignConfig(**kw)
    assert "kv_dtype" not in plain.identity() and "q_len" not in plain.identity()
    assert campaign_name(CampaignConfig(**kw, kv_dtype="bfloat16")) == campaign_name(plain)
    fp8 = CampaignConfig(**kw, kv_dtype=FP8)
    q2 = CampaignConfig(**kw, q_len=2)
    assert len({campaign_name(plain), campaign_name(fp8), campaign_name(q2)}) == 3
    keys = [t.key for t in campaign_tasks(q2)]
    assert keys and all(".q2.b" in k for k in keys)
    assert [k.replace(".q2.", ".") for k in keys] == [t.key for t in campaign_tasks(plain)]


def test_trace_requests_shorter_than_q_len_hold_q_len_tokens_at_a_verify_step():
    # arXiv at B = 512 draws a request of 7 tokens into a held-out batch (the batch that stopped a q_len-8 GPU
    # campaign in its verify step): at q_len 8 it holds 8, every other kv_len is the draw's own
    from kvsplit.tuner.tasks import trace_tasks
    from kvsplit.tuner.workloads import trace_batches

    kw = dict(batch_sizes=(512,), num_train=2, num_heldout=1)
    raw_tr, raw_ho = trace_batches("arxiv", 512, num_train=6, num_heldout=3)
    raw = [tuple(int(x) for x in b) for b in raw_tr + raw_ho]
    assert min(min(b) for b in raw) < 8  # the draw this test is about
    one = trace_tasks("arxiv", **SHAPE, **kw)
    eight = trace_tasks("arxiv", **SHAPE, **kw, q_len=8)
    for t1, t8 in zip(one, eight, strict=True):
        for b1, b8 in zip(t1.train + t1.heldout, t8.train + t8.heldout, strict=True):
            assert b1 in raw  # q_len 1: the trace's own batches
            assert b8 == tuple(max(x, 8) for x in b1)
    assert all(min(b) >= 8 for t in eight for b in t.train + t.heldout)
