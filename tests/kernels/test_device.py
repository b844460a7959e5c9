"""kvsplit.kernels.device: the table, aliases, variants, unknown GPUs."""

from __future__ import annotations

import dataclasses

import pytest

from kvsplit.kernels.device import DeviceSpec, device_aliases, known_devices, resolve_device
from kvsplit.kernels.plan import make_plan

REPORTED_NAMES = [
    "NVIDIA H200",
    "NVIDIA H100 80GB HBM3",
    "NVIDIA H100 PCIe",
    "NVIDIA H20",
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA A100-SXM4-40GB",
    "NVIDIA L40S",
    "NVIDIA B200",
]


@pytest.mark.parametrize("name", REPORTED_NAMES)
def test_known_reported_names(name):
    spec = DeviceSpec.known(name)
    assert spec.name == name and spec.num_sms >= 1 and spec.hbm_bandwidth_gbps > 0
    assert resolve_device(name) is spec
    assert DeviceSpec.from_dict(spec.to_dict()) == spec


def test_vendor_figures():
    h200 = DeviceSpec.known("NVIDIA H200")
    assert (h200.num_sms, h200.hbm_bandwidth_gbps, h200.compute_capability) == (132, 4800.0, (9, 0))
    assert DeviceSpec.known("NVIDIA A100-SXM4-80GB").num_sms == 108
    assert DeviceSpec.known("NVIDIA H100 80GB HBM3").hbm_bandwidth_gbps == 3350.0


def test_aliases():
    for alias, target in device_aliases().items():
        assert DeviceSpec.known(alias).name == target
    for s in ("h200", "H200", "nvidia-h200", "NVIDIA_H200", "  nvidia   h200 "):
        assert DeviceSpec.known(s).name == "NVIDIA H200"
    assert len({d.name for d in known_devices()}) == len(known_devices())


def test_unknown_name_is_a_clear_error_unless_numbers_given():
    with pytest.raises(ValueError, match="unknown GPU 'NVIDIA X1'.*known: .*NVIDIA H200"):
        DeviceSpec.known("NVIDIA X1")
    with pytest.raises(ValueError, match="missing"):
        resolve_device({"name": "NVIDIA X1", "num_sms": 10})
    x1 = resolve_device(
        {
            "name": "NVIDIA X1",
            "num_sms": 10,
            "hbm_bandwidth_gbps": 500.0,
            "l2_bytes": 1 << 20,
            "smem_per_sm_bytes": 100_000,
            "smem_per_block_bytes": 99_000,
        }
    )
    assert x1.num_sms == 10
    make_plan([1000, 20], num_kv_heads=2, device=x1)
    # a known name with some numbers: the table entry with those replaced
    v = resolve_device({"name": "NVIDIA H200", "num_sms": 66})
    assert v.num_sms == 66 and v.hbm_bandwidth_gbps == 4800.0


def test_replace_gives_a_valid_variant():
    v = dataclasses.replace(DeviceSpec.known("H200"), num_sms=4)
    assert v.num_sms == 4
    p = make_plan([100_000], num_kv_heads=4, device=v, policy="balanced")
    # default tile (128, 4, 2): 3 CTAs/SM -> target min(4 * 4, 3 * 4) = 12 tiles;
    # fair = cdiv(4 * 100000, 12) = 33334 -> chunk 33408 (block_n 128) -> cdiv(100000, 33408) = 3
    assert p.num_splits.tolist() == [3]


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_sms", 0),
        ("num_sms", 1.5),
        ("hbm_bandwidth_gbps", 0.0),
        ("hbm_bandwidth_gbps", float("nan")),
        ("l2_bytes", -1),
        ("smem_per_block_bytes", 10**9),
        ("compute_capability", (9,)),
        ("name", ""),
    ],
)
def test_invalid_fields_are_named(field, value):
    with pytest.raises(ValueError, match=f"DeviceSpec.{field}"):
        dataclasses.replace(DeviceSpec.known("H200"), **{field: value})
