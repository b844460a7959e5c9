"""Tuning tasks from the plan service's traffic statistics (``kvsplit tune --from-traffic N``).

The service records, per bucket key and hour, how many requests it answered with the ``fallback``
policy and how many it matched farther than :data:`kvsplit.kernels.buckets.DISTANCE_LIMIT` (a
neighbour's policy), with the batch-size and total-token ranges of those requests
(:mod:`kvsplit.db.traffic`). Traffic spreads over many nearby keys (batches of one workload jitter
across half-octave bins and class edges), and a tuned bucket also serves every key within the distance
limit, so :func:`traffic_picks` chooses the keys to tune as a greedy cover: each next pick is the key
whose policy would serve the most fallback or far requests not yet served by an earlier pick (the greedy
rule for maximum coverage; Nemhauser, Wolsey and Fisher, 1978). :func:`traffic_tasks` takes the first N
picks and builds one :class:`~kvsplit.tuner.tasks.TuneTask` per key whose training and held-out batches are
synthesized from what was recorded (:func:`batches_for_key`): batch size and total tokens drawn within
the recorded ranges, lengths placed so that the batch's token-weighted half-octave histogram is the
key's own. Every batch is checked to have exactly the recorded key, so the tuned policy is stored under
the bucket the traffic asked for and the next request of that traffic matches it at distance 0.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

from ..db import store
from ..kernels.buckets import CLASS_WEIGHT, DISTANCE_LIMIT, BucketKey, distances, key_of
from ..kernels.device import known_devices, resolve_device
from ..kernels.limits import BINS_PER_OCTAVE, HIST_UNITS, check_kv_lens
from ..kernels.shape import Shape, gpu_slug
from .tasks import DEFAULT_HELDOUT, DEFAULT_TRAIN, TuneTask, key_signature, shape_fields

__all__ = [
    "TrafficDemand",
    "TrafficPick",
    "COVER_KEYS",
    "traffic_demand",
    "traffic_picks",
    "traffic_tasks",
    "batches_for_key",
    "bin_range",
    "class_range",
    "device_name",
]

_ROLES = {"train": 0, "heldout": 1}


def class_range(c: int) -> tuple[int, int]:
    """The integers ``x >= 1`` with ``round(log2(x)) == c`` (halves round up, :func:`kvsplit.kernels.buckets.log2_class`):
    ``[lo, hi]`` with ``lo = ceil(2^(c - 1/2))``, ``hi = ceil(2^(c + 1/2)) - 1``."""
    lo = 1 if c <= 0 else math.isqrt(1 << (2 * c - 1)) + 1  # ceil(sqrt(2^(2c-1))), never a perfect square
    hi = math.isqrt(1 << (2 * c + 1))  # floor(sqrt(2^(2c+1))) = ceil(2^(c+1/2)) - 1
    return lo, hi


def bin_range(k: int) -> tuple[int, int]:
    """The lengths ``L >= 1`` with ``floor(2 * log2(L)) == k`` (a half-octave bin of the key's histogram):
    ``[ceil(2^(k/2)), ceil(2^((k+1)/2)) - 1]``; empty (``lo > hi``) when no integer falls in it."""

    def ceil_pow(e2: int) -> int:  # ceil(2^(e2/2))
        if e2 % 2 == 0:
            return 1 << (e2 // 2)
        return math.isqrt(1 << e2) + 1

    return ceil_pow(k), ceil_pow(k + 1) - 1


def _split(total: int, n: int, lo: int, hi: int, rng: np.random.Generator) -> np.ndarray | None:
    """``n`` integers in ``[lo, hi]`` summing to ``total``, jittered (each starts at ``total / n`` times
    U(0.9, 1.1)), or None when impossible."""
    if n == 0:
        return np.zeros(0, np.int64) if total == 0 else None
    if not (n * lo <= total <= n * hi):
        return None
    x = np.clip(np.rint(total / n * rng.uniform(0.9, 1.1, n)).astype(np.int64), lo, hi)
    diff = int(total - x.sum())
    order = rng.permutation(n)
    while diff != 0:  # walk the requests, moving each as far as its bounds allow
        moved = False
        for i in order:
            if diff > 0 and x[i] < hi:
                d = min(diff, hi - int(x[i]))
            elif diff < 0 and x[i] > lo:
                d = -min(-diff, int(x[i]) - lo)
            else:
                continue
            x[i] += d
            diff -= d
            moved = True
            if diff == 0:
                break
        if not moved:
            return None
    return x


def _one_batch(key: BucketKey, B: int, T: int, rng: np.random.Generator) -> np.ndarray | None:
    """A batch of ``B`` requests and ``T`` tokens whose token-weighted histogram is ``key.hist``, or None."""
    bins = [(b, u, *bin_range(b)) for b, u in key.hist]
    if any(lo > hi for _, _, lo, hi in bins):
        return None
    W = [T * u // HIST_UNITS for _, u, _, _ in bins]
    W[-1] += T - sum(W)
    # fewest and most requests that hold a bin's tokens, give or take 5 % (its share is quantized to 1/16)
    n_lo = [max(1, math.ceil(0.95 * w / hi)) for w, (_, _, _, hi) in zip(W, bins)]
    n_hi = [max(1, math.floor(1.05 * w / lo)) for w, (_, _, lo, _) in zip(W, bins)]
    if sum(n_lo) > B or sum(n_hi) < B or any(a > b for a, b in zip(n_lo, n_hi)):
        return None
    # requests per bin: start at the bin's geometric middle length, then move within the bounds to sum B
    mid = [w / (2 ** ((b + 0.5) / BINS_PER_OCTAVE)) for w, (b, _, _, _) in zip(W, bins)]
    n = [min(max(round(m), a), c) for m, a, c in zip(mid, n_lo, n_hi)]
    for _ in range(4 * len(n) + 4):
        diff = B - sum(n)
        if diff == 0:
            break
        for i in rng.permutation(len(n)):
            if diff > 0 and n[i] < n_hi[i]:
                d = min(diff, n_hi[i] - n[i])
            elif diff < 0 and n[i] > n_lo[i]:
                d = -min(-diff, n[i] - n_lo[i])
            else:
                continue
            n[i] += d
            diff -= d
            if diff == 0:
                break
    if sum(n) != B:
        return None
    # a bin of one or two integers (short lengths) cannot hold every token count: its share moves a little
    W = [min(max(w, k * lo), k * hi) for w, k, (_, _, lo, hi) in zip(W, n, bins)]
    parts = []
    for w, k, (_, _, lo, hi) in zip(W, n, bins):
        x = _split(w, k, lo, hi, rng)
        if x is None:
            return None
        parts.append(x)
    L = np.concatenate(parts)
    return L[np.argsort(-L, kind="stable")]  # heavy requests first, as the families are (DESIGN.md §6)


def batches_for_key(
    key: BucketKey | str,
    *,
    batch_range: tuple[int, int],
    tokens_range: tuple[int, int],
    num_batches: int,
    shape: Shape,
    rng: np.random.Generator,
    attempts: int = 400,
) -> list[np.ndarray]:
    """``num_batches`` different batches whose bucket key (for ``shape``) is exactly ``key``.

    Batch size uniform in ``batch_range`` and total tokens log-uniform in ``tokens_range`` (both clipped to
    the key's batch-size and total-token classes), lengths per half-octave bin as :func:`_one_batch` places
    them, each kept only if :func:`kvsplit.kernels.buckets.key_of` gives ``key`` back (``shape`` holds the key's
    KV dtype and q_len, ``.kvfp8`` / ``.q4``); with q_len > 1 every kv_len is at least q_len (kv_lens count
    the q_len new tokens, as the kernel requires).

    Returns
    -------
    list of int64 arrays ``[B]``, heavy requests first.

    Raises
    ------
    ValueError
        ``key`` has no non-empty requests (all-empty batches carry no length signature), or fewer than
        ``num_batches`` batches with that key were found in ``attempts`` draws each.
    """
    key = key if isinstance(key, BucketKey) else BucketKey.parse(key)
    if not key.hist:
        raise ValueError(f"bucket {key}: an all-empty batch signature; nothing to tune")
    blo, bhi = class_range(key.batch_class)
    tlo, thi = class_range(key.tokens_class)
    b0, b1 = max(blo, int(batch_range[0])), min(bhi, int(batch_range[1]))
    t0, t1 = max(tlo, int(tokens_range[0])), min(thi, int(tokens_range[1]))
    if b0 > b1:
        b0, b1 = blo, bhi
    if t0 > t1:
        t0, t1 = tlo, thi
    ctx = shape.plan_context()
    want = str(key)
    out: list[np.ndarray] = []
    seen: set[bytes] = set()
    tries = 0
    while len(out) < num_batches and tries < attempts * num_batches:
        tries += 1
        # after a quarter of the attempts, widen to the whole classes (the recorded range may be one point)
        wide = tries > attempts * num_batches // 4
        B = int(rng.integers(blo if wide else b0, (bhi if wide else b1) + 1))
        lt0, lt1 = (tlo, thi) if wide else (t0, t1)
        T = int(round(math.exp(rng.uniform(math.log(lt0), math.log(lt1 + 1)))))
        T = min(max(T, lt0), lt1)
        L = _one_batch(key, B, T, rng)
        if L is None or (key.q_len > 1 and int(L.min()) < key.q_len):  # kv_lens count the q_len new tokens
            continue
        if str(key_of(check_kv_lens(L), ctx)) != want:
            continue
        b = L.tobytes()
        if b in seen:
            continue
        seen.add(b)
        out.append(L)
    if len(out) < num_batches:
        raise ValueError(
            f"bucket {key}: found {len(out)} of {num_batches} batches with this key in {tries} draws "
            f"(B in [{b0}, {b1}], tokens in [{t0}, {t1}])"
        )
    return out


@dataclass(frozen=True)
class TrafficDemand:
    """A recorded bucket key and the requests it got that a tuned bucket of its own would serve better."""

    key: str
    requests: int
    fallback: int
    far: int
    batch_range: tuple[int, int]
    tokens_range: tuple[int, int]

    @property
    def unserved(self) -> int:
        """Requests answered by the fallback or from farther than the bucket distance limit."""
        return self.fallback + self.far


def traffic_demand(database_url: str, *, hours: int, now_hour: int) -> list[TrafficDemand]:
    """The store's recorded keys with at least one fallback or far request in the ``hours`` hours up to
    ``now_hour``, most such requests first (ties: more requests, then key). Keys of all-empty batches (every
    kv_len 0, total-token class -1) are left out: such a batch reads no KV cache and has no length signature to
    tune (:func:`batches_for_key` refuses it)."""
    with store.session_scope(database_url) as s:
        rows = store.read_traffic(s, since_hour=now_hour - hours + 1)
    out = [
        TrafficDemand(
            t.key, t.requests, t.n_fallback, t.n_far, (t.batch_min, t.batch_max), (t.tokens_min, t.tokens_max)
        )
        for t in rows
        if t.n_fallback + t.n_far > 0 and BucketKey.parse(t.key).tokens_class >= 0
    ]
    out.sort(key=lambda d: (-d.unserved, -d.requests, d.key))
    return out


@dataclass(frozen=True)
class TrafficPick:
    """A recorded key to tune, and the recorded keys (itself first) within the distance limit of it whose
    fallback or far requests its tuned policy would then serve."""

    demand: TrafficDemand
    covers: tuple[TrafficDemand, ...]

    @property
    def unserved(self) -> int:
        """Fallback or far requests of the covered keys."""
        return sum(d.unserved for d in self.covers)

    @property
    def requests(self) -> int:
        """Requests of the covered keys."""
        return sum(d.requests for d in self.covers)


COVER_KEYS = 256
"""Most keys :func:`traffic_picks` covers greedily (those with the most fallback or far requests); each later
key joins the nearest pick or becomes its own (the greedy step costs a distance per pair of keys)."""


def traffic_picks(
    demand: list[TrafficDemand], *, limit: float = DISTANCE_LIMIT, cover_keys: int = COVER_KEYS
) -> list[TrafficPick]:
    """The keys of ``demand`` in the order to tune them (module doc): a greedy maximum coverage, each pick
    the not yet covered key whose neighbours within ``limit`` (:func:`kvsplit.kernels.buckets.distance`,
    same family) hold the most fallback or far requests not covered by an earlier pick; ties go to more
    requests of its own, then to the key that sorts first. Every key of ``demand`` is covered by exactly one
    pick. ``demand`` in :func:`traffic_demand`'s order; its first ``cover_keys`` keys are covered this way;
    each later key joins the nearest pick within ``limit`` or becomes a pick of its own. Cost: one distance
    per pair of those first keys of a family at most ``limit / CLASS_WEIGHT`` class steps apart (further keys
    cannot be within ``limit``), and one per later key and pick."""
    rest = demand[cover_keys:]
    demand = demand[:cover_keys]
    keys = [BucketKey.parse(d.key) for d in demand]
    # only keys whose class steps alone stay within the limit can be near (each step adds CLASS_WEIGHT)
    steps = int(limit // CLASS_WEIGHT)
    groups: dict[tuple, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault((k.family, k.batch_class, k.tokens_class), []).append(i)
    near: list[list[int]] = []
    for k in keys:
        cand = [
            j
            for (fam, b, t), members in groups.items()
            if fam == k.family and abs(b - k.batch_class) + abs(t - k.tokens_class) <= steps
            for j in members
        ]
        dist = distances(k, [keys[j] for j in cand])
        near.append(sorted(j for j, d in zip(cand, dist) if d <= limit))
    left = set(range(len(demand)))
    out: list[TrafficPick] = []
    while left:
        best = min(
            left,
            key=lambda i: (
                -sum(demand[j].unserved for j in near[i] if j in left),
                -demand[i].unserved,
                -demand[i].requests,
                demand[i].key,
            ),
        )
        got = [best] + [j for j in near[best] if j in left and j != best]
        out.append(TrafficPick(demand[best], tuple(demand[j] for j in got)))
        left.difference_update(got)
    # the rest: each joins the nearest pick within the limit, else becomes a pick of its own
    for d in rest:
        k = BucketKey.parse(d.key)
        dist = distances(k, [p.demand.key for p in out])
        i = int(np.argmin(dist)) if len(out) else -1
        if i >= 0 and dist[i] <= limit:
            out[i] = TrafficPick(out[i].demand, out[i].covers + (d,))
        else:
            out.append(TrafficPick(d, (d,)))
    return out


def device_name(slug: str) -> str | None:
    """The known device whose :func:`~kvsplit.kernels.shape.gpu_slug` is ``slug`` (a bucket key's GPU part), or None."""
    for d in known_devices():
        if gpu_slug(d.name) == slug:
            return d.name
    return None


def traffic_tasks(
    database_url: str,
    count: int,
    *,
    gpu: str,
    group_size: int,
    hours: int,
    now_hour: int,
    num_train: int = DEFAULT_TRAIN,
    num_heldout: int = DEFAULT_HELDOUT,
    seed: int = 0,
    num_kv_heads: int | None = None,
) -> tuple[list[TuneTask], list[str]]:
    """Tasks for the first ``count`` of :func:`traffic_picks` among the recorded keys of GPU ``gpu`` (and of
    ``num_kv_heads`` KV heads, when given).

    A task's shape is its key's: H_kv, head_dim, dtype, page size, KV dtype and q_len (an fp8-KV or
    q_len > 1 key, ``.kvfp8`` / ``.q4``, gives a task of that KV dtype and q_len), so the tuned bucket's key is
    the recorded key; H_q is ``group_size`` times H_kv. A key does not hold H_q, so ``group_size`` is only known
    for the model the caller names: with ``num_kv_heads`` the keys of another H_kv are left (one note says how
    many), not tuned at a guessed GQA group (whose work tiles, ``G * q_len`` rows, would be another shape's).

    Parameters
    ----------
    database_url : str
        The store holding the traffic statistics (and receiving the tuned policies).
    count : int
        Most keys to tune (>= 1).
    gpu : str
        GPU name or alias: only keys of this GPU are picked.
    group_size : int
        GQA group size H_q / H_kv of the tuned shapes (the key does not hold H_q).
    hours : int
        Window of the statistics, hours up to ``now_hour``.
    num_train, num_heldout, seed
        As :func:`kvsplit.tuner.tasks.family_task`; a key's batches come from its own random stream
        (``seed``, role, CRC-32 of the key). A key already stored as a bucket keeps that bucket's batches.

    Returns
    -------
    (tasks, notes)
        ``notes`` says which picked keys were skipped and why.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"--from-traffic: expected a number of buckets >= 1, got {count!r}")
    want = gpu_slug(resolve_device(gpu).name)
    tasks: list[TuneTask] = []
    notes: list[str] = []
    mine = [
        d for d in traffic_demand(database_url, hours=hours, now_hour=now_hour) if BucketKey.parse(d.key).gpu == want
    ]
    if num_kv_heads is not None:
        other = [d for d in mine if BucketKey.parse(d.key).num_kv_heads != num_kv_heads]
        if other:
            kinds = sorted({BucketKey.parse(d.key).num_kv_heads for d in other})
            notes.append(
                f"{len(other)} recorded key(s) of H_kv {', '.join(map(str, kinds))} left: another model's (this run "
                f"tunes H_kv {num_kv_heads}, and a key does not record H_q); tune them with that model's "
                "--num-qo-heads/--num-kv-heads"
            )
            mine = [d for d in mine if d not in other]
    for pick in traffic_picks(mine):
        if len(tasks) >= count:
            break
        d = pick.demand
        key = BucketKey.parse(d.key)
        name = device_name(key.gpu)
        if name is None:
            notes.append(f"{d.key}: GPU {key.gpu!r} is not a known device; skipped")
            continue
        try:
            shape = Shape.of(
                device=name,
                num_qo_heads=key.num_kv_heads * group_size,
                num_kv_heads=key.num_kv_heads,
                head_dim=key.head_dim,
                dtype=key.dtype,
                page_size=key.page_size,
                kv_dtype=key.kv_dtype,
                q_len=key.q_len,
            )
        except ValueError as exc:
            notes.append(f"{d.key}: {exc}; skipped")
            continue
        with store.session_scope(database_url) as s:
            b = store.get_bucket(s, d.key)
            stored = dict(b.sample_batches or {}) if b is not None else {}
        if stored.get("train") and stored.get("heldout"):
            train = tuple(tuple(int(v) for v in x) for x in stored["train"])
            heldout = tuple(tuple(int(v) for v in x) for x in stored["heldout"])
        else:
            drawn = {}
            try:
                for role, n in (("train", num_train), ("heldout", num_heldout)):
                    drawn[role] = batches_for_key(
                        key,
                        batch_range=d.batch_range,
                        tokens_range=d.tokens_range,
                        num_batches=n,
                        shape=shape,
                        rng=np.random.default_rng([int(seed), _ROLES[role], zlib.crc32(d.key.encode())]),
                    )
            except ValueError as exc:
                notes.append(f"{exc}; skipped")
                continue
            train = tuple(tuple(int(v) for v in x) for x in drawn["train"])
            heldout = tuple(tuple(int(v) for v in x) for x in drawn["heldout"])
        tasks.append(
            TuneTask(
                key=d.key,
                **shape_fields(shape),
                source=(
                    f"traffic:{pick.unserved}/{pick.requests} requests fallback or far"
                    + (f" over {len(pick.covers)} keys" if len(pick.covers) > 1 else "")
                    + f":B{d.batch_range[0]}-{d.batch_range[1]}:T{d.tokens_range[0]}-{d.tokens_range[1]}"
                ),
                train=train,
                heldout=heldout,
                signature=key_signature(key),
            )
        )
    return tasks, notes
