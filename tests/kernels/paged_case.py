"""Random paged-KV decode batches for kernel tests (NaN in every slot no request owns), and the check of a plan's
output against the fp32 reference on one."""

from __future__ import annotations

import math

import torch

TOL = {torch.float32: 2e-5, torch.float16: 5e-3}
"""Max |o - reference| of the CPU interpreter's kernel per dtype."""


def check_decode(case, plan, dtype):
    """Run ``plan`` on ``case`` (:func:`make_case`) with the LSE and compare with the fp32 reference: dtype and
    shape, no NaN, max |o - ref| below :data:`TOL`, the same infinite LSEs (-inf), finite ones within 1e-3.
    Returns the output."""
    from kvsplit.kernels.decode import decode_attention, reference_decode_attention

    o, lse = decode_attention(**case, plan=plan, return_lse=True)
    ref, ref_lse = reference_decode_attention(**case, return_lse=True)
    assert o.dtype == dtype and o.shape == case["q"].shape
    assert not torch.isnan(o).any(), "NaN reached the output"
    err = (o.float() - ref.float()).abs().max().item()
    assert err < TOL[dtype], f"max |o - ref| = {err}"
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert torch.all(lse[~finite] == float("-inf"))
    if finite.any():
        assert (lse[finite] - ref_lse[finite]).abs().max().item() < 1e-3
    return o


def make_case(
    lens,
    *,
    num_qo_heads,
    num_kv_heads,
    head_dim,
    page_size,
    dtype,
    device="cpu",
    seed=0,
    extra_pages=3,
    poison=True,
    shuffle=True,
    q_len=1,
):
    """Build q (``[len(lens) * q_len, H_q, D]``), a paged NHD cache and the page table for ``lens``.

    Pages are handed out in a shuffled order (with ``extra_pages`` spare pages);
    with ``poison`` every token slot that no request owns (the tail of a request's
    last page, spare pages) holds NaN, so a kernel that loads outside kv_len fails.
    """
    g = torch.Generator().manual_seed(seed)
    pages_per = [-(-int(n) // page_size) for n in lens]
    num_pages = sum(pages_per) + extra_pages
    order = torch.randperm(num_pages, generator=g) if shuffle else torch.arange(num_pages)
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    fill = float("nan") if poison else 0.0
    k = torch.full(shape, fill, dtype=torch.float32)
    v = torch.full(shape, fill, dtype=torch.float32)
    indptr, indices = [0], []
    for n, p in zip(lens, pages_per):
        ids = order[len(indices) : len(indices) + p].tolist()
        for j, pid in enumerate(ids):
            used = min(page_size, int(n) - j * page_size)
            k[pid, :used] = torch.randn((used, num_kv_heads, head_dim), generator=g)
            v[pid, :used] = torch.randn((used, num_kv_heads, head_dim), generator=g)
        indices += ids
        indptr.append(len(indices))
    q = torch.randn((len(lens) * q_len, num_qo_heads, head_dim), generator=g)
    to = dict(device=device, dtype=dtype)
    return dict(
        q=q.to(**to),
        k_cache=k.to(**to),
        v_cache=v.to(**to),
        kv_indptr=torch.tensor(indptr, dtype=torch.int32, device=device),
        kv_indices=torch.tensor(indices, dtype=torch.int32, device=device),
        kv_lens=torch.tensor([int(n) for n in lens], dtype=torch.int32, device=device),
    )


def reference_verify(q, k_cache, v_cache, kv_indptr, kv_indices, kv_lens, *, q_len, k_scale=None, v_scale=None):
    """fp32 reference of q_len-token attention (speculative-decoding verify steps) over a paged cache, written
    for the tests independently of the kernel: q ``[B * q_len, H_q, D]``; the cache dequantized as
    ``k_cache.float() * k_scale`` (a float or a ``[H_kv]`` tensor; likewise v); token j of request b sees the
    positions ``[0, kv_lens[b] - q_len + j]``. Returns (o fp32 ``[B * q_len, H_q, D]``, lse fp32 natural log)."""
    rows, H_q, D = q.shape
    _, page_size, H_kv, _ = k_cache.shape
    G = H_q // H_kv

    def scale_of(s):
        if s is None:
            return torch.ones(H_kv)
        if isinstance(s, torch.Tensor):
            return s.detach().float().cpu()
        return torch.full((H_kv,), float(s))

    ks, vs = scale_of(k_scale), scale_of(v_scale)
    o = torch.zeros((rows, H_q, D), dtype=torch.float32)
    lse = torch.full((rows, H_q), float("-inf"), dtype=torch.float32)
    indptr, lens = kv_indptr.tolist(), kv_lens.tolist()
    k_all, v_all, q = k_cache.cpu(), v_cache.cpu(), q.cpu()
    for b in range(rows // q_len):
        L = int(lens[b])
        pages = kv_indices[indptr[b] : indptr[b + 1]].long().cpu()
        k = k_all[pages].float().reshape(-1, H_kv, D)[:L] * ks[None, :, None]
        v = v_all[pages].float().reshape(-1, H_kv, D)[:L] * vs[None, :, None]
        k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)  # [L, H_q, D]
        for j in range(q_len):
            n = L - q_len + j + 1  # positions 0 .. L - q_len + j
            if n <= 0:
                continue
            scores = torch.einsum("hd,lhd->hl", q[b * q_len + j].float(), k[:n]) / math.sqrt(D)
            lse[b * q_len + j] = torch.logsumexp(scores, dim=-1)
            o[b * q_len + j] = torch.einsum("hl,lhd->hd", torch.softmax(scores, dim=-1), v[:n])
    return o, lse
