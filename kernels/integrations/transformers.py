"""kvsplit as the decode attention of Hugging Face transformers' continuous batching.

One call, before ``generate_batch`` / ``init_continuous_batching`` / ``transformers serve``::

    from kvsplit.kernels.integrations import transformers as kvsplit_tf
    handle = kvsplit_tf.install()                 # or install(table=PolicyTable.from_export(...))
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="paged|sdpa", dtype=torch.bfloat16)
    out = model.generate_batch(prompts, generation_config=gc,
                               continuous_batching_config=kvsplit_tf.continuous_batching_config(page_size=16))
    handle.uninstall()                            # restores transformers' own functions

Tested with transformers 5.17.0 and 5.25.0 (``TESTED_TRANSFORMERS``, ``>=5.17,<5.26``, which the
``kvsplit[transformers]`` extra pins). The two have different paged caches; both are handled (below).

What runs where, per forward pass (a "step") of continuous batching:

- **decode rows** (requests with one query token in the step) run through one
  :class:`~kvsplit.kernels.wrapper.DecodeWrapper` per attention shape, planned once per step (at the first layer,
  the plan kept for the step's other layers) and run per layer straight on transformers' paged cache;
- **rows of 2-8 query tokens** (a speculative verify step's shape; in continuous batching, the short prompts and
  the last chunks of chunked prefills) run the same way through a ``DecodeWrapper(q_len=n)`` per token count
  ``n``, causal within the new tokens, where its work tile holds them (``G * n <= 64`` query rows,
  :func:`kvsplit.kernels.limits.heads_fit`);
- **longer prefill and chunked-prefill rows** of the same step run through transformers' own ``sdpa`` function on
  the keys and values its cache read back, with its mask, so mixed steps work;
- calls outside continuous batching (a plain ``generate``) go to transformers' own ``sdpa`` unchanged.

The hooks (transformers has no public one that hands an attention function the paged cache; see
docs/guides/engine-integration-transformers.md):

1. ``AttentionInterface.register(key, ...)`` with the key continuous batching runs sdpa under
   (:func:`attention_key`): ``sdpa`` on 5.2x (which accepts only ``paged|eager``, ``sdpa`` or a flash
   implementation and refuses a new name, but honours a function registered under the existing key),
   ``paged|sdpa`` on 5.17. It receives q as ``[1, H_q, total_q_tokens, D]`` with ``cu_seq_lens_q``,
   ``read_index`` / ``write_index`` etc. in its keyword arguments.
2. ``ContinuousBatchingIOs.prepare_batch_tensors`` is wrapped: after transformers' own code ran, the step's host
   metadata is taken from the host objects the scheduler already has (each request's query length and
   ``position_offset``, and its block ids from the full-attention allocator's ``block_table``): the kv_lens,
   kv_indptr and page ids of the decode rows cost no device-to-host copy.
3. In a step made only of rows kvsplit runs the keys and values are written to the cache as before, but not read back
   (transformers' own write-only path, an empty ``read_index``): kvsplit reads the pages itself, so the step does
   not copy every request's whole KV per layer. On 5.2x the model calls ``PagedAttentionCache.update`` before the
   attention function, so ``update`` is wrapped; on 5.17 the paged attention function calls it, here.

Paged cache layouts, both NHD pages ``[num_pages, page_size, H_kv, D]`` read in place (no copy; contiguous views
with the NHD strides):

- 5.2x (``cache_allocators.FullAttentionCacheAllocator``): one uint8 tensor viewed per layer as pages of
  ``page_size`` tokens, keys and values of a layer in two views of the same storage
  (``get_cache_for_block_table``); a request's block ``b`` is page ``b * pages_stride`` of its layer's views,
  ``pages_stride = block_physical_stride // page_size`` (as transformers' ``fill_block_table`` computes it);
- 5.17 (``cache_manager.FullAttentionCacheAllocator``): one key and one value tensor per layer of a group,
  ``[(num_blocks + 2) * block_size, H_kv, D]``, viewed as pages of ``block_size`` tokens; block ``b`` is page ``b``.

Limits: full-attention layers only (a model with sliding-window, MLA, attention sinks or logit soft-capping runs
transformers' own ``sdpa`` everywhere); synchronous batching only (``use_async_batching=False``; asynchronous
batching prepares step N+1 while step N runs, and is refused with a ``RuntimeError`` at its first step); eager
mode only (no CUDA-graph capture of the decode path: transformers builds its block-table fast path for flash
only); another ``decoder`` runs q_len 1 rows only; ``head_dim`` 64, 128 or 256,
``page_size`` <= 256, float16 / bfloat16 (float32 for CPU tests). ``DecodeWrapper.plan`` validates its inputs
from the step's host copies of kv_indptr, kv_lens and the page ids (no copy back from the device, no wait for it).
"""

from __future__ import annotations

import itertools
import math
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..limits import HEAD_DIMS, MAX_PAGE_SIZE, MAX_Q_LEN, heads_fit
from ..wrapper import DecodeWrapper

__all__ = [
    "TESTED_TRANSFORMERS",
    "KvsplitAttention",
    "attention_key",
    "continuous_batching_config",
    "import_transformers",
    "install",
    "installed",
]

TESTED_TRANSFORMERS = ">=5.17,<5.26"
_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}

_lock = threading.Lock()
_handle: KvsplitAttention | None = None


def import_transformers():
    """Import ``transformers`` (and the hub ``kernels`` package it requires) even from a kvsplit source checkout.

    transformers 5.x imports a distribution named ``kernels``; a source checkout of kvsplit has a top-level
    ``kernels/`` folder (installed as ``kvsplit.kernels``), which shadows it when the checkout's root is on
    ``sys.path`` (``python`` started there, or pytest's rootdir insertion). The checkout's root is left out of
    ``sys.path`` while transformers and ``kernels`` are first imported, then put back.

    Raises
    ------
    ImportError
        transformers is not installed (install ``kvsplit[transformers]``).
    """
    import importlib
    import os
    import sys

    if "transformers" in sys.modules and "kernels" in sys.modules:
        return sys.modules["transformers"]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the folder above kernels/
    saved = list(sys.path)
    shadow = [p for p in sys.path if os.path.abspath(p or os.getcwd()) == root]
    try:
        if shadow:
            sys.path[:] = [p for p in sys.path if p not in shadow]
            stale = sys.modules.get("kernels")
            if stale is not None and os.path.dirname(
                os.path.abspath(getattr(stale, "__file__", "") or "")
            ) == os.path.join(root, "kernels"):
                del sys.modules["kernels"]
        try:
            importlib.import_module("kernels")
        except ImportError:
            pass  # transformers runs without hub kernels
        transformers = importlib.import_module("transformers")
        importlib.import_module("transformers.integrations.hub_kernels")
    except ImportError as e:
        raise ImportError(
            f"kvsplit's transformers integration needs transformers{TESTED_TRANSFORMERS} "
            f"(pip install 'kvsplit[transformers]'): {e}"
        ) from e
    finally:
        sys.path[:] = saved
    return transformers


class _Allocators:
    """transformers 5.2x: one ``FullAttentionCacheAllocator`` per attention type, pages of a uint8 cache tensor
    viewed per layer (``get_cache_for_block_table``); ``PagedAttentionCache.update(k, v, layer_idx, kwargs)`` is
    called by the model before the attention function (registered as ``sdpa``)."""

    attn_key = "sdpa"

    def __init__(self) -> None:
        from transformers.generation.continuous_batching.cache_allocators import FullAttentionCacheAllocator
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        self.full, self.own = FullAttentionCacheAllocator, sdpa_attention_forward

    def full_allocs(self, cache):
        return [a for a in cache.cache_allocators.values() if type(a) is self.full]

    def layer_full(self, cache, layer_idx):
        return type(cache.layer_to_allocator[layer_idx]) is self.full

    def head_dim(self, cache, full):
        return full.head_dim

    def page_size(self, full):
        return full.tokens_per_page

    def pages_stride(self, full):  # as transformers' fill_block_table for flash
        return full.block_physical_stride // full.tokens_per_page

    def page_views(self, cache, layer_idx):
        return cache.layer_to_allocator[layer_idx].get_cache_for_block_table(layer_idx)


class _Managers:
    """transformers 5.17: ``group_cache_managers`` with one key and one value tensor per layer of a group,
    ``[(num_blocks + 2) * block_size, H_kv, D]``; the paged attention function (registered as ``paged|sdpa``) gets
    the cache in its keyword arguments and calls ``update(k, v, layer_idx, read_index, write_index)`` itself."""

    attn_key = "paged|sdpa"

    def __init__(self) -> None:
        from transformers.generation.continuous_batching.cache_manager import FullAttentionCacheAllocator
        from transformers.integrations.sdpa_paged import sdpa_attention_paged_forward

        self.full, self.own = FullAttentionCacheAllocator, sdpa_attention_paged_forward

    def full_allocs(self, cache):
        return [a for a in cache.group_cache_managers if type(a) is self.full]

    def layer_full(self, cache, layer_idx):
        g, _ = cache.layer_index_to_group_indices[layer_idx]
        return cache.sliding_windows.get(layer_idx, 1) == 1 and type(cache.group_cache_managers[g]) is self.full

    def head_dim(self, cache, full):
        return cache.head_dim

    def page_size(self, full):
        return full.block_size

    def pages_stride(self, full):
        return 1

    def page_views(self, cache, layer_idx):
        _, i = cache.layer_index_to_group_indices[layer_idx]
        shape = (-1, cache.block_size, cache.num_key_value_heads, cache.head_dim)
        return cache.key_cache[i].view(shape), cache.value_cache[i].view(shape)


def _tf():
    """transformers' modules this adapter touches (imported here only), and its cache layout."""
    import inspect

    import_transformers()
    from transformers import AttentionInterface
    from transformers.generation.continuous_batching import cache as cb_cache
    from transformers.generation.continuous_batching import input_outputs as cb_io
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    params = inspect.signature(cb_cache.PagedAttentionCache.update).parameters
    if "kwargs" in params:
        layout = _Allocators()
    elif "read_index" in params:
        layout = _Managers()
    else:  # pragma: no cover - depends on the install
        import transformers

        raise ImportError(
            f"transformers {transformers.__version__}: its continuous-batching cache is neither of the "
            f"layouts kvsplit knows (tested: transformers{TESTED_TRANSFORMERS})"
        )
    return AttentionInterface, cb_cache, cb_io, layout, sdpa_attention_forward


@dataclass
class _Rows:
    """The step's requests with ``q_len`` query tokens each, run by one DecodeWrapper(q_len=q_len)."""

    q_len: int
    tok: np.ndarray  # int64 [B * q_len]: the token rows in q of request b's tokens, at b * q_len ..
    kv_indptr: np.ndarray  # int32 [B + 1] page offsets
    kv_indices: np.ndarray  # int32 [kv_indptr[-1]] page ids in the layer's NHD page views
    kv_lens: np.ndarray  # int32 [B] tokens in cache (the step's q_len new tokens included)

    @property
    def num_requests(self) -> int:
        return int(self.kv_lens.shape[0])


@dataclass
class _Step:
    """Host metadata of one continuous-batching forward pass, taken when transformers prepared it."""

    serial: int
    cu_q_ptr: int  # data_ptr of the IO's cu_seq_lens_q storage: the step's identity in the forward
    cache: Any  # transformers' PagedAttentionCache
    total_q: int  # query tokens of the real requests (the forward may pad beyond)
    rows: dict[int, _Rows]  # q_len -> the requests kvsplit runs (q_len 1: the decode rows)
    other_tok: np.ndarray  # int64: token rows of the requests sdpa runs (longer prefill / chunked-prefill rows)
    max_requests: int  # the engine's max_requests_per_batch
    device_arrays: dict = field(default_factory=dict)
    planned: set = field(default_factory=set)

    @property
    def num_kvsplit(self) -> int:
        """Query tokens kvsplit runs in this step."""
        return sum(int(r.tok.shape[0]) for r in self.rows.values())

    @property
    def kvsplit_only(self) -> bool:
        """Every query token of the step is kvsplit's (the cache read-back is skipped)."""
        return bool(self.rows) and self.other_tok.shape[0] == 0


class KvsplitAttention:
    """The installed integration (see the module doc): the DecodeWrappers and the patched functions.

    Parameters
    ----------
    table : PolicyTable or PlanClient, optional
        Tuned policies for DecodeWrapper (its ``table=``); None: DecodeWrapper's own default policy.
    max_batch_size : int, optional
        DecodeWrapper's ``max_batch_size``; default: the continuous-batching ``max_requests_per_batch``.
    decoder : callable, optional
        ``decoder(num_qo_heads, num_kv_heads, head_dim, page_size, dtype, device, max_batch_size)`` returning an
        object with ``plan(kv_indptr, kv_indices, kv_lens)`` and ``run(q, k_cache, v_cache)`` shaped as
        DecodeWrapper's (int32 device tensors; q ``[B, H_q, D]``, caches ``[num_pages, page_size, H_kv, D]``).
        Default: a :class:`DecodeWrapper` with ``table``. Another decode kernel (FlashInfer's, in
        bench/engine_decode.py) plugs in the same hooks for a like-for-like comparison.

    Attributes
    ----------
    stats : dict[str, int]
        ``steps`` (forward passes with rows kvsplit runs), ``plans`` (DecodeWrapper.plan calls: one per step and
        token count), ``decode_layers`` (DecodeWrapper.run calls), ``decode_rows`` (q_len-1 rows run by kvsplit,
        summed over layers), ``verify_rows`` (query tokens of the 2-8-token rows run by kvsplit, summed over
        layers), ``sdpa_layers`` (layer calls that ran transformers' sdpa on prefill rows or everything),
        ``reads_skipped`` (layer calls of steps made only of kvsplit's rows, whose cache read-back was skipped).
    """

    def __init__(self, table: Any = None, max_batch_size: int | None = None, decoder: Any = None) -> None:
        if max_batch_size is not None and (
            isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1
        ):
            raise ValueError(f"max_batch_size: expected an integer >= 1, got {max_batch_size!r}")
        self._ai, self._cb_cache, self._cb_io, self._layout, self._sdpa = _tf()
        if decoder is not None and not callable(decoder):
            raise ValueError(f"decoder: expected a callable, got {type(decoder).__name__}")
        self.table = table
        self.max_batch_size = max_batch_size
        self.decoder = decoder
        self.wrappers: dict[tuple, Any] = {}
        self.stats = dict(
            steps=0, plans=0, decode_layers=0, decode_rows=0, verify_rows=0, sdpa_layers=0, reads_skipped=0
        )
        self._serial = itertools.count(1)
        self._step: _Step | None = None
        self._eligible: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()
        self._saved: dict[str, Any] = {}

    @property
    def attn_key(self) -> str:
        """The AttentionInterface key the integration takes over: ``sdpa`` (5.2x) or ``paged|sdpa`` (5.17)."""
        return self._layout.attn_key

    # ------------------------------------------------------------------ install / uninstall
    def _patch(self) -> None:
        io_cls, cache_cls, lay = self._cb_io.ContinuousBatchingIOs, self._cb_cache.PagedAttentionCache, self._layout
        self._saved = dict(attn=self._ai()[lay.attn_key], prepare=io_cls.prepare_batch_tensors, update=cache_cls.update)
        orig_prepare, orig_update = self._saved["prepare"], self._saved["update"]
        me = self

        def prepare_batch_tensors(io, requests_in_batch, *args, **kwargs):
            out = orig_prepare(io, requests_in_batch, *args, **kwargs)
            me._record_step(io)
            return out

        prepare_batch_tensors.__wrapped__ = orig_prepare
        io_cls.prepare_batch_tensors = prepare_batch_tensors
        if isinstance(lay, _Allocators):  # the model calls update() before the attention function

            def update(cache, key_states, value_states, layer_idx, kwargs):
                step = me._current(kwargs, cache)
                if (
                    step is not None
                    and step.kvsplit_only
                    and me._layer_ok(cache, layer_idx)
                    and kwargs.get("block_table") is None
                ):
                    # write the step's new keys/values as transformers does, skip the read-back (kvsplit reads
                    # the pages)
                    kwargs["read_index"] = [r[:0] for r in kwargs["read_index"]]
                    me.stats["reads_skipped"] += 1
                return orig_update(cache, key_states, value_states, layer_idx, kwargs)

            update.__wrapped__ = orig_update
            cache_cls.update = update
        self._ai.register(lay.attn_key, self.attention)

    def uninstall(self) -> None:
        """Restore transformers' own ``sdpa`` function, ``prepare_batch_tensors`` and ``update``."""
        global _handle
        with _lock:
            if not self._saved:
                return
            self._cb_io.ContinuousBatchingIOs.prepare_batch_tensors = self._saved["prepare"]
            self._cb_cache.PagedAttentionCache.update = self._saved["update"]
            self._ai.register(self._layout.attn_key, self._saved["attn"])
            self._saved = {}
            if _handle is self:
                _handle = None

    # ------------------------------------------------------------------ step metadata (host)
    def _cache_reason(self, cache: Any) -> str | None:
        """Why this cache's model cannot run kvsplit's decode (None: it can). Checked once per cache."""
        if cache in self._eligible:
            return self._eligible[cache]
        cfg, lay = cache.config, self._layout
        full = lay.full_allocs(cache)
        reason = None
        if not full:
            reason = "no full-attention layer"
        elif lay.head_dim(cache, full[0]) not in HEAD_DIMS:
            reason = f"head_dim {lay.head_dim(cache, full[0])} not in {HEAD_DIMS}"
        elif cache.dtype not in _DTYPES:
            reason = f"cache dtype {cache.dtype} not float16/bfloat16/float32"
        elif getattr(cfg, "attn_logit_softcapping", None) is not None:
            reason = "attention logit soft-capping"
        elif lay.page_size(full[0]) > MAX_PAGE_SIZE:
            reason = f"page_size {lay.page_size(full[0])} above {MAX_PAGE_SIZE}"
        self._eligible[cache] = reason
        return reason

    def _layer_ok(self, cache: Any, layer_idx: int) -> bool:
        return self._cache_reason(cache) is None and self._layout.layer_full(cache, layer_idx)

    def _record_step(self, io: Any) -> None:
        """After transformers prepared a step: each kvsplit row's kv_len and page ids from its host state, grouped
        by query tokens (1 to the most a work tile holds; another ``decoder``: 1), the other rows for sdpa."""
        cache = io.cache
        if self._cache_reason(cache) is not None:
            self._step = None
            return
        full = self._layout.full_allocs(cache)[0]
        ps, pages_stride = self._layout.page_size(full), self._layout.pages_stride(full)
        cfg = cache.config
        h_q = int(cfg.num_attention_heads)
        h_kv = int(getattr(cfg, "num_key_value_heads", None) or h_q)
        groups: dict[int, tuple[list, list, list, list]] = {}
        other_tok: list[int] = []
        row = 0
        for fs in io.requests_in_batch:
            q_len = fs.query_length
            if q_len == 1 or (self.decoder is None and q_len <= MAX_Q_LEN and heads_fit(1, h_q, h_kv, q_len)):
                kv_len = fs.state.position_offset  # past + this step's q_len tokens (prepare_batch_tensors advanced it)
                n = -(-kv_len // ps)
                blocks = full.block_table[fs.state.request_id][:n]
                tok, lens, indptr, pages = groups.setdefault(q_len, ([], [], [0], []))
                tok.extend(range(row, row + q_len))
                lens.append(kv_len)
                pages.extend(b * pages_stride for b in blocks)
                indptr.append(len(pages))
            else:
                other_tok.extend(range(row, row + q_len))
            row += q_len
        self._step = _Step(
            serial=next(self._serial),
            cu_q_ptr=io.cumulative_seqlens_q.data_ptr(),
            cache=cache,
            total_q=row,
            rows={
                q: _Rows(
                    q_len=q,
                    tok=np.asarray(tok, np.int64),
                    kv_indptr=np.asarray(indptr, np.int32),
                    kv_indices=np.asarray(pages, np.int32),
                    kv_lens=np.asarray(lens, np.int32),
                )
                for q, (tok, lens, indptr, pages) in sorted(groups.items())
            },
            other_tok=np.asarray(other_tok, np.int64),
            max_requests=int(io.max_requests_per_batch or 1),
        )

    def _current(self, kwargs: dict, cache: Any = None) -> _Step | None:
        """The step these forward kwargs belong to, or None (not a paged call, or a model kvsplit does not run)."""
        step = self._step
        cu_q = kwargs.get("cu_seq_lens_q")
        if step is None or cu_q is None or "read_index" not in kwargs:
            return None
        if cu_q.data_ptr() != step.cu_q_ptr or (cache is not None and cache is not step.cache):
            raise RuntimeError(
                "kvsplit's transformers integration: this forward pass is not the step transformers "
                "prepared last (asynchronous batching?); run continuous batching with "
                "ContinuousBatchingConfig(use_async_batching=False)"
            )
        return step

    # ------------------------------------------------------------------ the attention function
    def _wrapper(
        self,
        h_q: int,
        h_kv: int,
        d: int,
        ps: int,
        dtype: torch.dtype,
        device: torch.device,
        max_batch: int,
        q_len: int = 1,
    ) -> Any:
        key = (h_q, h_kv, d, ps, dtype, device, q_len)
        w = self.wrappers.get(key)
        if w is None:
            if self.decoder is not None:
                w = self.decoder(h_q, h_kv, d, ps, dtype, device, max_batch)
            else:
                w = DecodeWrapper(
                    h_q,
                    h_kv,
                    d,
                    page_size=ps,
                    dtype=_DTYPES[dtype],
                    device=device,
                    max_batch_size=max_batch,
                    table=self.table,
                    q_len=q_len,
                )
            self.wrappers[key] = w
        return w

    def _device_arrays(self, step: _Step, device: torch.device) -> dict[Any, Any]:
        """The step's index arrays on ``device``: ``{q_len: {name: tensor}, "other_tok": tensor}``, uploaded once
        per step (host -> device; no device -> host copy)."""
        arrs = step.device_arrays.get(device)
        if arrs is None:

            def up(a: np.ndarray) -> torch.Tensor:
                return torch.from_numpy(a).to(device, non_blocking=True)

            arrs = {
                q: {name: up(getattr(r, name)) for name in ("kv_indptr", "kv_indices", "kv_lens", "tok")}
                for q, r in step.rows.items()
            }
            arrs["other_tok"] = up(step.other_tok)
            step.device_arrays[device] = arrs
        return arrs

    def attention(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None = None,
        **kwargs: Any,
    ):
        """transformers' attention-function signature (registered as ``sdpa``; ``paged|sdpa`` on 5.17).

        Parameters
        ----------
        module : the attention module (``layer_idx``, ``num_key_value_groups``)
        query : torch.Tensor ``[1, H_q, T, D]``; key, value : ``[1, H_kv, N, D]`` (what the cache read back;
            on 5.17 the step's new keys/values, written to the cache here)
        attention_mask : transformers' additive mask ``[1, 1, T, N]`` (used for the prefill rows only)
        scaling : softmax scale (default ``1/sqrt(D)``)

        Returns
        -------
        (torch.Tensor ``[1, T, H_q, D]``, None), as transformers' sdpa function.
        """
        managers = isinstance(self._layout, _Managers)  # 5.17: the cache comes in kwargs, updated here
        cache = kwargs.pop("cache", None) if managers else None
        step = self._current(kwargs, cache)
        layer_idx = getattr(module, "layer_idx", None)
        if step is None or not step.rows or layer_idx is None or not self._layer_ok(step.cache, layer_idx):
            self.stats["sdpa_layers"] += step is not None
            if managers:
                return self._layout.own(
                    module, query, key, value, attention_mask, scaling=scaling, cache=cache, **kwargs
                )
            return self._sdpa(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        if (
            hasattr(module, "sinks")
            or kwargs.get("softcap") is not None
            or kwargs.get("sliding_window")
            or kwargs.get("dropout", 0.0)
        ):
            raise RuntimeError(
                f"kvsplit's transformers integration: layer {layer_idx} asks for attention sinks, "
                "soft-capping, a sliding window or dropout, which its decode path does not run"
            )
        if query.dim() != 4 or query.shape[0] != 1 or query.shape[2] < step.total_q:
            raise RuntimeError(
                f"query: expected [1, H_q, >= {step.total_q}, D] for this step, got {tuple(query.shape)}"
            )
        _, h_q, t, d = query.shape
        if managers:  # write the step's keys/values; read the cache back only for sdpa's rows
            read = kwargs["read_index"]
            if step.kvsplit_only:
                read = [r[:0] for r in read]
                self.stats["reads_skipped"] += 1
            key, value = cache.update(
                key_states=key,
                value_states=value,
                layer_idx=layer_idx,
                read_index=read,
                write_index=kwargs["write_index"],
            )
            key, value = (x.transpose(0, 1).unsqueeze(0) for x in (key, value))
        k_pages, v_pages = self._layout.page_views(step.cache, layer_idx)
        ps, h_kv = k_pages.shape[1], k_pages.shape[2]
        dev = query.device
        arrs = self._device_arrays(step, dev)
        if not step.planned:
            self.stats["steps"] += 1
        out = None
        rescale = scaling is not None and not math.isclose(scaling, d**-0.5, rel_tol=1e-12)
        for q_len, rows in step.rows.items():
            a = arrs[q_len]
            max_batch = self.max_batch_size or max(rows.num_requests, step.max_requests)
            w = self._wrapper(h_q, h_kv, d, ps, k_pages.dtype, dev, max_batch, q_len)
            if id(w) not in step.planned:  # once per step and wrapper: every layer of the step reuses the plan
                if isinstance(w, DecodeWrapper):  # the step's host copies: no copy back from the device, no wait
                    w.plan(
                        a["kv_indptr"],
                        a["kv_indices"],
                        a["kv_lens"],
                        kv_lens_host=rows.kv_lens,
                        kv_indptr_host=rows.kv_indptr,
                        kv_indices_host=rows.kv_indices,
                    )
                else:
                    w.plan(a["kv_indptr"], a["kv_indices"], a["kv_lens"])
                step.planned.add(id(w))
                self.stats["plans"] += 1
            # the rows' queries [B * q_len, H_q, D]; a scale other than DecodeWrapper's 1/sqrt(D) is folded into q
            q_rows = query[0].index_select(1, a["tok"]).transpose(0, 1)
            if rescale:
                q_rows = q_rows * (scaling * math.sqrt(d))
            o_rows = w.run(q_rows.to(k_pages.dtype).contiguous(), k_pages, v_pages)
            self.stats["decode_layers"] += 1
            self.stats["decode_rows" if q_len == 1 else "verify_rows"] += int(rows.tok.shape[0])
            if step.kvsplit_only and len(step.rows) == 1 and t == rows.tok.shape[0]:
                return o_rows.to(query.dtype).unsqueeze(0), None
            if out is None:
                out = query.new_zeros((1, t, h_q, d))  # rows of padding tokens (static shapes) stay zero
            out[0].index_copy_(0, a["tok"], o_rows.to(query.dtype))
        if not step.kvsplit_only:  # the other rows: transformers' own sdpa over the keys/values it read back
            rows = arrs["other_tok"]
            mask = attention_mask.index_select(2, rows) if attention_mask is not None else None
            o_pre, _ = self._sdpa(
                module, query.index_select(2, rows), key, value, mask, scaling=scaling, **{**kwargs, "is_causal": False}
            )
            out[0].index_copy_(0, rows, o_pre[0])
            self.stats["sdpa_layers"] += 1
        return out, None


def install(table: Any = None, *, max_batch_size: int | None = None, decoder: Any = None) -> KvsplitAttention:
    """Make kvsplit the decode attention of transformers' continuous batching (module doc).

    Parameters
    ----------
    table : PolicyTable or PlanClient, optional
        Passed to every :class:`~kvsplit.kernels.wrapper.DecodeWrapper` (``table=``): the tuned policy for each
        step's bucket. None: DecodeWrapper's default policy.
    max_batch_size : int, optional
        DecodeWrapper's ``max_batch_size`` (default: the engine's ``max_requests_per_batch``).
    decoder : callable, optional
        Another decode kernel behind the same hooks (:class:`KvsplitAttention`); default DecodeWrapper.

    Returns
    -------
    KvsplitAttention
        The handle: ``uninstall()``, ``stats``, ``wrappers``. A second ``install()`` first uninstalls the previous
        handle.

    Raises
    ------
    ImportError
        transformers is not installed.
    ValueError
        ``max_batch_size`` is not an integer >= 1; ``decoder`` is not callable.
    """
    global _handle
    handle = KvsplitAttention(table=table, max_batch_size=max_batch_size, decoder=decoder)
    if _handle is not None:
        _handle.uninstall()
    with _lock:
        handle._patch()
        _handle = handle
    return handle


def continuous_batching_config(page_size: int = 16, **kwargs: Any):
    """A ``ContinuousBatchingConfig`` that runs with kvsplit on the tested transformers versions.

    Synchronous batching, no CUDA graphs, no automatic switch to flash attention (5.2x's
    ``auto_switch_to_flash``), ``page_size`` tokens per page (``block_size`` on 5.17); ``kwargs`` are passed on
    (and override these).

    Raises
    ------
    ValueError
        ``page_size`` is not an integer in [1, 256].
    """
    import inspect

    if isinstance(page_size, bool) or not isinstance(page_size, int) or not 1 <= page_size <= MAX_PAGE_SIZE:
        raise ValueError(f"page_size: expected an integer in [1, {MAX_PAGE_SIZE}], got {page_size!r}")
    import_transformers()
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    names = inspect.signature(ContinuousBatchingConfig).parameters
    kw: dict[str, Any] = dict(use_async_batching=False, use_cuda_graph=False)
    if "auto_switch_to_flash" in names:
        kw["auto_switch_to_flash"] = False
    kw["page_size" if "page_size" in names else "block_size"] = page_size
    kw.update(kwargs)
    return ContinuousBatchingConfig(**kw)


def attention_key() -> str:
    """The AttentionInterface key continuous batching runs sdpa under on the installed transformers: ``sdpa``
    (5.2x) or ``paged|sdpa`` (5.17); :func:`install` takes it over."""
    return _tf()[3].attn_key


def installed() -> KvsplitAttention | None:
    """The installed handle, or None."""
    return _handle
