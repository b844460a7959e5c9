"""The shape of a decode batch, validated once: :class:`Shape`.

A shape is what a batch's plan, bucket key, tuning task and HTTP request share
besides the lengths: the GPU (a :class:`~kvsplit.kernels.device.DeviceSpec`),
H_q, H_kv, head_dim, dtype, page_size, the KV cache dtype and q_len (query tokens
per request: 1 for plain decode, k + 1 for a speculative-decoding verify step of k
draft tokens). :meth:`Shape.of` checks every field once (H_q a multiple of H_kv,
head_dim in 64/128/256, page_size 1..256, dtype one of torch's names or an
accepted alias, kv_dtype None/dtype or ``"float8_e4m3fn"`` with a 16-bit dtype,
q_len 1..8 with ``G * q_len <= 64`` query rows) and resolves the GPU; code that
receives a ``Shape`` uses its fields as they are. :attr:`Shape.family` is the
part of a bucket key that must match exactly (docs/concepts/design.md §5): a batch of another
KV dtype or q_len is another family, never served a policy tuned for this one.

dtype aliases: ``"bf16"``, ``"fp16"``/``"f16"``, ``"fp32"``/``"f32"`` (the
short names of bucket keys) mean ``"bfloat16"``, ``"float16"``, ``"float32"``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .device import DeviceSpec, resolve_device
from .limits import (
    DTYPE_ALIASES,
    DTYPES,
    HEAD_DIMS,
    MAX_PAGE_SIZE,
    check_int,
    check_kv_dtype,
    check_q_len,
    kv_dtype_hint,
    torch_dtype_name,
)
from .rulespec import PlanContext

__all__ = ["Shape", "canonical_dtype", "DTYPE_ALIASES", "MAX_HEADS", "MAX_QO_HEADS", "shape_family", "gpu_slug"]

MAX_HEADS = 1024
"""Largest H_kv accepted."""
MAX_QO_HEADS = MAX_HEADS * 64
"""Largest H_q accepted (GQA groups up to 64 per KV head)."""


def canonical_dtype(dtype: Any) -> str:
    """torch's name of ``dtype``, a name, an alias (``"bf16"`` -> ``"bfloat16"``) or a ``torch.dtype``
    (``torch.bfloat16`` -> ``"bfloat16"``, read from its text so that the planner needs no torch); ValueError naming
    ``dtype`` otherwise."""
    name = torch_dtype_name(dtype)
    if isinstance(name, str):
        d = DTYPE_ALIASES.get(name, name)
        if d in DTYPES:
            return d
    raise ValueError(
        f"dtype: expected one of {sorted(DTYPES)} (or an alias: {', '.join(DTYPE_ALIASES)}), got {dtype!r}"
        f"{kv_dtype_hint(dtype)}"
    )


def gpu_slug(name: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"nvidia-h100-80gb-hbm3"``."""
    slug = re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-")
    if not slug:
        raise ValueError(f"device: cannot make a bucket name from GPU name {name!r}")
    return slug


def shape_family(
    gpu: str,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
    page_size: int,
    kv_dtype: str | None = None,
    q_len: int = 1,
) -> tuple[str, int, int, str, int, str, int]:
    """The family ``(gpu slug, H_kv, head_dim, dtype, page_size, kv_dtype, q_len)`` of bucket keys: the one
    definition.

    ``gpu`` may be a GPU name or already its slug; ``kv_dtype`` None means ``dtype`` (the family holds the KV
    dtype itself, so None and ``dtype`` are one family). Bucket keys, policy-table entries and
    :attr:`Shape.family` all use it; keys match only within a family.
    """
    return (
        gpu_slug(gpu),
        int(num_kv_heads),
        int(head_dim),
        dtype,
        int(page_size),
        dtype if kv_dtype is None else kv_dtype,
        int(q_len),
    )


@dataclass(frozen=True)
class Shape:
    """A batch's shape without its lengths (frozen; build it with :meth:`of`, which validates).

    Attributes
    ----------
    device : DeviceSpec
        The GPU.
    num_qo_heads, num_kv_heads : int
        H_q and H_kv, H_q a multiple of H_kv; H_kv in 1..1024, H_q up to 65,536.
    head_dim : int
        64, 128 or 256.
    dtype : str
        ``"float16"``, ``"bfloat16"`` or ``"float32"``.
    page_size : int
        Tokens per KV page, 1..256.
    kv_dtype : str
        The KV cache's dtype: ``dtype`` itself, or ``"float8_e4m3fn"`` (1 byte per element) with a 16-bit
        ``dtype``. :meth:`of` turns None into ``dtype``.
    q_len : int
        Query tokens per request, 1..8 (the same for every request of a batch); a work tile holds
        ``heads_per_tile * G * q_len`` query rows, at most 64.
    """

    device: DeviceSpec
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    page_size: int = 16
    kv_dtype: str | None = None
    q_len: int = 1

    def __post_init__(self) -> None:
        if self.kv_dtype is None:  # the direct constructor's default: the same as dtype
            object.__setattr__(self, "kv_dtype", self.dtype)

    @classmethod
    def of(
        cls,
        *,
        device: DeviceSpec | str | Mapping[str, Any],
        num_qo_heads: Any,
        num_kv_heads: Any,
        head_dim: Any = 128,
        dtype: Any = "bfloat16",
        page_size: Any = 16,
        kv_dtype: Any = None,
        q_len: Any = 1,
    ) -> Shape:
        """Validate every field (ValueError naming the first bad one) and resolve the GPU.

        ``device`` is what :func:`~kvsplit.kernels.device.resolve_device` takes
        (a spec, a name or alias, or a mapping of numbers).
        """
        hkv = check_int("num_kv_heads", num_kv_heads, 1, MAX_HEADS)
        hq = check_int("num_qo_heads", num_qo_heads, 1, MAX_QO_HEADS)
        if hq % hkv:
            raise ValueError(f"num_qo_heads: expected a multiple of num_kv_heads ({hkv}), got {hq}")
        if isinstance(head_dim, bool) or head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim: expected one of {HEAD_DIMS}, got {head_dim!r}")
        dt = canonical_dtype(dtype)
        ps = check_int("page_size", page_size, 1, MAX_PAGE_SIZE)
        kd = check_kv_dtype(kv_dtype, dt)
        ql = check_q_len(q_len, hq // hkv)
        return cls(resolve_device(device), hq, hkv, int(head_dim), dt, ps, kd, ql)

    @property
    def gpu(self) -> str:
        """The GPU's reported name."""
        return self.device.name

    @property
    def group_size(self) -> int:
        """Query heads per KV head, H_q / H_kv."""
        return self.num_qo_heads // self.num_kv_heads

    @property
    def family(self) -> tuple[str, int, int, str, int, str, int]:
        """``(gpu slug, H_kv, head_dim, dtype, page_size, kv_dtype, q_len)``: equal to the ``family`` of this
        shape's bucket keys."""
        return shape_family(
            self.device.name, self.num_kv_heads, self.head_dim, self.dtype, self.page_size, self.kv_dtype, self.q_len
        )

    def plan_context(self) -> PlanContext:
        """What the planner's inner functions take (no re-validation)."""
        return PlanContext(
            self.device,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            self.dtype,
            self.kv_dtype,
            self.q_len,
            self.group_size,
        )

    def plan_kwargs(self) -> dict[str, Any]:
        """Keywords of :func:`~kvsplit.kernels.plan.make_plan` and ``bucket_key`` for this shape."""
        return {
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "dtype": self.dtype,
            "page_size": self.page_size,
            "device": self.device,
            "kv_dtype": self.kv_dtype,
            "q_len": self.q_len,
        }
