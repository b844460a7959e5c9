"""The fp32 torch reference of decode attention over a paged KV cache (docs/concepts/design.md §3).

Plain torch, one request at a time, fp32 math: the independent reference every kernel test compares
against. Importable without Triton; :mod:`kvsplit.kernels.decode` re-exports it.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["reference_decode_attention"]


def check_tensor(name: str, t: Any, *, ndim: int, device: torch.device | None = None) -> torch.Tensor:
    """``t`` itself when it is a ``torch.Tensor`` of ``ndim`` dimensions (on ``device`` when given).

    Raises ``TypeError`` (not a tensor) or ``ValueError`` (dimensions, device), naming ``name``.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    return t


def reference_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_lens: torch.Tensor,
    *,
    sm_scale: float | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch decode attention in fp32 math, one request at a time.

    Same layout and contract as :func:`decode_attention` (no plan): gathers each
    request's first kv_len tokens through its page list, repeats each KV head for
    its G query heads, and takes ``softmax(q k^T * sm_scale) v``. Returns ``o`` in
    q's dtype (and ``lse`` fp32, natural log). kv_len = 0 gives o = 0, lse = -inf.

    Raises
    ------
    TypeError
        An input that is not a tensor (naming it).
    ValueError
        Shapes that do not fit together (naming the argument): ``H_q`` not a
        multiple of the cache's ``H_kv``, head_dim or ``kv_indptr`` / ``kv_lens``
        lengths that disagree with ``q``, a request with fewer pages than its
        kv_len needs.
    """
    q = check_tensor("q", q, ndim=3)
    k_cache = check_tensor("k_cache", k_cache, ndim=4)
    v_cache = check_tensor("v_cache", v_cache, ndim=4)
    if tuple(k_cache.shape) != tuple(v_cache.shape):
        raise ValueError(f"v_cache: expected shape {tuple(k_cache.shape)} (k_cache's), got {tuple(v_cache.shape)}")
    B, H_q, D = q.shape
    _, page_size, H_kv, Dk = k_cache.shape
    if Dk != D:
        raise ValueError(f"k_cache: expected head_dim {D} (q's), got {Dk}")
    if H_kv < 1 or H_q % H_kv != 0:
        raise ValueError(f"q: H_q={H_q} must be a multiple of the cache's H_kv={H_kv}")
    for name, t, n in (("kv_indptr", kv_indptr, B + 1), ("kv_lens", kv_lens, B)):
        if tuple(check_tensor(name, t, ndim=1).shape) != (n,):
            raise ValueError(f"{name}: expected shape ({n},) for B={B}, got {tuple(t.shape)}")
    check_tensor("kv_indices", kv_indices, ndim=1)
    pages_of = (kv_indptr[1:] - kv_indptr[:-1]).to("cpu", torch.int64)
    short = kv_lens.to("cpu", torch.int64) > pages_of * page_size
    if bool(short.any()):
        b = int(torch.nonzero(short)[0, 0])
        raise ValueError(
            f"kv_lens: request {b} has kv_len {int(kv_lens[b])} but only {int(pages_of[b])} pages "
            f"of {page_size} tokens in kv_indptr"
        )
    G = H_q // H_kv
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    indptr = kv_indptr.tolist()
    lens = kv_lens.tolist()
    o = torch.zeros((B, H_q, D), dtype=torch.float32, device=q.device)
    lse = torch.full((B, H_q), float("-inf"), dtype=torch.float32, device=q.device)
    for b in range(B):
        L = int(lens[b])
        if L == 0:
            continue
        pages = kv_indices[indptr[b] : indptr[b + 1]].long()
        k = k_cache[pages].reshape(-1, H_kv, D)[:L].float()  # [L, H_kv, D]
        v = v_cache[pages].reshape(-1, H_kv, D)[:L].float()
        k = k.repeat_interleave(G, dim=1)  # [L, H_q, D]
        v = v.repeat_interleave(G, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[b].float(), k) * scale  # [H_q, L]
        lse[b] = torch.logsumexp(scores, dim=-1)
        o[b] = torch.einsum("hl,lhd->hd", torch.softmax(scores, dim=-1), v)
    o = o.to(q.dtype)
    if return_lse:
        return o, lse
    return o
