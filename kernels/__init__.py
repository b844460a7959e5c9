"""kvsplit.kernels: the Triton GQA decode kernel, its fp32 reference and the host planner.

One import line for an engine::

    from kvsplit.kernels import DecodeWrapper, PolicyTable, load_shipped_table, make_plan, Plan

The planner's names (:func:`make_plan`, :class:`Plan`, :class:`PolicyTable`, :func:`load_shipped_table`,
:func:`resolve`, :class:`RuleSpec`, :func:`bucket_key`, :class:`DeviceSpec`, :class:`Shape`) need only NumPy;
the kernel's (:class:`DecodeWrapper`, :func:`decode_attention`, :func:`reference_decode_attention`) need torch
and Triton. Every name loads on first use (module ``__getattr__``), so importing this package imports neither.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "make_plan": "policies",
    "Plan": "workplan",
    "KernelConfig": "limits",
    "default_config": "limits",
    "PolicyTable": "policy_table",
    "load_shipped_table": "policy_table",
    "RuleSpec": "rulespec",
    "resolve": "rulespec",
    "POLICIES": "rulespec",
    "TUNED_PARAM_SPACE": "rulespec",
    "bucket_key": "buckets",
    "BucketKey": "buckets",
    "distance": "buckets",
    "DeviceSpec": "device",
    "Shape": "shape",
    "DecodeWrapper": "wrapper",
    "decode_attention": "decode",
    "reference_decode_attention": "decode",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES))
