"""Decode-batch workloads: the reference study's synthetic length families.

docs/concepts/design.md §6: at a fixed total of ``T`` tokens,

- ``uniform``: every request holds T / B tokens;
- ``skewed40``, ``skewed60``, ``skewed80``: one request holds 40/60/80 % of T,
  the others share the rest equally;
- ``2x40``: two requests hold 40 % each, the others share the remaining 20 %
  (B >= 3).

Remainders are spread one token at a time over the first requests so the sum is
exactly T; heavy requests come first in the batch. B = 1 is one request of T
tokens for every family.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

import numpy as np

__all__ = [
    "MODEL_SHAPES",
    "FAMILIES",
    "REFERENCE_BATCH_SIZES",
    "REFERENCE_TOTALS",
    "family_kv_lens",
    "reference_cases",
    "JITTER",
    "jitter_lengths",
    "family_batches",
    "TRACES",
    "TraceSpec",
    "Trace",
    "load_trace",
    "Replay",
    "replay_trace",
    "auto_rate_scale",
    "iid_trace_batches",
    "trace_batches",
    "DEFAULT_STEP_S",
]

MODEL_SHAPES: dict[str, tuple[int, int, int]] = {
    "qwen3-30b-a3b": (32, 4, 128),
    "llama-3.1-8b": (32, 8, 128),
    "llama-3.1-70b-tp8": (8, 1, 128),
}
"""Model shape presets: name -> (H_q, H_kv, head_dim) per GPU (Llama-3.1-70B: 64/8 heads over 8 GPUs)."""

FAMILIES = ("uniform", "skewed40", "skewed60", "skewed80", "2x40")
REFERENCE_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
REFERENCE_TOTALS = (262_144, 1_048_576)


def _spread(total: int, n: int) -> np.ndarray:
    """``n`` near-equal non-negative integers summing to ``total`` (larger ones first)."""
    base, rem = divmod(total, n)
    out = np.full(n, base, dtype=np.int64)
    out[:rem] += 1
    return out


def family_kv_lens(family: str, batch_size: int, total_tokens: int) -> np.ndarray:
    """kv_lens ``[B]`` (int64) of one reference-family batch, heavy requests first.

    Raises
    ------
    ValueError
        Unknown ``family``; ``batch_size`` < 1, or 2 for ``2x40``;
        ``total_tokens`` < ``batch_size``.

    Notes
    -----
    ``2x40`` needs B >= 3; B = 1 gives one request of T tokens (every family) and
    B = 2 is rejected for ``2x40``.
    """
    if family not in FAMILIES:
        raise ValueError(f"family: expected one of {FAMILIES}, got {family!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
    if isinstance(total_tokens, bool) or not isinstance(total_tokens, (int, np.integer)) or total_tokens < batch_size:
        raise ValueError(f"total_tokens: expected an integer >= batch_size ({batch_size}), got {total_tokens!r}")
    B, T = int(batch_size), int(total_tokens)
    if B == 1:
        return np.array([T], dtype=np.int64)
    if family == "uniform":
        return _spread(T, B)
    if family == "2x40":
        if B < 3:
            raise ValueError(f"batch_size: family '2x40' needs B >= 3 (or B == 1), got {B}")
        heavy = (4 * T) // 10
        rest = T - 2 * heavy
        return np.concatenate([[heavy, heavy], _spread(rest, B - 2)]).astype(np.int64)
    share = {"skewed40": 4, "skewed60": 6, "skewed80": 8}[family]
    heavy = (share * T) // 10
    return np.concatenate([[heavy], _spread(T - heavy, B - 1)]).astype(np.int64)


def reference_cases(total_tokens: int) -> list[tuple[str, int]]:
    """The 48 (family, B) cases of the reference workload, as in the H200 anchors.

    Every family at B in {1, 2, 4, ..., 512}, except ``2x40`` which starts at B = 4.
    """
    return [(fam, B) for fam in FAMILIES for B in REFERENCE_BATCH_SIZES if not (fam == "2x40" and B < 4)]


# ----------------------------------------------------------------------------
# Training / held-out draws around a family (docs/concepts/design.md §6)
# ----------------------------------------------------------------------------

JITTER = (0.9, 1.1)
"""Each length of a synthetic batch is multiplied by U(0.9, 1.1) (docs/concepts/design.md §6)."""

_ROLE_STREAM = {"train": 0, "heldout": 1}


def _role_rng(seed: int, role: str, *extra: int) -> np.random.Generator:
    if role not in _ROLE_STREAM:
        raise ValueError(f"role: expected 'train' or 'heldout', got {role!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected an integer >= 0, got {seed!r}")
    return np.random.default_rng([int(seed), _ROLE_STREAM[role], *extra])


def jitter_lengths(
    kv_lens: np.ndarray, rng: np.random.Generator, low: float = JITTER[0], high: float = JITTER[1]
) -> np.ndarray:
    """``round(kv_len * U(low, high))`` per request, at least 1 for a non-empty request.

    Returns int64 ``[B]``; zero lengths stay zero.
    """
    L = np.asarray(kv_lens, dtype=np.int64)
    f = rng.uniform(low, high, size=L.shape)
    out = np.rint(L * f).astype(np.int64)
    return np.where(L > 0, np.maximum(out, 1), 0)


def family_batches(
    family: str, batch_size: int, total_tokens: int, *, num_batches: int, seed: int = 0, role: str = "train"
) -> list[np.ndarray]:
    """``num_batches`` jittered draws around one family batch.

    Parameters
    ----------
    family, batch_size, total_tokens
        As :func:`family_kv_lens`.
    num_batches : int
        Draws to make (>= 1).
    seed : int
        Base seed; ``role`` picks an independent stream, so the ``train`` and
        ``heldout`` draws of one seed are different batches.
    role : str
        ``"train"`` or ``"heldout"``.

    Returns
    -------
    list of int64 arrays ``[B]``
    """
    base = family_kv_lens(family, batch_size, total_tokens)
    if isinstance(num_batches, bool) or not isinstance(num_batches, (int, np.integer)) or num_batches < 1:
        raise ValueError(f"num_batches: expected an integer >= 1, got {num_batches!r}")
    rng = _role_rng(seed, role)
    return [jitter_lengths(base, rng) for _ in range(int(num_batches))]


# ----------------------------------------------------------------------------
# Real traces (tuner/traces, README.md there: provenance, licences, sha256)
# ----------------------------------------------------------------------------

TRACE_DIR = Path(__file__).resolve().parent / "traces"


@dataclass(frozen=True)
class TraceSpec:
    """One shipped trace file: its columns and whether it has arrival times."""

    file: str
    prompt_col: str
    output_col: str
    time_col: str | None
    time_kind: str | None  # "datetime" (Azure) or "ms" (Mooncake)
    sha256: str
    doc: str


TRACES: dict[str, TraceSpec] = {
    "azure_code": TraceSpec(
        "azure_llm_2023_code.csv",
        "ContextTokens",
        "GeneratedTokens",
        "TIMESTAMP",
        "datetime",
        "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
        "Azure LLM inference trace 2023, code completion (Splitwise, ISCA'24; CC-BY-4.0)",
    ),
    "azure_conv": TraceSpec(
        "azure_llm_2023_conv.csv",
        "ContextTokens",
        "GeneratedTokens",
        "TIMESTAMP",
        "datetime",
        "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
        "Azure LLM inference trace 2023, conversation (Splitwise, ISCA'24; CC-BY-4.0)",
    ),
    "mooncake": TraceSpec(
        "mooncake_fast25_conversation.csv",
        "input_length",
        "output_length",
        "timestamp_ms",
        "ms",
        "1f49accad3e5065fd4a34570843775bf2d90099c45c12c6e4e5ca96054e9fde6",
        "Mooncake FAST'25 conversation trace (Kimi, 1 h; Apache-2.0), long context",
    ),
    "sharegpt": TraceSpec(
        "sharegpt_8k_llama2_lengths.csv",
        "num_prefill_tokens",
        "num_decode_tokens",
        None,
        None,
        "6d6c296302a853e2669a674a96f269283e60c57e60363bd450588a1066919f9f",
        "ShareGPT length statistics, Llama-2 tokens, total <= 8k (Etalon; lengths only, no times)",
    ),
    "arxiv": TraceSpec(
        "arxiv_summarization_llama2_lengths.csv",
        "num_prefill_tokens",
        "num_decode_tokens",
        None,
        None,
        "9d3580538d915ca75e4aaaa54590b42dbb17abc6d74c8913310cf07c232adcdc",
        "arXiv summarisation length statistics, Llama-2 tokens, total <= 4k (Vidur; lengths only)",
    ),
}
"""Shipped traces by name. Timed ones (Azure, Mooncake) are replayed with
continuous batching; length-only ones (ShareGPT, arXiv) are drawn i.i.d."""


@dataclass(frozen=True)
class Trace:
    """Requests of one trace, in arrival order.

    Attributes
    ----------
    name : str
    prompt : int64 ``[N]``
        Prompt tokens (kv_len when decoding starts).
    output : int64 ``[N]``
        Generated tokens (>= 1).
    arrival_s : float64 ``[N]`` or None
        Arrival time in seconds from the first request (None: no timestamps).
    """

    name: str
    prompt: np.ndarray
    output: np.ndarray
    arrival_s: np.ndarray | None


def _check_trace_name(name: str) -> TraceSpec:
    if name not in TRACES:
        raise ValueError(f"trace: unknown trace {name!r}; known: {sorted(TRACES)}")
    return TRACES[name]


@cache
def load_trace(name: str, *, verify: bool = False) -> Trace:
    """Read a shipped trace (cached). ``verify=True`` checks the file's sha256 first.

    Raises
    ------
    ValueError
        Unknown ``name``; a checksum mismatch (``verify``).
    FileNotFoundError
        The package was installed without its trace files.
    """
    import csv
    import datetime as dt
    import hashlib

    spec = _check_trace_name(name)
    path = TRACE_DIR / spec.file
    if verify:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != spec.sha256:
            raise ValueError(f"trace {name!r}: {path} has sha256 {digest}, expected {spec.sha256}")
    prompt: list[int] = []
    output: list[int] = []
    times: list[float] = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            prompt.append(int(row[spec.prompt_col]))
            output.append(int(row[spec.output_col]))
            if spec.time_kind == "ms":
                times.append(float(row[spec.time_col]) / 1000.0)
            elif spec.time_kind == "datetime":
                stamp = row[spec.time_col]
                head, _, frac = stamp.partition(".")
                t = dt.datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC)
                times.append(t.timestamp() + (float("0." + frac) if frac else 0.0))
    arr = None
    if times:
        a = np.asarray(times, dtype=np.float64)
        order = np.argsort(a, kind="stable")
        a = a[order] - a[order][0]
        prompt = list(np.asarray(prompt)[order])
        output = list(np.asarray(output)[order])
        arr = a
    p = np.asarray(prompt, dtype=np.int64)
    o = np.asarray(output, dtype=np.int64)
    for a_ in (p, o):
        a_.setflags(write=False)
    if arr is not None:
        arr.setflags(write=False)
    return Trace(name=name, prompt=p, output=o, arrival_s=arr)


DEFAULT_STEP_S = 0.025
"""Seconds per decode step assumed by the replay (one token per running request per step)."""


@dataclass(frozen=True)
class Replay:
    """Schedule of a trace replayed with continuous batching.

    ``start[i]``/``end[i]``: first decode step of request i and one past its
    last (-1/-1 if never admitted: its reservation exceeds the token budget);
    at step ``t`` with ``start <= t < end`` its kv_len is
    ``prompt + (t - start)`` (capped by ``max_kv_len``). ``running[t]``: batch
    size at step ``t``.
    """

    trace: Trace
    rate_scale: float
    max_batch_size: int
    token_budget: int | None
    max_kv_len: int | None
    start: np.ndarray
    end: np.ndarray
    running: np.ndarray

    def batch_at(self, step: int) -> np.ndarray:
        """kv_lens ``[B]`` (int64) of the decode batch at ``step``, in admission order."""
        live = np.flatnonzero((self.start <= step) & (step < self.end))
        live = live[np.argsort(self.start[live], kind="stable")]
        L = self.trace.prompt[live] + (step - self.start[live])
        if self.max_kv_len is not None:
            L = np.minimum(L, self.max_kv_len)
        return L.astype(np.int64)


def auto_rate_scale(trace: Trace, batch_size: int, *, step_s: float = DEFAULT_STEP_S, headroom: float = 1.25) -> float:
    """Arrival-rate multiplier that keeps a running batch of ``batch_size`` full.

    Little's law: concurrency = rate * mean decode time, with mean decode time
    ``mean(output) * step_s``; the trace's own rate gives only a few concurrent
    requests (docs/concepts/design.md §6). ``headroom`` > 1 overloads slightly so the batch
    stays at its cap.
    """
    if trace.arrival_s is None:
        raise ValueError(f"trace {trace.name!r} has no arrival times")
    span = float(trace.arrival_s[-1] - trace.arrival_s[0]) or 1.0
    rate = len(trace.prompt) / span
    concurrency = rate * float(trace.output.mean()) * step_s
    return headroom * batch_size / concurrency


def replay_trace(
    name: str | Trace,
    *,
    max_batch_size: int,
    rate_scale: float | None = None,
    token_budget: int | None = None,
    max_kv_len: int | None = None,
    step_s: float = DEFAULT_STEP_S,
) -> Replay:
    """Replay a timed trace's arrivals through a continuous-batching scheduler.

    Model (docs/concepts/design.md §6; tuner/traces/README.md "Building decode
    batches"): time advances in decode steps of ``step_s`` seconds; request
    ``i`` arrives at step ``floor(arrival_s[i] / rate_scale / step_s)`` and
    waits FCFS; at each step arrived requests are admitted while fewer than
    ``max_batch_size`` run and, with a ``token_budget``, while the reserved
    KV tokens (prompt + output of every running request) fit in it; an
    admitted request decodes one token per step for ``output`` steps (prefill
    is not modelled as a step).

    Parameters
    ----------
    name : str or Trace
        A timed trace of :data:`TRACES` (``azure_code``, ``azure_conv``,
        ``mooncake``), or a :class:`Trace` with arrival times.
    max_batch_size : int
        Most requests running at once (>= 1).
    rate_scale : float, optional
        Arrival-rate multiplier; default :func:`auto_rate_scale` for ``max_batch_size``.
    token_budget : int, optional
        KV-cache capacity in tokens (reservations of prompt + output).
    max_kv_len : int, optional
        Cap on kv_len (a model's context), applied to the batches.

    Returns
    -------
    Replay
    """
    import heapq
    from collections import deque

    if isinstance(name, Trace):
        tr = name
    else:
        _check_trace_name(name)
        tr = load_trace(name)
    if tr.arrival_s is None:
        raise ValueError(f"trace: {tr.name!r} has no arrival times; use iid_trace_batches")
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, (int, np.integer)) or max_batch_size < 1:
        raise ValueError(f"max_batch_size: expected an integer >= 1, got {max_batch_size!r}")
    if token_budget is not None and (
        isinstance(token_budget, bool) or not isinstance(token_budget, (int, np.integer)) or token_budget < 1
    ):
        raise ValueError(f"token_budget: expected an integer >= 1 or None, got {token_budget!r}")
    if max_kv_len is not None and (
        isinstance(max_kv_len, bool) or not isinstance(max_kv_len, (int, np.integer)) or max_kv_len < 1
    ):
        raise ValueError(f"max_kv_len: expected an integer >= 1 or None, got {max_kv_len!r}")
    if not (isinstance(step_s, (int, float)) and step_s > 0):
        raise ValueError(f"step_s: expected a number > 0, got {step_s!r}")
    if rate_scale is None:
        rate_scale = auto_rate_scale(tr, int(max_batch_size), step_s=step_s)
    if isinstance(rate_scale, bool) or not isinstance(rate_scale, (int, float)) or not (0 < rate_scale < 1e9):
        raise ValueError(f"rate_scale: expected a number > 0, got {rate_scale!r}")
    arrive = np.floor(tr.arrival_s / (rate_scale * step_s)).astype(np.int64)
    out = tr.output
    reserve = tr.prompt + tr.output
    N = len(arrive)
    start = np.full(N, -1, dtype=np.int64)
    end = np.full(N, -1, dtype=np.int64)
    budget = None if token_budget is None else int(token_budget)
    heap: list[tuple[int, int]] = []
    waiting: deque[int] = deque()
    used = 0
    t = 0
    p = 0
    maxb = int(max_batch_size)
    while p < N or waiting or heap:
        while heap and heap[0][0] <= t:
            _, i = heapq.heappop(heap)
            used -= int(reserve[i])
        while p < N and arrive[p] <= t:
            waiting.append(p)
            p += 1
        while waiting and len(heap) < maxb:
            i = waiting[0]
            if budget is not None and reserve[i] > budget:
                waiting.popleft()  # can never run
                continue
            if budget is not None and used + reserve[i] > budget:
                break
            waiting.popleft()
            start[i] = t
            end[i] = t + int(out[i])
            used += int(reserve[i])
            heapq.heappush(heap, (int(end[i]), i))
        nxt = []
        if heap:
            nxt.append(heap[0][0])
        if p < N:
            nxt.append(int(arrive[p]))
        if not nxt:
            break
        t = max(t + 1, min(nxt))
    horizon = int(end.max()) if (end >= 0).any() else 1
    delta = np.zeros(horizon + 1, dtype=np.int64)
    ok = start >= 0
    np.add.at(delta, start[ok], 1)
    np.add.at(delta, end[ok], -1)
    running = np.cumsum(delta)[:horizon]
    for a in (start, end, running):
        a.setflags(write=False)
    return Replay(tr, float(rate_scale), maxb, budget, max_kv_len, start, end, running)


def _pick_steps(running: np.ndarray, want_b: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` distinct, spread-out steps with a full batch (>= 90 % of ``want_b``), after warm-up."""
    horizon = running.shape[0]
    warm = horizon // 20
    thresh = max(1, int(np.ceil(0.9 * want_b)))
    elig = np.flatnonzero(running[warm:] >= thresh) + warm
    if elig.size < n:
        top = int(running.max()) if horizon else 0
        thresh = max(1, int(np.ceil(0.9 * top)))
        elig = np.flatnonzero(running >= thresh)
    if elig.size < n:
        raise ValueError(f"trace replay has only {elig.size} steps with a full batch; wanted {n} batches")
    # n strata over the eligible steps, one random step in each: spread out, reproducible
    edges = np.linspace(0, elig.size, n + 1).astype(np.int64)
    picks = np.array([elig[rng.integers(lo, max(lo + 1, hi))] for lo, hi in zip(edges[:-1], edges[1:])])
    return np.unique(picks)


def iid_trace_batches(
    name: str, batch_size: int, *, num_batches: int, seed: int = 0, role: str = "train", max_kv_len: int | None = None
) -> list[np.ndarray]:
    """i.i.d. decode batches from a trace's lengths (for length-only traces).

    Each request: a random row, ``kv_len = prompt + g`` with ``g ~ U{0..output-1}``
    (README "cheaper i.i.d. version"). ``role`` picks an independent stream.
    """
    tr = load_trace(name)
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
    if isinstance(num_batches, bool) or not isinstance(num_batches, (int, np.integer)) or num_batches < 1:
        raise ValueError(f"num_batches: expected an integer >= 1, got {num_batches!r}")
    rng = _role_rng(seed, role, 7)
    out = []
    for _ in range(int(num_batches)):
        rows = rng.integers(0, tr.prompt.shape[0], size=int(batch_size))
        g = rng.integers(0, tr.output[rows])
        L = tr.prompt[rows] + g
        if max_kv_len is not None:
            L = np.minimum(L, max_kv_len)
        out.append(L.astype(np.int64))
    return out


def trace_batches(
    name: str,
    batch_size: int,
    *,
    num_train: int,
    num_heldout: int,
    seed: int = 0,
    rate_scale: float | None = None,
    token_budget: int | None = None,
    max_batch_size: int | None = None,
    max_kv_len: int | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Training and held-out decode batches of about ``batch_size`` requests from a trace.

    Timed traces (Azure code/conv, Mooncake) are replayed with
    :func:`replay_trace` (``max_batch_size`` defaults to ``batch_size``, the
    rate scale to :func:`auto_rate_scale`) and sampled at distinct,
    spread-out steps with a full batch; the seeded shuffle of those steps
    gives the two sets (never the same batch). Length-only traces (ShareGPT,
    arXiv) are drawn i.i.d. with independent streams per role.

    Returns
    -------
    (train, heldout) : lists of int64 arrays
    """
    spec = _check_trace_name(name)
    if spec.time_col is None:
        return (
            iid_trace_batches(name, batch_size, num_batches=num_train, seed=seed, role="train", max_kv_len=max_kv_len),
            iid_trace_batches(
                name, batch_size, num_batches=num_heldout, seed=seed, role="heldout", max_kv_len=max_kv_len
            ),
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
    rep = _replay_cached(name, int(max_batch_size or batch_size), rate_scale, token_budget, max_kv_len)
    rng = np.random.default_rng([int(seed), 11])
    n = int(num_train) + int(num_heldout)
    steps = _pick_steps(rep.running, min(int(batch_size), rep.max_batch_size), n, rng)
    if steps.size < n:
        raise ValueError(f"trace {name!r}: could only find {steps.size} distinct full-batch steps, wanted {n}")
    steps = rng.permutation(steps)
    batches = [rep.batch_at(int(s)) for s in steps]
    return batches[:num_train], batches[num_train:]


@lru_cache(maxsize=16)
def _replay_cached(
    name: str, max_batch_size: int, rate_scale: float | None, token_budget: int | None, max_kv_len: int | None
) -> Replay:
    return replay_trace(
        name, max_batch_size=max_batch_size, rate_scale=rate_scale, token_budget=token_budget, max_kv_len=max_kv_len
    )


# ----------------------------------------------------------------------------
# Case sets: the batches the GPU benchmarks time (bench/gpu_sweep.py, bench/peers.py)
# ----------------------------------------------------------------------------

REFERENCE_SHAPE = dict(zip(("num_qo_heads", "num_kv_heads"), MODEL_SHAPES["qwen3-30b-a3b"][:2], strict=True))
"""H_q / H_kv of the reference workload (Qwen3-30B-A3B's attention; head_dim 128, bf16, page 16)."""

TRACE_EVAL_BATCH_SIZES = (8, 32, 128, 512, 1024)
"""Nominal B of the held-out trace batches of :func:`evaluation_cases` and :func:`trace_cases`."""


def _case(
    cases: list[dict],
    set_name: str,
    family: str,
    batch_size: int,
    total: int,
    kv_lens: np.ndarray,
    num_qo_heads: int = 32,
    num_kv_heads: int = 4,
) -> None:
    lens = [int(x) for x in kv_lens]
    cases.append(
        {
            "id": len(cases),
            "set": set_name,
            "family": family,
            "B": len(lens),
            "B_nominal": int(batch_size),
            "T": int(total),
            "num_qo_heads": int(num_qo_heads),
            "num_kv_heads": int(num_kv_heads),
            "kv_lens": lens,
        }
    )


def peer_reference_cases(total_tokens: int) -> list[tuple[str, int]]:
    """The 49 (family, B) cases per total of the peer comparison: :func:`reference_cases` plus ``2x40`` at
    B = 1 (one request of T tokens, the same batch as every family's B = 1), in the order of the H200 peer
    measurements (family by family, B ascending)."""
    cases = []
    for fam in FAMILIES:
        for B in REFERENCE_BATCH_SIZES:
            if fam == "2x40" and 1 < B < 4:
                continue
            cases.append((fam, B))
    return cases


def trace_cases(batch_sizes: tuple[int, ...] = TRACE_EVAL_BATCH_SIZES, *, seed: int = 0) -> list[dict]:
    """One held-out batch of every shipped trace at every nominal B of ``batch_sizes`` (``trace_batches(name, B,
    num_train=1, num_heldout=1, seed)``'s held-out batch), as case dicts of set ``trace`` (``T`` is the batch's
    own total). A (trace, B) for which the trace has no full-batch step is left out."""
    cases: list[dict] = []
    for name in TRACES:
        for B in batch_sizes:
            try:
                _, held = trace_batches(name, B, num_train=1, num_heldout=1, seed=seed)
            except ValueError:
                continue
            _case(cases, "trace", name, B, int(held[0].sum()), held[0])
    return cases


def evaluation_cases() -> list[dict]:
    """The 182 evaluation batches (never tuned on), in this order, ids 0..181:

    - ``ref`` (96): every (family, B) of :func:`reference_cases` at T = 262,144 and 1,048,576, H_q 32 / H_kv 4;
    - ``jitter`` (30): one held-out jittered draw (``family_batches(seed=7, role="heldout")``) per family at
      B 4 / 32 / 256 and both totals;
    - ``untuned`` (20): every family at B 24 / 96 / 384 / 1024, T = 524,288 (batch sizes and a total no
      training batch has);
    - ``llama8b`` (11): Llama-3.1-8B's H_kv 8 (H_q 32) on uniform / skewed80 / 2x40 at B 4 / 32 / 256, T =
      262,144, and uniform / skewed80 at B 16, T = 1,048,576;
    - ``trace`` (25): :func:`trace_cases`.

    Each case is a dict: ``id``, ``set``, ``family`` (or the trace's name), ``B`` (requests), ``B_nominal``,
    ``T`` (total tokens), ``num_qo_heads``, ``num_kv_heads``, ``kv_lens`` (list of int). Deterministic.
    """
    cases: list[dict] = []
    for T in REFERENCE_TOTALS:
        for fam, B in reference_cases(T):
            _case(cases, "ref", fam, B, T, family_kv_lens(fam, B, T))
    for T in REFERENCE_TOTALS:
        for fam in FAMILIES:
            for B in (4, 32, 256):
                _case(cases, "jitter", fam, B, T, family_batches(fam, B, T, num_batches=1, seed=7, role="heldout")[0])
    for fam in FAMILIES:
        for B in (24, 96, 384, 1024):
            _case(cases, "untuned", fam, B, 524_288, family_kv_lens(fam, B, 524_288))
    for fam in ("uniform", "skewed80", "2x40"):
        for B in (4, 32, 256):
            _case(cases, "llama8b", fam, B, 262_144, family_kv_lens(fam, B, 262_144), num_kv_heads=8)
    for fam in ("uniform", "skewed80"):
        _case(cases, "llama8b", fam, 16, 1_048_576, family_kv_lens(fam, 16, 1_048_576), num_kv_heads=8)
    for c in trace_cases():
        _case(cases, c["set"], c["family"], c["B_nominal"], c["T"], np.asarray(c["kv_lens"]))
    return cases


def training_cases() -> list[dict]:
    """The 280 training batches the shipped table is tuned on (no evaluation batch among them), ids 0..279:

    - ``train`` (100): one jittered *training* draw (``family_batches(seed=11, role="train")``) per family at
      B 2..1024 (uniform from B 1; ``2x40`` from B 4) and T = 262,144 / 1,048,576, H_q 32 / H_kv 4;
    - ``train_trace`` (40): one training batch of every shipped trace at B 8..1024;
    - ``train_32_8`` / ``train_8_1`` (26 each): H_q 32 / H_kv 8 and 8 / 1 (Llama-3.1-8B; Llama-3.1-70B at
      tensor parallelism 8) on uniform / skewed80 / 2x40 draws at B 1..256, both totals;
    - ``train_even`` (88): near-equal lengths, ``round(T / B * U(0.995, 1.005))`` (at least 1), B 16..1024,
      a total drawn log-uniformly within +-0.45 octave of 2^17 .. 2^20 (seeded), H_kv 4 and 8: requests
      that started together with one prompt length decode in lockstep, which the +-10 % draws never show.

    Same dict form as :func:`evaluation_cases`. Deterministic.
    """
    cases: list[dict] = []
    for T in REFERENCE_TOTALS:
        for fam in FAMILIES:
            for B in REFERENCE_BATCH_SIZES + (1024,):
                if (fam == "2x40" and B < 3) or (B == 1 and fam != "uniform"):
                    continue
                _case(cases, "train", fam, B, T, family_batches(fam, B, T, num_batches=1, seed=11, role="train")[0])
    for name in TRACES:
        for B in (8, 16, 32, 64, 128, 256, 512, 1024):
            try:
                train, _ = trace_batches(name, B, num_train=1, num_heldout=1, seed=0)
            except ValueError:
                continue
            _case(cases, "train_trace", name, B, int(train[0].sum()), train[0])
    for hq, hkv, batch_sizes in ((32, 8, (1, 4, 16, 64, 256)), (8, 1, (1, 4, 16, 64, 256))):
        for T in REFERENCE_TOTALS:
            for fam in ("uniform", "skewed80", "2x40"):
                for B in batch_sizes:
                    if (fam == "2x40" and B < 3) or (B == 1 and fam != "uniform"):
                        continue
                    lens = family_batches(fam, B, T, num_batches=1, seed=11, role="train")[0]
                    _case(cases, f"train_{hq}_{hkv}", fam, B, T, lens, num_qo_heads=hq, num_kv_heads=hkv)
    rng = np.random.default_rng(20261201)
    for hq, hkv in ((32, 4), (32, 8)):
        for B in (16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024):
            for e in (17, 18, 19, 20):
                T = int(round(2 ** (e + rng.uniform(-0.45, 0.45))))
                lens = np.maximum(np.rint(T / B * rng.uniform(0.995, 1.005, size=B)).astype(np.int64), 1)
                _case(cases, "train_even", "uniform", B, int(lens.sum()), lens, num_qo_heads=hq, num_kv_heads=hkv)
    return cases


def plan_request_mix(num_requests: int = 400, batch_size: int = 256, *, seed: int = 12345) -> list[np.ndarray]:
    """kv_lens of the plan-service benchmark's requests: ``num_requests`` batches of ``batch_size`` lengths
    ``floor(2 ** U(0, 15))`` (log-uniform over 1..32,767 tokens), seeded; the mix bench/plan_post.lua sends
    (its own Lua RNG, the same distribution). Returns int64 arrays."""
    rng = np.random.default_rng(seed)
    return [np.floor(2 ** (rng.random(batch_size) * 15)).astype(np.int64) for _ in range(num_requests)]
