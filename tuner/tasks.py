"""Tuning tasks: a bucket's key, shape and training / held-out batches (docs/concepts/design.md §5, §6).

:func:`family_task` (a synthetic family batch), :func:`trace_tasks` (the
buckets of a shipped trace) and :func:`default_library` build
:class:`TuneTask` values; :mod:`kvsplit.tuner.search` tunes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from ..kernels.buckets import BucketKey, key_of
from ..kernels.limits import check_kv_lens, cover_q_len
from ..kernels.shape import Shape
from .backends import TimingBackend, make_backend
from .workloads import FAMILIES, TRACES, family_batches, family_kv_lens, trace_batches

DEFAULT_TRAIN = 8
DEFAULT_HELDOUT = 8


@dataclass(frozen=True)
class TuneTask:
    """One bucket to tune: its key and shape, and its training / held-out batches.

    ``train`` and ``heldout`` are lists of kv_lens lists (plain ints, never the
    same batch in both). ``kv_dtype`` (None: ``dtype``) and ``q_len`` are part of the shape and of the key's
    family (``.kvfp8``, ``.q4``).
    """

    key: str
    gpu: str
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    page_size: int
    source: str
    train: tuple[tuple[int, ...], ...]
    heldout: tuple[tuple[int, ...], ...]
    signature: Mapping[str, Any] = field(default_factory=dict)
    kv_dtype: str | None = None
    q_len: int = 1

    @cached_property
    def shape(self) -> Shape:
        """The task's :class:`~kvsplit.kernels.shape.Shape` (validated once, then cached)."""
        return _shape(
            self.gpu,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.dtype,
            self.page_size,
            self.kv_dtype,
            self.q_len,
        )

    @property
    def plan_kwargs(self) -> dict[str, Any]:
        """Keywords of :func:`~kvsplit.kernels.plan.make_plan` for this task's shape (with ``num_qo_heads``,
        the GQA group a q_len > 1 tile's rows need)."""
        return {
            "num_kv_heads": self.num_kv_heads,
            "device": self.gpu,
            "head_dim": self.head_dim,
            "page_size": self.page_size,
            "dtype": self.dtype,
            "kv_dtype": self.kv_dtype,
            "q_len": self.q_len,
            "num_qo_heads": self.num_qo_heads,
        }

    @property
    def max_tokens(self) -> int:
        """The largest ``sum(kv_len)`` over the training and held-out batches, in tokens (sizes a GPU timer's cache)."""
        return max(sum(b) for b in self.train + self.heldout)

    @property
    def max_batch(self) -> int:
        """The largest batch size B over the training and held-out batches."""
        return max(len(b) for b in self.train + self.heldout)


def _shape(
    gpu: str,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
    page_size: int,
    kv_dtype: str | None = None,
    q_len: int = 1,
) -> Shape:
    return Shape.of(
        device=gpu,
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        page_size=page_size,
        kv_dtype=kv_dtype,
        q_len=q_len,
    )


def _key_of(kv_lens: Sequence[int], shape: Shape) -> BucketKey:
    return key_of(check_kv_lens(kv_lens), shape.plan_context())


def shape_fields(shape: Shape) -> dict[str, Any]:
    return dict(
        gpu=shape.gpu,
        num_qo_heads=shape.num_qo_heads,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        dtype=shape.dtype,
        page_size=shape.page_size,
        kv_dtype=None if shape.kv_dtype == shape.dtype else shape.kv_dtype,
        q_len=shape.q_len,
    )


def key_signature(k) -> dict[str, Any]:
    return {"batch_class": k.batch_class, "tokens_class": k.tokens_class, "hist": [list(p) for p in k.hist]}


def at_least_q_len(batches: Sequence[Sequence[int]], q_len: int) -> list[tuple[int, ...]]:
    """``batches`` (kv_lens lists) as tuples of int, each through :func:`kvsplit.kernels.limits.cover_q_len`: a
    request of a trace or family draw shorter than ``q_len`` (a short prompt at its first step) holds ``q_len``
    tokens when it runs a verify step. Batches at least ``q_len`` long everywhere (every batch at q_len 1) keep
    their lengths."""
    return [tuple(int(x) for x in cover_q_len(b, q_len)) for b in batches]


def family_task(
    family: str,
    batch_size: int,
    total_tokens: int,
    *,
    gpu: str,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
    page_size: int,
    num_train: int = DEFAULT_TRAIN,
    num_heldout: int = DEFAULT_HELDOUT,
    seed: int = 0,
    kv_dtype: str | None = None,
    q_len: int = 1,
) -> TuneTask:
    """The bucket of a synthetic family batch, with jittered training and held-out draws.

    The key is that of the family's nominal batch (:func:`family_kv_lens`);
    training and held-out batches are independent draws around it
    (:func:`family_batches`, docs/concepts/design.md §6).
    """
    shape = _shape(gpu, num_qo_heads, num_kv_heads, head_dim, dtype, page_size, kv_dtype, q_len)
    nominal = family_kv_lens(family, batch_size, total_tokens)
    k = _key_of(nominal, shape)
    tr = at_least_q_len(
        family_batches(family, batch_size, total_tokens, num_batches=num_train, seed=seed, role="train"), q_len
    )
    ho = at_least_q_len(
        family_batches(family, batch_size, total_tokens, num_batches=num_heldout, seed=seed, role="heldout"), q_len
    )
    return TuneTask(
        key=str(k),
        **shape_fields(shape),
        source=f"family:{family}:B{batch_size}:T{total_tokens}",
        train=tuple(tuple(int(x) for x in b) for b in tr),
        heldout=tuple(tuple(int(x) for x in b) for b in ho),
        signature=key_signature(k),
    )


def trace_tasks(
    trace: str,
    *,
    gpu: str,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
    page_size: int,
    batch_sizes: Sequence[int] = (16, 64, 256),
    num_train: int = DEFAULT_TRAIN,
    num_heldout: int = DEFAULT_HELDOUT,
    seed: int = 0,
    rate_scale: float | None = None,
    token_budget: int | None = None,
    max_batch_size: int | None = None,
    max_kv_len: int | None = None,
    max_buckets: int | None = None,
    kv_dtype: str | None = None,
    q_len: int = 1,
) -> list[TuneTask]:
    """The buckets of a trace: one per batch size, around the batches' medoid key.

    For each ``B`` in ``batch_sizes``, a pool of 3x the wanted training and
    held-out batches is drawn (:func:`kvsplit.tuner.workloads.trace_batches`:
    continuous-batching replay for timed traces, i.i.d. for length-only ones).
    Real batches rarely share an exact key, so the bucket is the pool's medoid
    key (least total :func:`kvsplit.kernels.buckets.distance` to the others)
    and its training / held-out batches are the pool's batches within
    :data:`~kvsplit.kernels.buckets.DISTANCE_LIMIT` of it, nearest first (the
    batches a server would serve with this bucket's policy). A batch size
    whose medoid is already a bucket is merged into it; a bucket without a
    held-out batch is skipped. ``max_buckets`` keeps the buckets with the
    most batches.
    """
    from ..kernels.buckets import DISTANCE_LIMIT, distance

    if trace not in TRACES:
        raise ValueError(f"trace: unknown trace {trace!r}; known: {sorted(TRACES)}")
    shape = _shape(gpu, num_qo_heads, num_kv_heads, head_dim, dtype, page_size, kv_dtype, q_len)
    found: dict[str, dict[str, Any]] = {}
    for B in batch_sizes:
        tr, ho = trace_batches(
            trace,
            int(B),
            num_train=3 * num_train,
            num_heldout=3 * num_heldout,
            seed=seed,
            rate_scale=rate_scale,
            token_budget=token_budget,
            max_batch_size=max_batch_size,
            max_kv_len=max_kv_len,
        )
        tr, ho = at_least_q_len(tr, q_len), at_least_q_len(ho, q_len)
        kt = [_key_of(b, shape) for b in tr]
        kh = [_key_of(b, shape) for b in ho]
        keys = kt + kh
        D = np.array([[distance(a, b) for b in keys] for a in keys])
        medoid = keys[int(np.argmin(D.sum(axis=1)))]
        ent = found.setdefault(str(medoid), {"train": [], "heldout": [], "sig": key_signature(medoid), "B": []})
        ent["B"].append(int(B))
        for pool, ks, role in ((tr, kt, "train"), (ho, kh, "heldout")):
            near = sorted((distance(k, medoid), i) for i, k in enumerate(ks))
            ent[role] += [pool[i] for d, i in near if d <= DISTANCE_LIMIT]  # tuples of int (at_least_q_len)
    tasks = []
    for key, ent in found.items():
        if not ent["train"] or not ent["heldout"]:
            continue
        tasks.append(
            TuneTask(
                key=key,
                **shape_fields(shape),
                source=f"trace:{trace}:B{'/'.join(map(str, ent['B']))}",
                train=tuple(ent["train"][:num_train]),
                heldout=tuple(ent["heldout"][:num_heldout]),
                signature=ent["sig"],
            )
        )
    tasks.sort(key=lambda t: -(len(t.train) + len(t.heldout)))
    if max_buckets is not None:
        tasks = tasks[: int(max_buckets)]
    return tasks


LIBRARY_BATCH_SIZES = (16, 64, 256, 1024)
LIBRARY_TOTALS = (262_144, 1_048_576)
LIBRARY_TRACES = ("azure_code", "azure_conv", "mooncake", "sharegpt", "arxiv")


def default_library(
    *,
    gpu: str,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
    page_size: int,
    num_train: int = DEFAULT_TRAIN,
    num_heldout: int = DEFAULT_HELDOUT,
    seed: int = 0,
    kv_dtype: str | None = None,
    q_len: int = 1,
) -> list[TuneTask]:
    """The default bucket library of ``--all`` for one shape.

    Every family of :data:`FAMILIES` at B in (16, 64, 256, 1024) and T in
    (262,144, 1,048,576), plus the buckets of every shipped trace at B in
    (16, 64, 256); duplicate keys are tuned once (the first source wins).
    """
    shape = dict(
        gpu=gpu,
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        page_size=page_size,
        num_train=num_train,
        num_heldout=num_heldout,
        seed=seed,
        kv_dtype=kv_dtype,
        q_len=q_len,
    )
    tasks: dict[str, TuneTask] = {}
    for T in LIBRARY_TOTALS:
        for fam in FAMILIES:
            for B in LIBRARY_BATCH_SIZES:
                t = family_task(fam, B, T, **shape)
                tasks.setdefault(t.key, t)
    for tr in LIBRARY_TRACES:
        for t in trace_tasks(tr, **shape):
            tasks.setdefault(t.key, t)
    return list(tasks.values())


def backend_for_task(
    task: TuneTask,
    backend: str,
    *,
    calibration: Mapping[str, Any] | None = None,
    read_bandwidth_gbps: float | None = None,
    gpu_index: int = 0,
) -> TimingBackend:
    """The timing backend (``"sim"`` or ``"gpu"``) for ``task``'s shape, sized for its largest batch."""
    return make_backend(
        backend,
        shape=task.shape,
        max_tokens=task.max_tokens,
        max_batch=task.max_batch,
        calibration=calibration,
        read_bandwidth_gbps=read_bandwidth_gbps,
        gpu_index=gpu_index,
    )
