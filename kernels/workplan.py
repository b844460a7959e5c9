"""The :class:`Plan` value: one decode batch's work list (made by :func:`kvsplit.kernels.plan.make_plan`).

Terms: a *work item* is one contiguous KV range ``[kv_start, kv_end)`` of one
request; a *work tile* is (CTA, kv_head); a CTA processes the work items
``cta_indptr[c]:cta_indptr[c+1]`` one after the other for one KV head.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .limits import DTYPES, MAX_KV_LEN, KernelConfig, check_config

# ----------------------------------------------------------------------------
# The Plan
# ----------------------------------------------------------------------------


def _ro(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


# a Plan's arrays and their dtypes (checked and made read-only on construction)
_ARRAY_FIELDS = (
    ("kv_lens", np.int64),
    ("num_splits", np.int32),
    ("work_request", np.int32),
    ("work_kv_start", np.int64),
    ("work_kv_end", np.int64),
    ("cta_indptr", np.int32),
)


def made_for(p: Any) -> dict[str, Any]:
    """The ``made_for`` object of a plan's JSON form from ``p``'s ``num_kv_heads``, ``head_dim``, ``page_size``,
    ``dtype``, ``gpu``, ``kv_dtype`` and ``q_len`` attributes (a :class:`Plan`, or a resolved spec's fields as a
    namespace): ``kv_dtype`` and ``q_len`` only where not the defaults (a cache of ``dtype``, one query token), so a
    16-bit decode plan's form is as it was. The one writer of the object (``Plan.to_dict``, the plan service)."""
    d = {
        "num_kv_heads": p.num_kv_heads,
        "head_dim": p.head_dim,
        "page_size": p.page_size,
        "dtype": p.dtype,
        "gpu": p.gpu,
    }
    if p.kv_dtype is not None and p.kv_dtype != p.dtype:
        d["kv_dtype"] = p.kv_dtype
    if p.q_len != 1:
        d["q_len"] = p.q_len
    return d


@dataclass(frozen=True, eq=False)
class Plan:
    """One decode batch's split-KV plan (immutable).

    Attributes
    ----------
    kv_lens : np.ndarray, int64 ``[B]``
        Tokens in each request's KV cache.
    num_splits : np.ndarray, int32 ``[B]``
        Work items of each request (>= 1).
    work_request : np.ndarray, int32 ``[W]``
        Request of each work item, in launch order; ``W == num_splits.sum()``.
    work_kv_start, work_kv_end : np.ndarray, int64 ``[W]``
        Token range ``[start, end)`` of each work item (half-open).
    cta_indptr : np.ndarray, int32 ``[C + 1]``
        CTA ``c`` processes work items ``cta_indptr[c]:cta_indptr[c+1]``
        (packing of short items; ``arange(W + 1)`` when nothing is packed).
    config : KernelConfig
        Kernel knobs.
    policy : str
        Policy name that made the plan; ``params`` its parameters (JSON-able).
    num_kv_heads, head_dim, page_size, dtype, gpu, kv_dtype, q_len
        What the plan was made for (``made_for`` in the dict form, :func:`made_for`): ``kv_dtype`` None for a
        cache of ``dtype``, else ``"float8_e4m3fn"``; ``q_len`` query tokens per request (1: decode).

    Invariants (checked on construction): ``num_splits >= 1``; the items of a
    request with kv_len > 0 tile ``[0, kv_len)`` exactly once, in order, none
    empty, and are consecutive in the work list; a request with kv_len == 0 has
    one item ``[0, 0)``.
    """

    kv_lens: np.ndarray
    num_splits: np.ndarray
    work_request: np.ndarray
    work_kv_start: np.ndarray
    work_kv_end: np.ndarray
    cta_indptr: np.ndarray
    config: KernelConfig
    policy: str
    params: Mapping[str, Any]
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: str
    gpu: str
    kv_dtype: str | None = None
    q_len: int = 1
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, dt in _ARRAY_FIELDS:
            arr = np.asarray(getattr(self, name))
            if arr.ndim != 1:
                raise ValueError(f"Plan.{name}: expected a 1-D array, got shape {arr.shape}")
            object.__setattr__(self, name, _ro(arr.astype(dt, copy=False)))
        object.__setattr__(self, "params", dict(self.params))
        check_plan_invariants(self)

    @classmethod
    def from_trusted(cls, **fields: Any) -> Plan:
        """Build a Plan from arrays already known to satisfy the invariants
        (make_plan's own output); skips the validation of ``__init__``."""
        self = object.__new__(cls)
        for name, dt in _ARRAY_FIELDS:
            arr = np.asarray(fields.pop(name))
            if arr.dtype != dt:
                arr = arr.astype(dt)
            object.__setattr__(self, name, _ro(arr))
        fields["params"] = dict(fields["params"])
        for name, value in fields.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_cache", {})
        return self

    # -- sizes ---------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """Requests in the batch, ``B = len(kv_lens)``."""
        return int(self.kv_lens.shape[0])

    @property
    def num_work_items(self) -> int:
        """Work items over all requests, ``W = num_splits.sum() = len(work_request)``; each runs once per tile of KV heads."""
        return int(self.work_request.shape[0])

    @property
    def num_ctas(self) -> int:
        """CTAs per KV head (the grid launch has ``num_ctas * num_kv_heads`` programs)."""
        return int(self.cta_indptr.shape[0] - 1)

    @property
    def num_work_tiles(self) -> int:
        """Work tiles of the stage-1 launch: ``num_ctas * num_kv_heads / config.heads_per_tile``."""
        return self.num_ctas * (self.num_kv_heads // self.config.heads_per_tile)

    # -- derived arrays used by the kernel -----------------------------------
    def merge_layout(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Slots of partial outputs for split requests.

        Returns
        -------
        work_slot : int32 ``[W]``
            Partial-output slot of each item, -1 for items of single-split
            requests (they write the final output directly).
        merge_request : int32 ``[M]``
            Requests with more than one split.
        merge_slot_start : int32 ``[M]``
            First slot of each merged request (its slots are consecutive).
        merge_num : int32 ``[M]``
            Number of partials of each merged request.
        """
        cached = self._cache.get("merge_layout")
        if cached is not None:
            return cached
        if self.num_splits.max(initial=1) <= 1:  # no request is split (the usual large batch): nothing to merge
            none = _ro(np.zeros(0, dtype=np.int32))
            out = (_ro(np.full(self.num_work_items, -1, dtype=np.int32)), none, none, none)
            self._cache["merge_layout"] = out
            return out
        wr = self.work_request
        split_item = self.num_splits[wr] > 1
        work_slot = np.cumsum(split_item, dtype=np.int32)
        work_slot -= 1
        work_slot[~split_item] = -1
        # items of a request are consecutive: the first item of each split request
        first = split_item.copy()
        first[1:] &= wr[1:] != wr[:-1]
        merge_request = wr[first]
        merge_slot_start = work_slot[first]
        merge_num = self.num_splits[merge_request]
        out = (_ro(work_slot), _ro(merge_request), _ro(merge_slot_start), _ro(merge_num))
        self._cache["merge_layout"] = out
        return out

    def launch_sizes(self) -> dict[str, int]:
        """The sizes :func:`kvsplit.kernels.decode.launch_decode` takes from a host plan, as its keywords:
        ``num_tiles`` (:attr:`num_work_tiles`), ``num_merge`` (requests with more than one split) and
        ``max_splits`` (the most splits of any request). Computed once and cached on the plan."""
        cached = self._cache.get("launch_sizes")
        if cached is None:
            cached = self._cache["launch_sizes"] = {
                "num_tiles": self.num_work_tiles,
                "num_merge": int(self.merge_layout()[1].shape[0]),
                "max_splits": int(self.num_splits.max()),
            }
        return dict(cached)

    @property
    def num_partials(self) -> int:
        """Partial-output slots the workspace needs (items of split requests): the last merged request's first
        slot plus its partials (slots are given in work-list order, a request's consecutively)."""
        _, _, start, num = self.merge_layout()
        return int(start[-1] + num[-1]) if start.shape[0] else 0

    # -- device upload (torch) ----------------------------------------------
    def to(self, device: Any) -> dict:
        """Upload the plan's arrays to ``device`` once and cache them on the plan.

        Returns a dict of int32 torch tensors; later calls with the same device
        return the cached tensors (no host-device copy).
        """
        import torch

        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        key = ("device", str(dev))
        arrays = self._cache.get(key)
        if arrays is None:
            work_slot, merge_request, merge_slot_start, merge_num = self.merge_layout()
            host = {
                "num_splits": self.num_splits,
                "work_request": self.work_request,
                "work_kv_start": self.work_kv_start.astype(np.int32),
                "work_kv_end": self.work_kv_end.astype(np.int32),
                "work_slot": work_slot,
                "cta_indptr": self.cta_indptr,
                "merge_request": merge_request,
                "merge_slot_start": merge_slot_start,
                "merge_num": merge_num,
            }
            arrays = {
                k: torch.from_numpy(np.array(v, dtype=np.int32)).to(dev, non_blocking=False) for k, v in host.items()
            }
            self._cache[key] = arrays
        return arrays

    # -- JSON form -----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Canonical JSON form: plain lists and numbers (docs/concepts/design.md §3)."""
        return {
            "kv_lens": self.kv_lens.tolist(),
            "num_splits": self.num_splits.tolist(),
            "work_request": self.work_request.tolist(),
            "work_kv_start": self.work_kv_start.tolist(),
            "work_kv_end": self.work_kv_end.tolist(),
            "cta_indptr": self.cta_indptr.tolist(),
            "config": self.config.to_dict(),
            "policy": self.policy,
            "params": jsonable(self.params),
            "made_for": made_for(self),
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Plan:
        """Inverse of :meth:`to_dict`; validates every invariant.

        Raises
        ------
        ValueError
            On a missing or malformed field, naming it.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"plan: expected an object, got {type(d).__name__}")
        required = (
            "kv_lens",
            "num_splits",
            "work_request",
            "work_kv_start",
            "work_kv_end",
            "cta_indptr",
            "config",
            "policy",
            "params",
            "made_for",
        )
        missing = [k for k in required if k not in d]
        if missing:
            raise ValueError(f"plan: missing fields {missing}")
        cfg = d["config"]
        if not isinstance(cfg, Mapping):
            raise ValueError("plan.config: expected an object")
        unknown = set(cfg) - {f.name for f in dataclasses.fields(KernelConfig)}
        if unknown:
            raise ValueError(f"plan.config: unknown fields {sorted(unknown)}")
        mf = d["made_for"]
        if not isinstance(mf, Mapping):
            raise ValueError("plan.made_for: expected an object")
        arrays = {}
        for k in required[:6]:
            v = d[k]
            if not isinstance(v, (list, tuple, np.ndarray)):
                raise ValueError(f"plan.{k}: expected a list of integers")
            a = np.asarray(v)
            if a.size and a.dtype.kind not in "iu":
                raise ValueError(f"plan.{k}: expected integers, got dtype {a.dtype}")
            arrays[k] = a.astype(np.int64)
        try:
            config = KernelConfig(**cfg)
            check_config(config, int(mf["head_dim"]), str(mf["dtype"]))
            return Plan(
                **arrays,
                config=config,
                policy=str(d["policy"]),
                params=dict(d["params"]),
                num_kv_heads=int(mf["num_kv_heads"]),
                head_dim=int(mf["head_dim"]),
                page_size=int(mf["page_size"]),
                dtype=str(mf["dtype"]),
                gpu=str(mf["gpu"]),
                kv_dtype=None if mf.get("kv_dtype") is None else str(mf["kv_dtype"]),
                q_len=int(mf.get("q_len", 1)),
            )
        except KeyError as exc:
            raise ValueError(f"plan.made_for: missing field {exc}") from None
        except TypeError as exc:
            raise ValueError(f"plan: {exc}") from None

    def work_key(self) -> tuple:
        """What the kernel runs of this plan, as a hashable key: its config and work list (``num_splits``,
        ``work_request``, the token ranges, ``cta_indptr``), not the policy that made it. Two plans of one batch
        and shape with equal keys are the same launch: a timer measures it once."""
        return (
            self.config,
            self.num_splits.tobytes(),
            self.work_request.tobytes(),
            self.work_kv_start.tobytes(),
            self.work_kv_end.tobytes(),
            self.cta_indptr.tobytes(),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]


_SCALARS = (str, int, float, bool, type(None))


def jsonable(v: Any) -> Any:
    """``v`` with NumPy scalars turned into Python ones and tuples into lists (JSON-able)."""
    if type(v) is dict and all(type(x) in _SCALARS for x in v.values()) and all(type(k) is str for k in v):
        return dict(v)  # the usual flat params dict: nothing to convert
    if isinstance(v, Mapping):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


def check_plan_invariants(p: Plan) -> None:
    """Check the invariants every :class:`Plan` keeps: ``kv_lens`` in ``[0, MAX_KV_LEN]``; ``num_splits[b] >= 1``
    consecutive work items per request whose ``[work_kv_start, work_kv_end)`` ranges cover ``[0, kv_len)`` in
    order without gap or overlap; ``heads_per_tile`` a divisor of ``num_kv_heads``; ``cta_indptr`` a strictly
    increasing ``[0 .. W]`` index over the work list; positive shape fields and a known dtype.

    Raises ``ValueError`` naming the first field (``Plan.<field>``) that breaks one; returns ``None`` otherwise.
    """
    B = p.kv_lens.shape[0]
    W = p.work_request.shape[0]
    if B < 1:
        raise ValueError("Plan.kv_lens: expected at least one request")
    if p.num_splits.shape[0] != B:
        raise ValueError(f"Plan.num_splits: expected length {B}, got {p.num_splits.shape[0]}")
    if (p.kv_lens < 0).any() or (p.kv_lens > MAX_KV_LEN).any():
        raise ValueError(f"Plan.kv_lens: expected 0 <= kv_len <= {MAX_KV_LEN}")
    if (p.num_splits < 1).any():
        raise ValueError("Plan.num_splits: every request needs >= 1 split")
    if p.num_kv_heads % p.config.heads_per_tile:
        raise ValueError(
            f"Plan.config.heads_per_tile: expected a divisor of num_kv_heads={p.num_kv_heads}, got "
            f"{p.config.heads_per_tile}"
        )
    if W != int(p.num_splits.sum()):
        raise ValueError(f"Plan.work_request: expected W == sum(num_splits) == {int(p.num_splits.sum())}, got {W}")
    if p.work_kv_start.shape[0] != W or p.work_kv_end.shape[0] != W:
        raise ValueError("Plan.work_kv_start/work_kv_end: expected the length of work_request")
    if W and (p.work_request.min() < 0 or p.work_request.max() >= B):
        raise ValueError("Plan.work_request: request index out of range")
    # items of a request are consecutive and in order
    first = np.ones(W, dtype=bool)
    first[1:] = p.work_request[1:] != p.work_request[:-1]
    if int(first.sum()) != B or np.unique(p.work_request[first]).shape[0] != B:
        raise ValueError("Plan.work_request: the items of each request must be consecutive")
    req = p.work_request
    L = p.kv_lens[req]
    s, e = p.work_kv_start, p.work_kv_end
    last = np.ones(W, dtype=bool)
    last[:-1] = first[1:]
    empty_req = L == 0
    ok = np.where(empty_req, (s == 0) & (e == 0), (s < e) & (e <= L))
    if not ok.all():
        bad = int(np.flatnonzero(~ok)[0])
        raise ValueError(
            f"Plan.work_kv_start/work_kv_end: item {bad} of request {int(req[bad])} is "
            f"[{int(s[bad])}, {int(e[bad])}) for kv_len {int(L[bad])}"
        )
    if not (s[first] == 0).all() or not (e[last] == L[last]).all():
        raise ValueError("Plan.work_kv_start/work_kv_end: a request's items must cover [0, kv_len)")
    cont = s[1:] == e[:-1]
    if not cont[~first[1:]].all():
        raise ValueError("Plan.work_kv_start/work_kv_end: a request's items must be contiguous, in order")
    if (p.num_splits[req[first]] != np.diff(np.append(np.flatnonzero(first), W))).any():
        raise ValueError("Plan.num_splits: does not match the work list")
    ci = p.cta_indptr
    if ci.shape[0] < 2 or ci[0] != 0 or ci[-1] != W or (np.diff(ci) < 1).any():
        raise ValueError("Plan.cta_indptr: expected a strictly increasing [0 .. W] index")
    for name in ("num_kv_heads", "head_dim", "page_size"):
        v = getattr(p, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"Plan.{name}: expected a positive integer, got {v!r}")
    if p.dtype not in DTYPES:
        raise ValueError(f"Plan.dtype: expected one of {sorted(DTYPES)}, got {p.dtype!r}")
    if not isinstance(p.config, KernelConfig):
        raise ValueError("Plan.config: expected a KernelConfig")
