"""Shape: one validated value for a batch's shape; its family is the bucket keys' family."""

from __future__ import annotations

import numpy as np
import pytest

from kvsplit.kernels.buckets import bucket_key, key_of
from kvsplit.kernels.device import DeviceSpec
from kvsplit.kernels.plan import make_plan
from kvsplit.kernels.policy_table import PolicyTable
from kvsplit.kernels.shape import Shape, canonical_dtype, shape_family

from .oracle import make_plan as oracle_plan

H200 = DeviceSpec.known("NVIDIA H200")


def test_of_validates_and_resolves():
    s = Shape.of(device="h200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bf16", page_size=16)
    assert s == Shape(H200, 32, 4, 128, "bfloat16", 16)
    assert s.gpu == "NVIDIA H200" and s.group_size == 8
    assert s.family == ("nvidia-h200", 4, 128, "bfloat16", 16, "bfloat16", 1)
    with pytest.raises(AttributeError):
        s.num_kv_heads = 8  # frozen


def test_torch_dtypes_are_read_as_their_names():
    """A ``torch.dtype`` (as FlashInfer's wrappers take q_data_type) means its torch name; one kvsplit does not take
    is refused naming dtype."""
    torch = pytest.importorskip("torch")
    for t, name in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16"), (torch.float32, "float32")):
        assert canonical_dtype(t) == name
        s = Shape.of(device="h200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype=t, page_size=16)
        assert s.dtype == name
        a = make_plan([100, 2000], num_kv_heads=4, device="h200", dtype=t)
        b = make_plan([100, 2000], num_kv_heads=4, device="h200", dtype=name)
        assert a.dtype == name and a.config == b.config and np.array_equal(a.work_kv_end, b.work_kv_end)
    with pytest.raises(ValueError, match=r"^dtype: expected one of .*got torch\.int8$"):
        canonical_dtype(torch.int8)


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"num_qo_heads": 30}, "num_qo_heads: expected a multiple of num_kv_heads (4), got 30"),
        ({"num_kv_heads": 0}, "num_kv_heads: expected an integer in [1, 1024], got 0"),
        ({"head_dim": 96}, "head_dim: expected one of (64, 128, 256), got 96"),
        (
            {"dtype": "int8"},
            "dtype: expected one of ['bfloat16', 'float16', 'float32'] (or an alias: bf16, fp16, f16, "
            "fp32, f32), got 'int8'",
        ),
        ({"page_size": 512}, "page_size: expected an integer in [1, 256], got 512"),
        ({"device": "NVIDIA Z9000"}, "device: unknown GPU 'NVIDIA Z9000'"),
    ],
)
def test_of_names_the_bad_field(kw, msg):
    args = dict(device="NVIDIA H200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)
    args.update(kw)
    with pytest.raises(ValueError) as e:
        Shape.of(**args)
    assert str(e.value).startswith(msg)


def test_dtype_aliases():
    assert [canonical_dtype(d) for d in ("bf16", "fp16", "f16", "fp32", "f32", "float16")] == [
        "bfloat16",
        "float16",
        "float16",
        "float32",
        "float32",
        "float16",
    ]


def test_family_is_the_bucket_keys_family_and_inner_calls_match_the_wrappers():
    s = Shape.of(
        device="NVIDIA H100 80GB HBM3", num_qo_heads=8, num_kv_heads=1, head_dim=64, dtype="float16", page_size=32
    )
    L = np.array([5000, 17, 0, 9000], dtype=np.int64)
    k = bucket_key(L, num_kv_heads=1, head_dim=64, dtype="float16", device=s.device, page_size=32)
    assert k == key_of(L, s.plan_context())
    assert k.family == s.family == shape_family("nvidia-h100-80gb-hbm3", 1, 64, "float16", 32)
    p = make_plan(L, num_kv_heads=1, device=s.device, policy="fa3", head_dim=64, page_size=32, dtype="float16")
    q = oracle_plan(L, policy="fa3", **s.plan_kwargs())
    assert p.to_dict() == q.to_dict()


def test_policy_table_plan_takes_a_shape_or_its_fields():
    s = Shape.of(device="NVIDIA H200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)
    lens = [4096, 17, 9000, 1]
    key = bucket_key(lens, num_kv_heads=4, head_dim=128, dtype="bfloat16", device=H200)
    doc = PolicyTable.document(
        [
            {
                "id": 1,
                "version": 1,
                "bucket": str(key),
                "gpu": "NVIDIA H200",
                "num_kv_heads": 4,
                "head_dim": 128,
                "dtype": "bfloat16",
                "page_size": 16,
                "name": "balanced",
                "params": {"ctas_per_sm": 3.0},
                "backend": "gpu",
            }
        ],
        version=1,
    )
    t = PolicyTable.from_json(doc)
    a = t.plan(lens, s)
    b = t.plan(lens, gpu="h200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bf16", page_size=16)
    assert a[0].to_dict() == b[0].to_dict() and a[1:] == b[1:]
    assert a[1]["matched"] == str(key) and a[2]["params"] == {"ctas_per_sm": 3.0}
    with pytest.raises(ValueError, match=r"^num_qo_heads: expected a multiple of num_kv_heads \(4\), got 6$"):
        t.plan(lens, gpu="h200", num_qo_heads=6, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)


@pytest.mark.parametrize("bad", ["fp8", "float8_e4m3fn"])
def test_an_fp8_dtype_is_refused_with_the_kv_dtype_argument_named(bad):
    with pytest.raises(
        ValueError, match=rf"^dtype: .*got '{bad}' \(dtype is q's; a KV cache of {bad} is given as kv_dtype"
    ):
        canonical_dtype(bad)
    with pytest.raises(ValueError, match=r"^dtype: .* is given as kv_dtype, --kv-dtype on the command line\)$"):
        make_plan([10, 20], num_kv_heads=4, device="h200", dtype=bad)
    with pytest.raises(ValueError, match=r"^dtype: .*got 'int8'$"):  # no hint where the name is not a KV dtype
        canonical_dtype("int8")
