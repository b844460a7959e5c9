"""Engine hot path: :class:`DecodeWrapper`, shaped like FlashInfer's
``BatchDecodeWithPagedKVCacheWrapper`` (docs/concepts/design.md §3 "Engine hot path").

``plan()`` once per decode step, ``run()`` per layer::

    w = DecodeWrapper(32, 4, 128, page_size=16, dtype="bfloat16", device="cuda", max_batch_size=256)
    for step in ...:
        w.plan(kv_indptr, kv_indices, kv_lens)          # int32 device tensors
        for layer in layers:
            o = w.run(q, k_cache[layer], v_cache[layer])

Two modes:

- **eager** (``use_cuda_graph=False``): ``plan()`` validates its inputs once
  from host copies of kv_indptr and kv_lens (the engine's, ``kv_indptr_host`` /
  ``kv_lens_host``, as FlashInfer's plan takes indptr on the host; else one copy
  back from the device), makes the host plan (the table's policy for the
  batch's bucket, or ``policy``/``params``), uploads its launch arrays with one
  asynchronous copy from a pinned host buffer (two, used in turn) into one device
  buffer (regions at fixed 16-byte-aligned offsets: one Triton specialization of
  the kernels' pointer arguments for every plan, views made once per layout),
  and checks the page ids the step uses: from the engine's host copy
  (``kv_indices_host``; then the step never waits for the device), else by
  reading back their min and max (two numbers: the one wait of the step);
  ``run()`` checks shapes against what was planned (no device read).
- **CUDA graph** (``use_cuda_graph=True``): buffers are preallocated for
  ``max_batch_size`` requests and ``max_work_items`` work items; stage 1 runs
  the persistent schedule with ``num_programs`` fixed for the wrapper, its tile
  count read on the device, idle programs exit; the merge grid is
  ``max_batch_size`` x H_q programs, idle ones exit. ``run()`` can be captured
  in a graph and replayed every step; ``plan()`` is called every step *outside*
  the capture (it enqueues the step's planning work on the current stream and
  may re-pick parameters on the host). Nothing in plan/run allocates (pass
  ``out`` to ``run``) or syncs. The work list is computed

  - on the GPU (``planner="device"``, :mod:`kvsplit.kernels.device_plan`) for
    rules made of prefix sums: ``stream_k``, ``fixed``, ``no_split``, ``tuned``
    with ``partition="stream_k"`` or ``wave_aware=False``;
  - on the host (``planner="host"``; the only choice for ``balanced`` and the
    wave-aware ``tuned``), from ``kv_lens_host`` (a host copy of kv_lens the
    engine already has), then copied into the buffers with asynchronous copies
    from pinned memory (double-buffered; before refilling a staging buffer the
    host waits for the copy issued from it two steps earlier, long done in
    practice).

  ``planner="auto"`` picks device when the rule allows it.

  **Re-pick rule** (graph mode): policy parameters are looked up again on the
  host from ``kv_lens_host`` only when the batch size changes or every
  ``repick_every`` steps (default 64) — the bucket of a running batch drifts
  slowly as its lengths grow. The captured graph baked in the wrapper's kernel
  config (its tile: ``block_n``, ``num_warps``, ``num_stages``, ``prefetch``,
  ``next_item``, ``heads_per_tile``; persistent with ``num_programs``), so a
  re-picked entry tuned on that tile runs its own rule and parameters; one
  tuned on another tile runs the graph's own rule (``stream_k`` at one CTA
  per SM) on a tile of one resident CTA per SM (``graph_residency``), else its
  own rule with ctas_per_sm raised to the residency when below 2
  (``_entry_rule``; measured on the H200: docs/decisions/graph-default.md). The
  whole-wave rule (``whole_wave``, which picks a tile per batch:
  docs/decisions/whole-wave-rule.md) is left out. By default
  (no tile knobs in ``params``) the tile is
  :func:`kvsplit.kernels.limits.graph_default_config`'s: on the H200 its graph
  path ran at 1.02x the time of the plan the table serves eagerly (geomean of
  171 batches, docs/decisions/graph-default.md). With a ``table``, ``kv_lens_host``
  is required on re-pick steps; without one, only with ``planner="host"``.

  **Page ids are the caller's contract in graph mode**, as in FlashInfer:
  ``plan()`` does not read kv_indptr / kv_indices / kv_lens back (that would
  be a sync), so out-of-range page ids or kv_lens above their pages read
  arbitrary cache memory instead of raising.

Errors are ``ValueError``s naming the argument.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from . import fastplan
from .buckets import bucket_key
from .decode import (
    KV_DTYPES,
    TORCH_DTYPES,
    DecodeWorkspace,
    check_cache_dtype,
    check_heads_per_tile,
    check_interpreter_dtype,
    check_kernel_device,
    launch_decode,
    make_workspace,
)
from .device import DeviceSpec, resolve_device
from .device_plan import LAUNCH_ARRAYS, alloc_device_plan, check_device_rule, device_plan
from .limits import (
    HEAD_DIMS,
    MAX_BATCH,
    MAX_PAGE_SIZE,
    KernelConfig,
    check_covers_q_len,
    check_kv_dtype,
    check_q_len,
    default_config,
    graph_default_config,
    heads_fit,
)
from .plan import Plan
from .policies import plan_with
from .policy_table import PolicyTable, default_fallback
from .rulespec import RuleSpec, fit_heads_per_tile, resident_slots, resolve
from .shape import canonical_dtype

__all__ = ["DecodeWrapper", "GraphOptions", "AUTO_RULE"]

AUTO_RULE = {"eager": "balanced", "graph": "stream_k"}
"""The policy ``DecodeWrapper(policy="auto")`` (the default, when no table is given) plans with, per mode: eager,
``balanced`` (the planner's default and a table's fallback; for an FP8 cache at q_len 1 the FP8 fallback,
:func:`kvsplit.kernels.policy_table.default_fallback`); graph, ``stream_k`` with ``ctas_per_sm`` the graph
tile's resident CTAs per SM (the fixed tile and persistent grid of the captured graph; measured on the H200:
docs/decisions/graph-default.md)."""

_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
_TILE_KNOBS = ("block_n", "num_warps", "num_stages", "prefetch", "next_item")  # with heads_per_tile: a graph's tile
_FIXED_KNOBS = _TILE_KNOBS + ("heads_per_tile", "schedule", "num_programs")  # what the captured graph bakes in


@dataclass(frozen=True)
class GraphOptions:
    """The options of :class:`DecodeWrapper`'s CUDA-graph mode, as one value (module doc).

    Parameters
    ----------
    max_work_items : int, optional
        Most work items of a plan (default ``max_batch_size + 4 * num_SMs * 8``, enough for stream_k at up to 8
        CTAs per SM).
    planner : str
        ``"auto"`` (default: the device planner where the rule allows it), ``"device"`` or ``"host"``.
    repick_every : int
        Re-pick the policy parameters every this many steps (and whenever the batch size changes); default 64.
    num_programs : int, optional
        Persistent programs of stage 1 (default from the policy's ``num_programs``, else 4 per SM).

    Raises
    ------
    ValueError
        On an invalid field, naming it (``graph.planner`` ...).
    """

    max_work_items: int | None = None
    planner: str = "auto"
    repick_every: int = 64
    num_programs: int | None = None

    def __post_init__(self) -> None:
        if self.planner not in ("auto", "device", "host"):
            raise ValueError(f"graph.planner: expected 'auto', 'device' or 'host', got {self.planner!r}")
        for name in ("repick_every", "max_work_items", "num_programs"):
            v = getattr(self, name)
            if v is None and name != "repick_every":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"graph.{name}: expected an integer >= 1, got {v!r}")


class _PinnedPair:
    """Two int32 host buffers (pinned on CUDA) filled in turn for asynchronous host -> device copies: before one
    is refilled, the host waits for the copies issued from it two fills earlier (long done in practice). Both
    upload paths use it: the eager plan's (:meth:`DecodeWrapper._upload_eager`) and the graph mode's host
    planner (:meth:`DecodeWrapper._upload`)."""

    def __init__(self, cuda: bool, size: int = 0) -> None:
        self.cuda = cuda
        self.host: list[torch.Tensor | None] = [None, None]
        self.np: list[np.ndarray | None] = [None, None]  # their NumPy views
        self.done: list[Any] = [None, None]  # CUDA: the event recorded after the copies from each
        self.turn = 1
        for k in range(2 if size else 0):
            self._alloc(k, size)

    def _alloc(self, k: int, size: int) -> None:
        self.host[k] = torch.empty(size, dtype=torch.int32, pin_memory=self.cuda)
        self.np[k] = self.host[k].numpy()
        self.done[k] = torch.cuda.Event() if self.cuda else None

    def fill(self, size: int) -> tuple[torch.Tensor, np.ndarray]:
        """The next buffer (at least ``size`` entries, grown if needed) and its NumPy view, once the copies last
        issued from it are done."""
        k = self.turn = 1 - self.turn
        if self.done[k] is not None:
            self.done[k].synchronize()
        if self.np[k] is None or self.np[k].shape[0] < size:
            self._alloc(k, size)
        return self.host[k], self.np[k]

    def issued(self, wait: bool = False) -> None:
        """The copies from the current buffer are issued: record its event on the current stream (CUDA), and with
        ``wait`` wait for them."""
        if self.cuda:
            ev = self.done[self.turn]
            ev.record()
            if wait:
                ev.synchronize()


def fit_tile_rows(plan: Plan, group: int, q_len: int) -> Plan:
    """``plan`` itself, or (when the launch would refuse its tile at ``q_len`` tokens, :func:`~kvsplit.kernels.limits.heads_fit`:
    a table entry tuned with several KV heads per tile, served to a wrapper of ``q_len`` tokens) the same work list
    with one KV head per tile (the tile count follows the config)."""
    h = plan.config.heads_per_tile
    if h == 1 or heads_fit(h, group * plan.num_kv_heads, plan.num_kv_heads, q_len):
        return plan
    return dataclasses.replace(plan, config=dataclasses.replace(plan.config, heads_per_tile=1))


class DecodeWrapper:
    """Split-KV GQA decode over a paged NHD cache, planned once per step (module doc).

    Parameters
    ----------
    num_qo_heads, num_kv_heads, head_dim : int
        H_q (a multiple of H_kv), H_kv, D (64, 128 or 256).
    page_size : int
        Tokens per KV page (default 16).
    dtype : str or torch.dtype
        q's dtype: ``"float16"``, ``"bfloat16"`` (default) or ``"float32"`` (CPU tests), an alias (``"bf16"``) or
        the torch dtype (``torch.bfloat16``, as FlashInfer's ``q_data_type``)
        (:func:`kvsplit.kernels.shape.canonical_dtype`); ``self.dtype`` holds the name.
    device : str or torch.device
        Where q, the cache and the index tensors live (``"cuda"``; ``"cpu"``
        under ``TRITON_INTERPRET=1``).
    max_batch_size : int
        Most requests of a step (graph mode buffers; default 256).
    table : PolicyTable or PlanClient, optional
        Tuned policies looked up by the batch's bucket; else ``policy``/``params`` for every batch. A
        ``PlanClient`` (or any object with a ``.table`` attribute holding a PolicyTable) is read at every
        :meth:`plan`, so the client's background refreshes reach the next step (graph mode re-picks at the
        first step after the table changed).
    policy, params
        The policy when there is no table: a name of :data:`kvsplit.kernels.plan.POLICIES`, or ``"auto"``
        (default): the mode's rule, :data:`AUTO_RULE` -- ``balanced`` (the planner's default and the table's
        fallback) in eager mode; ``stream_k`` with ``ctas_per_sm`` the graph tile's resident CTAs per SM
        (``params`` may override it) in graph mode, whose tile and persistent grid are fixed at capture. In graph
        mode, params without tile knobs (``block_n``, ``num_warps``,
        ``num_stages``, ``prefetch``, ``next_item``) get
        :func:`kvsplit.kernels.limits.graph_default_config`'s tile for the
        GQA shape (two KV heads per work tile where they fit;
        ``heads_per_tile`` in params overrides its heads); given knobs
        complete with :func:`~kvsplit.kernels.limits.default_config`'s.
    use_cuda_graph : bool
        Graph mode (module doc).
    graph : GraphOptions, optional
        The graph mode's options (default ``GraphOptions()``); only with ``use_cuda_graph``.
    gpu : DeviceSpec or str, optional
        The GPU the plans are for; default ``torch.cuda.get_device_name(device)``
        on CUDA, ``"NVIDIA H200"`` on the CPU.
    sm_scale : float, optional
        Softmax scale (default ``1/sqrt(head_dim)``).
    workspace : DecodeWorkspace, optional
        The caller's own workspace (:func:`kvsplit.kernels.decode.make_workspace`), as FlashInfer's wrappers take
        a float workspace buffer: used as it is, never reallocated (a plan that needs more partial slots or
        requests than it holds raises ``ValueError`` naming ``workspace``). Default: the wrapper allocates one
        (graph mode: for ``max_work_items`` partials; eager mode: grown as plans need). Made with this
        ``q_len`` (``make_workspace(..., q_len=q_len)``).
    q_len : int
        Query tokens per request, 1 (decode, default) to 8 (speculative-decoding verify steps: 1 + draft
        tokens), the same for every request of every step: ``run()`` takes q ``[B * q_len, H_q, D]``, token j
        of request b at row ``b * q_len + j`` seeing the KV positions ``[0, kv_len - q_len + j]`` (kv_lens
        count the new tokens, written to the cache before attention; ``kv_lens >= q_len``, checked by eager
        ``plan()`` and from ``kv_lens_host`` in graph mode). The work list does not depend on it. A work tile
        holds ``G * heads_per_tile * q_len`` query rows, at most 64 (else ``ValueError`` naming ``q_len``).
    kv_dtype : str or torch.dtype, optional
        The KV cache's dtype: ``dtype`` or ``"float8_e4m3fn"`` / ``"fp8"`` / ``torch.float8_e4m3fn`` (with a
        float16 or bfloat16 ``dtype``; ``run()`` then takes ``k_scale``/``v_scale``)
        (:func:`kvsplit.kernels.limits.check_kv_dtype`). Default (None): taken from the cache at each ``run()``
        (``dtype`` or fp8), but ``plan()``, which runs first, plans for a cache of ``dtype``: pass ``kv_dtype`` for
        an fp8 cache so that its plans are made for it (its residency, the table's fp8 family); with a ``table``
        ``run()`` refuses an fp8 cache without it.
    """

    def __init__(
        self,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        page_size: int = 16,
        dtype: str | torch.dtype = "bfloat16",
        device: Any = "cuda",
        max_batch_size: int = 256,
        table: Any = None,
        policy: str = "auto",
        params: Mapping[str, Any] | None = None,
        use_cuda_graph: bool = False,
        graph: GraphOptions | None = None,
        gpu: DeviceSpec | str | None = None,
        sm_scale: float | None = None,
        workspace: DecodeWorkspace | None = None,
        q_len: int = 1,
        kv_dtype: str | torch.dtype | None = None,
    ) -> None:
        for name, v in (("num_qo_heads", num_qo_heads), ("num_kv_heads", num_kv_heads)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
        if num_qo_heads % num_kv_heads:
            raise ValueError(f"num_qo_heads: {num_qo_heads} is not a multiple of num_kv_heads ({num_kv_heads})")
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim: expected one of {HEAD_DIMS}, got {head_dim!r}")
        if isinstance(page_size, bool) or not isinstance(page_size, int) or not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page_size: expected an integer in [1, {MAX_PAGE_SIZE}], got {page_size!r}")
        dtype = canonical_dtype(dtype)
        if (
            isinstance(max_batch_size, bool)
            or not isinstance(max_batch_size, int)
            or not 1 <= max_batch_size <= MAX_BATCH
        ):
            raise ValueError(f"max_batch_size: expected an integer in [1, {MAX_BATCH}], got {max_batch_size!r}")
        if graph is not None and not use_cuda_graph:
            raise ValueError("graph: the CUDA-graph mode's options; pass use_cuda_graph=True with them")
        if graph is None:
            graph = GraphOptions()
        elif not isinstance(graph, GraphOptions):
            raise ValueError(f"graph: expected a GraphOptions, got {type(graph).__name__}")
        if workspace is not None and not isinstance(workspace, DecodeWorkspace):
            raise ValueError(f"workspace: expected a DecodeWorkspace (make_workspace), got {type(workspace).__name__}")
        self.q_len = check_q_len(q_len)
        if workspace is not None and tuple(workspace.part_o.shape[1:]) != (q_len * num_qo_heads, head_dim):
            raise ValueError(
                f"workspace: made for rows {tuple(workspace.part_o.shape[1:])}, expected "
                f"{(q_len * num_qo_heads, head_dim)} (make_workspace(num_qo_heads, head_dim, ..., q_len={q_len}))"
            )
        if kv_dtype is not None:
            # the names, aliases ("fp8") and torch dtypes the planner takes (limits.check_kv_dtype), as a torch dtype
            kv_dtype = {v: k for k, v in KV_DTYPES.items()}[check_kv_dtype(kv_dtype, dtype)]
        self.kv_dtype: torch.dtype | None = kv_dtype
        check_heads_per_tile(1, num_qo_heads, num_kv_heads, q_len=q_len)  # G * q_len rows fit one tile
        self.graph_options = graph
        max_work_items, planner, repick_every, num_programs = (
            graph.max_work_items,
            graph.planner,
            graph.repick_every,
            graph.num_programs,
        )
        self.num_qo_heads, self.num_kv_heads, self.head_dim = num_qo_heads, num_kv_heads, head_dim
        self.page_size, self.dtype = page_size, dtype
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"device: {device!r} asked for, but torch sees no CUDA device here (CPU-only build or no "
                "GPU); on the CPU pass device='cpu' with TRITON_INTERPRET=1 set"
            )
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        check_kernel_device("device", self.device)
        if gpu is None:
            gpu = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "NVIDIA H200"
        self.gpu = resolve_device(gpu)
        # a PlanClient (anything with a .table) is read at every plan(): its refresh thread replaces .table whole
        self._table_source = table
        self._live_table = table is not None and not isinstance(table, PolicyTable) and hasattr(table, "table")
        self.max_batch_size = max_batch_size
        self.use_cuda_graph = bool(use_cuda_graph)
        self.repick_every = repick_every
        self.sm_scale = sm_scale
        self._shape = dict(
            num_kv_heads=num_kv_heads,
            device=self.gpu,
            head_dim=head_dim,
            page_size=page_size,
            dtype=dtype,
            kv_dtype=self._kv_dtype_name(),
            q_len=self.q_len,
            num_qo_heads=num_qo_heads,
        )
        if policy is None or not isinstance(policy, str):
            raise ValueError(f"policy: expected a policy name or 'auto', got {policy!r}")
        auto = policy == "auto"
        # policy "auto": the mode's rule (AUTO_RULE); in graph mode its ctas_per_sm is the tile's residency (below)
        # validates policy and params now; the eager planner plans every batch with this spec
        if auto and not self.use_cuda_graph:  # eager "auto": the default table's fallback for this family
            policy, rule_params = default_fallback(self._kv_dtype_name(), self.q_len)
            fitted = fit_heads_per_tile(rule_params, num_qo_heads, num_kv_heads, self.q_len)
            params = {**fitted, **dict(params or {})}
        self.spec: RuleSpec = resolve(
            AUTO_RULE["graph"] if auto and self.use_cuda_graph else policy, params, **self._shape
        )
        if self.device.type == "cpu":
            check_interpreter_dtype("dtype", _NAMES[dtype])
        self.policy, self.params = AUTO_RULE["eager"] if auto and self.use_cuda_graph else policy, dict(params or {})
        self._plan: Plan | None = None
        self._arrays: dict[str, torch.Tensor] | None = None
        self._picked_table: Any = None  # graph mode: the table the current rule was picked from
        # eager uploads: two pinned host buffers used in turn and one device buffer, grown as plans need (module doc)
        self._eager_host = _PinnedPair(self._cuda)
        self._eager_dev: torch.Tensor | None = None
        self._eager_cap = (0, 0)  # (work items, merged requests) the regions of the eager buffers hold
        self._eager_offsets: tuple[int, ...] = ()  # where each of LAUNCH_ARRAYS starts, then the buffers' size
        self._eager_views: dict[str, torch.Tensor] = {}  # views of the device buffer's regions, made with it
        self._max_page = -1
        self._B = -1
        self._step = 0
        self.workspace = workspace
        self._own_workspace = workspace is None
        if not self.use_cuda_graph:
            return
        # ---- graph mode: fixed kernel config, preallocated buffers ----------------
        tile = {k: self.params[k] for k in _TILE_KNOBS if k in self.params}
        # no tile knobs given: the graph default tile for this GQA shape; else the given knobs over the eager
        # default config, one KV head per tile unless params say otherwise
        base = (
            default_config(head_dim, dtype)
            if tile
            else graph_default_config(head_dim, dtype, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads)
        )
        if num_programs is None:
            num_programs = int(self.params.get("num_programs") or 4 * self.gpu.num_sms)
        self._knobs = {k: tile.get(k, getattr(base, k)) for k in _TILE_KNOBS}
        self._knobs.update(schedule="persistent", num_programs=int(num_programs))
        heads = self.params.get("heads_per_tile", base.heads_per_tile)
        if "heads_per_tile" not in self.params and not heads_fit(heads, num_qo_heads, num_kv_heads, q_len):
            heads = 1  # the graph default packs two KV heads per tile: one, when q_len's rows would not fit
        check_heads_per_tile(heads, num_qo_heads, num_kv_heads, name="params.heads_per_tile", q_len=q_len)
        self._knobs["heads_per_tile"] = heads
        cfg = self._knobs
        # the residency the planner's rules count for this tile (rulespec.resident_slots: KV dtype, q_len rows)
        knobs = {k: cfg[k] for k in ("block_n", "num_warps", "num_stages", "prefetch", "next_item")}
        tile_cfg = KernelConfig(**knobs, heads_per_tile=heads)
        self.graph_residency = resident_slots(self.spec.context, tile_cfg) // self.gpu.num_sms
        # the graph's own rule: for table entries tuned on another tile and for policy "auto"
        self._tile_rule = (AUTO_RULE["graph"], {"ctas_per_sm": float(max(1, self.graph_residency))})
        if auto:
            self.policy = self._tile_rule[0]
            self.params = {**self._tile_rule[1], **self.params}
        if max_work_items is None:
            max_work_items = max_batch_size + 32 * self.gpu.num_sms
        self.max_work_items = int(max_work_items)
        self.bufs = alloc_device_plan(max_batch_size, self.max_work_items, self.device)
        if workspace is None:
            self.workspace = make_workspace(
                num_qo_heads,
                head_dim,
                max_partials=self.max_work_items,
                max_batch=max_batch_size,
                device=self.device,
                q_len=q_len,
            )
        elif workspace.max_partials < self.max_work_items or workspace.max_batch < max_batch_size:
            raise ValueError(
                f"workspace: holds {workspace.max_partials} partials and {workspace.max_batch} requests; "
                f"graph mode needs max_work_items={self.max_work_items} and "
                f"max_batch_size={max_batch_size}"
            )
        self.planner_requested = planner
        self._staging = _PinnedPair(self._cuda, 5 * self.max_work_items + 4 * max_batch_size + 8)
        self._device_rule = False
        self._pick(self.policy, self.params)

    # ------------------------------------------------------------------ helpers
    def _graph_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        # the graph's tile is fixed, so the whole-wave rule (which picks a tile per batch) does not apply here
        p = {
            k: v
            for k, v in params.items()
            if k not in _FIXED_KNOBS and k not in ("programs_per_sm", "whole_wave", "whole_wave_heads")
        }
        p.update(self._knobs)
        return p

    def _other_tile(self, params: Mapping[str, Any]) -> bool:
        """Whether ``params`` name a kernel tile other than the graph's (block_n, warps, stages, load knobs,
        heads per tile; knobs left out are :func:`default_config`'s, as in eager planning)."""
        base = default_config(self.head_dim, self.dtype)
        theirs = {k: params.get(k, getattr(base, k)) for k in _TILE_KNOBS + ("heads_per_tile",)}
        return any(theirs[k] != self._knobs[k] for k in theirs)

    def _entry_rule(self, policy: str, params: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
        """The rule a re-picked table entry runs in graph mode.

        Tuned on the graph's tile: its own. Tuned on another tile, measured on the H200 (docs/decisions/graph-default.md):

        - a graph tile of one resident CTA per SM (the look-ahead tile of :func:`graph_default_config`): the graph's
          own rule, ``stream_k`` at that one CTA per SM. The shipped entries' 2-4 CTAs per SM (tuned on (32, 4, 3)
          tiles) ran it at 1.034x (up to 1.19x) that rule's time;
        - a tile of two or more resident CTAs per SM: the entry's rule, its ctas_per_sm raised to the tile's
          residency when below 2 (entries tuned for a one-CTA-per-SM tile ran (128, 4, 2) at 1.13-1.37x the time
          with it); stream_k at the residency for every such entry ran that tile at 1.296x the served
          eager plan against 1.252x for this rule (same run)."""
        if not self._other_tile(params):
            return policy, params
        if self.graph_residency <= 1:
            return self._tile_rule
        c = params.get("ctas_per_sm")
        if c is not None and c < 2:
            return policy, {**params, "ctas_per_sm": float(max(c, self.graph_residency))}
        return policy, params

    def _pick(self, policy: str, params: Mapping[str, Any]) -> None:
        """Graph mode: set the rule (device) or the host policy for the next steps."""
        self.spec = resolve(policy, self._graph_params(params), **self._shape)
        self._device_rule = False
        if self.planner_requested in ("auto", "device"):
            try:
                check_device_rule(self.spec)
                self._device_rule = True
            except NotImplementedError:
                if self.planner_requested == "device":
                    raise
        self.planner = "device" if self._device_rule else "host"
        self.config = self.spec.config

    @property
    def table(self) -> PolicyTable | None:
        """The PolicyTable the next :meth:`plan` uses (a PlanClient's current ``.table``), or None."""
        src = self._table_source
        return src.table if self._live_table else src

    def _kv_dtype_name(self) -> str | None:
        """The KV dtype of the table's bucket family: None (the same as q's) unless declared at construction."""
        return None if self.kv_dtype is None else KV_DTYPES[self.kv_dtype]

    def _lookup(self, kv_lens_host: np.ndarray) -> tuple[str, dict[str, Any]]:
        table = self.table
        self._picked_table = table
        if table is None:
            return self.policy, self.params
        key = bucket_key(
            kv_lens_host,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            dtype=self.dtype,
            device=self.gpu,
            page_size=self.page_size,
            kv_dtype=self._kv_dtype_name(),
            q_len=self.q_len,
        )
        entry, _ = table.lookup(key)
        if entry is None:
            return table.fallback_for(self._kv_dtype_name(), self.q_len)
        return entry.name, dict(entry.params)

    def _check_index(self, kv_indptr, kv_indices, kv_lens) -> int:
        for name, t, ndim in (("kv_indptr", kv_indptr, 1), ("kv_indices", kv_indices, 1), ("kv_lens", kv_lens, 1)):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
            if t.dim() != ndim or t.dtype != torch.int32 or not t.is_contiguous():
                raise ValueError(
                    f"{name}: expected a contiguous 1-D torch.int32 tensor, got shape {tuple(t.shape)} dtype {t.dtype}"
                )
            if t.device != self.device:
                raise ValueError(f"{name}: expected device {self.device}, got {t.device}")
        B = int(kv_lens.shape[0])
        if B < 1:
            raise ValueError("kv_lens: expected at least one request")
        if B > self.max_batch_size:
            raise ValueError(f"kv_lens: {B} requests above max_batch_size={self.max_batch_size}")
        if kv_indptr.shape[0] != B + 1:
            raise ValueError(f"kv_indptr: expected shape ({B + 1},), got {tuple(kv_indptr.shape)}")
        return B

    @property
    def last_plan(self) -> Plan | None:
        """The host plan of the last :meth:`plan` step (None before the first, or when it was made on the device)."""
        return self._plan

    # ------------------------------------------------------------------ plan
    def plan(
        self,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        kv_lens: torch.Tensor,
        *,
        kv_lens_host: Any = None,
        kv_indptr_host: Any = None,
        kv_indices_host: Any = None,
    ) -> None:
        """Plan one decode step (all layers).

        Parameters
        ----------
        kv_indptr : torch.Tensor int32 ``[B + 1]``
        kv_indices : torch.Tensor int32 ``[kv_indptr[-1]]``
            Page ids of each request in order.
        kv_lens : torch.Tensor int32 ``[B]``
            Tokens of each request (its first ``ceil(kv_len / page_size)`` pages).
        kv_lens_host : array-like of int ``[B]``, optional
            A host copy of kv_lens (NumPy array, list or CPU tensor), as the engine already has it. Graph mode:
            used to re-pick parameters and by the host planner (module doc). Eager mode: with
            ``kv_indptr_host``, the wrapper plans and validates from the host copies instead of copying kv_lens
            and kv_indptr back from the device; they must hold the same values (the caller's contract, as
            FlashInfer's plan takes indptr on the host). Eager mode uses the host copies only when both are
            given: ``kv_lens_host`` alone (graph mode's argument, so one loop serves both modes) leaves the
            eager plan copying both back from the device.
        kv_indptr_host : array-like of int ``[B + 1]``, optional
            A host copy of kv_indptr (eager mode, with ``kv_lens_host``).
        kv_indices_host : array-like of int ``[>= kv_indptr[-1]]``, optional
            A host copy of kv_indices, at least the page ids the step uses (eager mode, with ``kv_lens_host`` and
            ``kv_indptr_host``): the page ids are checked from it instead of on the device, so the eager plan
            never waits for the device (an engine that builds its block table on the host, as transformers'
            continuous batching does, has it). Same contract as the other host copies: the same values as the
            device tensor.

        Returns
        -------
        None
            In both modes, as FlashInfer's ``plan``. The host plan of the step, when one was made on the host
            (eager mode; graph mode with the host planner), is :attr:`last_plan`.

        Raises
        ------
        ValueError
            Naming the argument: wrong dtype, shape or device; kv_indptr not starting at 0 or decreasing, or past
            the end of kv_indices; a negative kv_len or one above its pages; a negative page id (eager mode: from
            ``kv_indices_host`` when given, else the page ids of kv_indices the step uses are read on the device,
            reduced to their min and max, and copied back: the one wait of an eager plan given the other host
            copies); host copies of the wrong length; ``kv_indices_host`` without ``kv_lens_host`` and
            ``kv_indptr_host``, or in graph mode (which does not check page ids: module doc).
        """
        B = self._check_index(kv_indptr, kv_indices, kv_lens)
        self._kv_lens = kv_lens
        if not self.use_cuda_graph:  # checks the lengths it plans from (check_covers_q_len among them)
            self._plan_eager(kv_indptr, kv_indices, kv_lens, B, kv_lens_host, kv_indptr_host, kv_indices_host)
            self._indptr, self._indices = kv_indptr, kv_indices
            return None
        if kv_indices_host is not None:
            raise ValueError(
                "kv_indices_host: eager mode only (graph mode does not check page ids: they are the caller's "
                "contract, module doc)"
            )
        if kv_lens_host is not None:
            check_covers_q_len(np.asarray(kv_lens_host), self.q_len, "kv_lens_host")
        self._indptr, self._indices = kv_indptr, kv_indices
        table = self.table
        if B != self._B or self._step % self.repick_every == 0 or table is not self._picked_table:
            if table is not None:
                if kv_lens_host is None:
                    raise ValueError(
                        "kv_lens_host: required when the policy is re-picked from a table "
                        "(batch size changed, the table changed, or every repick_every steps)"
                    )
                self._pick(*self._entry_rule(*self._lookup(fastplan.as_kv_lens(kv_lens_host))))
            self._B = B
        self._step += 1
        if self.planner == "device":
            device_plan(kv_lens, self.spec, self.bufs, self.workspace.counter)
            self._plan = None
            return None
        if kv_lens_host is None:
            raise ValueError(
                "kv_lens_host: required by the host planner in graph mode (policy "
                f"{self.spec.policy!r} is not run on the device)"
            )
        p = plan_with(kv_lens_host, self.spec)
        if p.batch_size != B:
            raise ValueError(f"kv_lens_host: expected {B} entries (kv_lens'), got {p.batch_size}")
        self._upload(p)
        self._plan = p
        return None

    @staticmethod
    def _host_array(name: str, a: Any, n: int, at_least: bool = False) -> np.ndarray:
        """A caller's host copy as a 1-D integer NumPy array of ``n`` entries (``at_least``: ``n`` or more).

        Raises ValueError naming ``name``: a device tensor, not integers, another length."""
        if isinstance(a, torch.Tensor):
            if a.device.type != "cpu":
                raise ValueError(f"{name}: expected a host copy (NumPy array, list or CPU tensor), got {a.device}")
            a = a.numpy()
        try:
            h = np.asarray(a)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name}: expected an array of integers, got {type(a).__name__}") from exc
        if h.ndim != 1 or h.dtype.kind not in "iu" or (h.shape[0] < n if at_least else h.shape[0] != n):
            want = (
                f"at least {n} integers (the page ids kv_indptr counts)"
                if at_least
                else f"{n} integers (kv_{name[3:-5]}'s shape)"
            )
            raise ValueError(f"{name}: expected {want}, got shape {h.shape} dtype {h.dtype}")
        return h

    def _host_index(self, kv_indptr, kv_lens, B, kv_lens_host, kv_indptr_host) -> tuple[np.ndarray, np.ndarray, str]:
        """kv_indptr and kv_lens on the host as int64 arrays: the caller's copies, or one copy from the device."""
        if kv_lens_host is not None and kv_indptr_host is not None:
            indptr = self._host_array("kv_indptr_host", kv_indptr_host, B + 1)
            lens = self._host_array("kv_lens_host", kv_lens_host, B)
            return indptr.astype(np.int64, copy=False), lens.astype(np.int64, copy=False), "_host"
        # one copy back from the device (a wait for the stream) of both tensors
        both = torch.cat((kv_indptr, kv_lens)).to("cpu", torch.int64).numpy()
        return both[: B + 1], both[B + 1 :], ""

    def _plan_eager(
        self, kv_indptr, kv_indices, kv_lens, B, kv_lens_host=None, kv_indptr_host=None, kv_indices_host=None
    ) -> None:
        if kv_indices_host is not None and (kv_lens_host is None or kv_indptr_host is None):
            raise ValueError("kv_indices_host: needs kv_lens_host and kv_indptr_host (the step's host copies)")
        indptr, lens, sfx = self._host_index(kv_indptr, kv_lens, B, kv_lens_host, kv_indptr_host)
        if indptr[0] != 0:
            raise ValueError(f"kv_indptr{sfx}: expected kv_indptr[0] == 0, got {int(indptr[0])}")
        d = np.diff(indptr)
        if (d < 0).any():
            i = int(np.flatnonzero(d < 0)[0])
            raise ValueError(f"kv_indptr{sfx}: must be non-decreasing, kv_indptr[{i + 1}] < kv_indptr[{i}]")
        n_used = int(indptr[-1])
        if n_used > kv_indices.shape[0]:
            raise ValueError(f"kv_indptr{sfx}: last entry {n_used} exceeds len(kv_indices)={kv_indices.shape[0]}")
        if (lens < 0).any():
            i = int(np.flatnonzero(lens < 0)[0])
            raise ValueError(f"kv_lens{sfx}[{i}]: negative kv_len {int(lens[i])}")
        check_covers_q_len(lens, self.q_len, f"kv_lens{sfx}")
        over = lens > d * self.page_size
        if over.any():
            i = int(np.flatnonzero(over)[0])
            raise ValueError(
                f"kv_lens{sfx}[{i}]: {int(lens[i])} tokens exceed its {int(d[i])} pages (kv_indptr{sfx}[{i + 1}] - "
                f"kv_indptr{sfx}[{i}]) x page_size {self.page_size}"
            )
        table = self.table
        if table is not None:
            p, _, _ = table.plan(
                lens,
                gpu=self.gpu.name,
                num_qo_heads=self.num_qo_heads,
                num_kv_heads=self.num_kv_heads,
                head_dim=self.head_dim,
                dtype=self.dtype,
                page_size=self.page_size,
                device=self.gpu,
                kv_dtype=self._kv_dtype_name(),
                q_len=self.q_len,
            )
            p = fit_tile_rows(p, self.num_qo_heads // self.num_kv_heads, self.q_len)
        else:
            p = plan_with(lens, self.spec)
        partials = p.num_partials
        if not self._own_workspace and (self.workspace.max_partials < partials or self.workspace.max_batch < B):
            raise ValueError(
                f"workspace: holds {self.workspace.max_partials} partials and {self.workspace.max_batch} "
                f"requests; this step's plan needs {partials} and {B}"
            )
        if kv_indices_host is not None:  # the page ids the step uses, checked on the host: no wait for the device
            ids = self._host_array("kv_indices_host", kv_indices_host, n_used, at_least=True)[:n_used]
            hi = int(ids.max()) if n_used else -1
            if n_used and int(ids.min()) < 0:
                i = int(np.flatnonzero(ids < 0)[0])
                raise ValueError(f"kv_indices_host[{i}]: negative page id {int(ids[i])}")
            arrays, _ = self._upload_eager(p, None)
        else:
            # the page ids the step uses: their min and max reduced on the device, copied back with the plan's
            # upload in flight; the one wait of the step is for those two numbers
            arrays, minmax = self._upload_eager(p, kv_indices[:n_used] if n_used else None)
            hi = -1
            if minmax is not None:
                lo, hi = int(minmax[0]), int(minmax[1])
                if lo < 0:
                    # the upload overwrote the previous step's arrays: run() needs a new plan()
                    self._plan, self._arrays, self._B = None, None, -1
                    raise ValueError(f"kv_indices: negative page id {lo}")
        if self.workspace is None or self.workspace.max_partials < partials or self.workspace.max_batch < B:
            grow = max(partials, 2 * (self.workspace.max_partials if self.workspace else 0))
            self.workspace = make_workspace(
                self.num_qo_heads,
                self.head_dim,
                max_partials=grow,
                max_batch=max(B, self.max_batch_size),
                device=self.device,
                q_len=self.q_len,
            )
        self._plan, self._arrays, self._max_page, self._B = p, arrays, hi, B

    def _eager_regions(self, W: int, M: int) -> None:
        """(Re)make the eager buffers' layout for plans of up to ``W`` work items (and ``cta_indptr`` entries) and
        ``M`` merged requests (twice as many, in multiples of 64): one region per launch array at a fixed offset,
        every offset a multiple of 4 int32 (16 bytes), so the device buffer's views keep the same Triton pointer
        specialization (16-byte alignment) for every plan, and are made once per layout rather than per plan."""
        wcap = -(-max(2 * W, 64) // 64) * 64
        mcap = -(-max(2 * M, 64) // 64) * 64
        sizes = (wcap, wcap, wcap, wcap, wcap, mcap, mcap, mcap)
        offsets = [0]
        for n in sizes:
            offsets.append(offsets[-1] + n)
        self._eager_dev = torch.empty(offsets[-1], dtype=torch.int32, device=self.device)
        self._eager_views = {
            name: self._eager_dev[o : o + n] for name, o, n in zip(LAUNCH_ARRAYS, offsets[:-1], sizes, strict=True)
        }
        self._eager_cap, self._eager_offsets = (wcap, mcap), tuple(offsets)

    def _upload_eager(self, p: Plan, used: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], np.ndarray | None]:
        """The plan's launch arrays in one device buffer, filled by one asynchronous copy from a pinned host buffer
        (:class:`_PinnedPair`: two, used in turn); with ``used`` (the step's page ids), their (min, max) copied back into the same
        host buffer and waited for. Returns the arrays (views of the device buffer's regions,
        :meth:`_eager_regions`: each holds the plan's array at its start) and the (min, max) or None. The device
        buffer is rewritten in stream order: the copy runs after the previous step's launches."""
        ws, mr, ms, mn = p.merge_layout()
        segs = (p.work_request, p.work_kv_start, p.work_kv_end, ws, p.cta_indptr, mr, ms, mn)
        W, M = max(p.num_work_items, p.cta_indptr.shape[0]), mr.shape[0]  # num_ctas + 1 <= W + 1
        if W > self._eager_cap[0] or M > self._eager_cap[1]:
            self._eager_regions(W, M)
        offs = self._eager_offsets
        host, h = self._eager_host.fill(offs[-1] + 2)  # the regions, then the page ids' (min, max) copied back
        dev = self._eager_dev
        for o, a in zip(offs, segs):
            h[o : o + a.shape[0]] = a  # int64 token offsets: < 2^31 (MAX_KV_LEN)
        end = offs[7] + M if M else offs[4] + segs[4].shape[0]  # through the last array the launch reads
        dev[:end].copy_(host[:end], non_blocking=True)
        mm = offs[-1]
        if used is not None and not self._cuda:  # the CPU interpreter's tensors: NumPy's reduction (torch's is slower)
            u = used.numpy()
            return self._eager_views, np.array([u.min(), u.max()])
        if used is not None:
            host[mm : mm + 2].copy_(torch.stack(torch.aminmax(used)), non_blocking=True)
        self._eager_host.issued(wait=used is not None)
        return self._eager_views, (h[mm : mm + 2].copy() if used is not None else None)

    def _upload(self, p: Plan) -> None:
        W, MW = p.num_work_items, self.max_work_items
        if W > MW:
            raise ValueError(f"max_work_items: the plan has {W} work items, above max_work_items={MW}")
        st, host = self._staging.fill(0)
        ws, mr, ms, mn = p.merge_layout()
        C, M = p.num_ctas, mr.shape[0]
        arrays = (p.work_request, p.work_kv_start, p.work_kv_end, ws, p.cta_indptr, mr, ms, mn)
        segs = (*zip(LAUNCH_ARRAYS, arrays, strict=True), ("counts", np.array([W, C, p.num_work_tiles, M])))
        off = 0
        for name, a in segs:
            n = a.shape[0]
            host[off : off + n] = a
            getattr(self.bufs, name)[:n].copy_(st[off : off + n], non_blocking=True)
            off += n
        self._staging.issued()

    # ------------------------------------------------------------------ run
    def run(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        *,
        out: torch.Tensor | None = None,
        return_lse: bool = False,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Decode attention of one layer for the planned step.

        Parameters
        ----------
        q : torch.Tensor ``[B * q_len, H_q, D]``, the wrapper's dtype (first two dimensions contiguous)
        k_cache, v_cache : torch.Tensor ``[num_pages, page_size, H_kv, D]``
            The wrapper's ``kv_dtype`` (default: its ``dtype`` or ``torch.float8_e4m3fn``).
        out : torch.Tensor ``[B * q_len, H_q, D]``, optional
            Output buffer (pass it under CUDA-graph capture).
        return_lse : bool
            Also return the LSE (fp32 ``[B * q_len, H_q]``, natural log; a view of the
            wrapper's workspace, overwritten by the next call).
        k_scale, v_scale : float or torch.Tensor, optional
            The cache's dequantization scales, as FlashInfer's ``run`` takes them: floats (per tensor) or
            float32 tensors ``[H_kv]`` on the device (per KV head; read by the kernel, so a captured graph
            replays with their current values; their values are the caller's contract, as page ids are)
            (:func:`kvsplit.kernels.decode.check_kv_scales`). Default 1.
        """
        if self._B < 0:
            raise ValueError("plan: call plan() before run()")
        B = self._B
        want = _NAMES[self.dtype]
        rows = B * self.q_len
        kv_want = self.kv_dtype
        if kv_want is None and isinstance(k_cache, torch.Tensor) and k_cache.dtype in KV_DTYPES:
            kv_want = k_cache.dtype
            check_cache_dtype("k_cache", kv_want, want)
            if kv_want != want and self.table is not None:
                # the table served this step's entry from the family of q's dtype: an FP8 cache is another family
                raise ValueError(
                    f"k_cache: a {KV_DTYPES[kv_want]} cache with a policy table needs DecodeWrapper(kv_dtype="
                    f"{KV_DTYPES[kv_want]!r}) at construction, so plan() looks up that family's policies"
                )
        for name, t, shape, dt in (
            ("q", q, (rows, self.num_qo_heads, self.head_dim), want),
            ("k_cache", k_cache, None, kv_want or want),
            ("v_cache", v_cache, None, kv_want or want),
        ):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
            if t.dtype != dt or t.device != self.device or t.stride(-1) != 1:
                raise ValueError(
                    f"{name}: expected {dt} on {self.device} with a contiguous last dimension, "
                    f"got {t.dtype} on {t.device}"
                )
            if shape is not None and tuple(t.shape) != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")
        if self.q_len > 1 and rows > 1 and q.stride(0) != self.num_qo_heads * q.stride(1):
            raise ValueError("q: with q_len > 1 the first two dimensions must be contiguous ([B * q_len, H_q, D] rows)")
        cshape = (self.page_size, self.num_kv_heads, self.head_dim)
        if k_cache.dim() != 4 or tuple(k_cache.shape[1:]) != cshape or tuple(v_cache.shape) != tuple(k_cache.shape):
            raise ValueError(
                f"k_cache/v_cache: expected shape (num_pages, {', '.join(map(str, cshape))}), got "
                f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
            )
        if self._max_page >= k_cache.shape[0]:
            raise ValueError(
                f"kv_indices: page id {self._max_page} out of range for a cache of {k_cache.shape[0]} pages"
            )
        if out is None:
            out = torch.empty_like(q)
        elif tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype or out.device != q.device:
            raise ValueError(
                f"out: expected shape {tuple(q.shape)} {q.dtype} on {q.device}, got "
                f"{tuple(out.shape)} {out.dtype} on {out.device}"
            )
        elif self.q_len > 1 and rows > 1 and out.stride(0) != self.num_qo_heads * out.stride(1):
            raise ValueError("out: with q_len > 1 the first two dimensions must be contiguous")
        scale_kw = dict(q_len=self.q_len, kv_lens=self._kv_lens, k_scale=k_scale, v_scale=v_scale)
        if not self.use_cuda_graph:
            p = self._plan
            return launch_decode(
                q,
                k_cache,
                v_cache,
                self._indptr,
                self._indices,
                self._arrays,
                p.config,
                out=out,
                workspace=self.workspace,
                **p.launch_sizes(),
                sm_scale=self.sm_scale,
                return_lse=return_lse,
                **scale_kw,
            )
        return launch_decode(
            q,
            k_cache,
            v_cache,
            self._indptr,
            self._indices,
            self.bufs.arrays(),
            self.config,
            out=out,
            workspace=self.workspace,
            counts=self.bufs.counts,
            max_merge=self.max_batch_size,
            sm_scale=self.sm_scale,
            return_lse=return_lse,
            **scale_kw,
        )
