"""The candidate pool of a tuning campaign and the rules that decide what a bucket publishes.

One source for:

- the candidate-name grammar (:func:`candidate_name`, :func:`candidate_policy`): ``stream_k|c3|n128w4s2`` is
  policy ``stream_k`` with ``{"ctas_per_sm": 3.0, "block_n": 128, "num_warps": 4, "num_stages": 2}``; optional
  suffixes, in this order: ``|o<item_cost_blocks>m<min_piece_blocks>``, ``|pf`` (``prefetch``),
  ``|h<heads_per_tile>``, ``|nx`` (``next_item``);
- the pool (:data:`SERVED_POOL`) and its default (:data:`DEFAULT`): the plans the H200 table was built from
  (each one's worst training batch within 1.36x of that batch's best; docs/decisions/table-hysteresis.md), and
  the pool as a shape's launch takes it (:func:`fitted_pool`);
- :data:`MARGIN` and the hysteresis of :func:`choose`, the pick per bucket over the training batches of keys
  within :data:`NEIGHBOUR_DISTANCE` (:func:`pick_per_key`), the table being replaced (:func:`previous_picks`),
  and which of a campaign's finalists a bucket publishes (:func:`choose_published`);
- the whole-wave decision of a bucket (:func:`whole_wave_decision`) and of every bucket of a campaign
  (:func:`whole_wave_by_bucket`).

Every figure here is a ratio of kernel times measured (or simulated) on the same batch; nothing reads a file
of the repository.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..kernels.policy_table import read_export
from ..kernels.rulespec import fit_heads_per_tile

__all__ = [
    "candidate_name",
    "candidate_policy",
    "parse_candidate",
    "tuned_equivalent",
    "SERVED_POOL",
    "DEFAULT",
    "fitted_pool",
    "MARGIN",
    "NEIGHBOUR_DISTANCE",
    "WHOLE_WAVE_EPS",
    "WHOLE_WAVE_WORST",
    "choose",
    "choose_scores",
    "choose_published",
    "pick_per_key",
    "previous_picks",
    "whole_wave_decision",
    "whole_wave_by_bucket",
]

_NAME_RE = re.compile(r"(\w+)\|c([0-9.]+)\|n(\d+)w(\d+)s(\d+)(?:\|o(\d+)m(\d+))?(\|pf)?(?:\|h(\d+))?(\|nx)?")
_NAME_KEYS = (
    "ctas_per_sm",
    "block_n",
    "num_warps",
    "num_stages",
    "item_cost_blocks",
    "min_piece_blocks",
    "prefetch",
    "heads_per_tile",
    "next_item",
)


def candidate_policy(name: str) -> tuple[str, dict[str, Any]] | None:
    """``(policy, make_plan params)`` of a candidate name such as ``stream_k|c3|n128w4s3|o2m4|pf``, or None when
    ``name`` is not one (a baseline's record name such as ``fa3`` or ``balanced``)."""
    m = _NAME_RE.fullmatch(name)
    if not m:
        return None
    params: dict[str, Any] = {
        "ctas_per_sm": float(m[2]),
        "block_n": int(m[3]),
        "num_warps": int(m[4]),
        "num_stages": int(m[5]),
    }
    if m[6] is not None:
        params["item_cost_blocks"], params["min_piece_blocks"] = int(m[6]), int(m[7])
    if m[8]:
        params["prefetch"] = True
    if m[9] is not None:
        params["heads_per_tile"] = int(m[9])
    if m[10]:
        params["next_item"] = True
    return m[1], params


def parse_candidate(name: str) -> tuple[str, dict[str, Any]]:
    """:func:`candidate_policy`, raising ``ValueError`` naming ``name`` when it is not a candidate name."""
    got = candidate_policy(name)
    if got is None:
        raise ValueError(f"candidate: {name!r} is not a candidate name (e.g. 'stream_k|c3|n128w4s2')")
    return got


def candidate_name(policy: str, params: Mapping[str, Any]) -> str | None:
    """The name of ``(policy, params)`` (inverse of :func:`candidate_policy`), or None when the params are not
    those of a candidate: a tile (``block_n``, ``num_warps``, ``num_stages``) and ``ctas_per_sm`` are needed, and
    every other key must be one the grammar names (``whole_wave`` / ``whole_wave_heads``, added after the pick
    by :func:`whole_wave_decision`, are ignored). Defaults are not named: ``prefetch`` False, ``heads_per_tile``
    1 and ``next_item`` False give the same name as their absence."""
    p = {k: v for k, v in params.items() if k not in ("whole_wave", "whole_wave_heads")}
    if any(k not in _NAME_KEYS for k in p) or any(k not in p for k in _NAME_KEYS[:4]):
        return None
    if ("item_cost_blocks" in p) != ("min_piece_blocks" in p):
        return None
    name = f"{policy}|c{float(p['ctas_per_sm']):g}|n{int(p['block_n'])}w{int(p['num_warps'])}s{int(p['num_stages'])}"
    if "item_cost_blocks" in p:
        name += f"|o{int(p['item_cost_blocks'])}m{int(p['min_piece_blocks'])}"
    name += "|pf" if p.get("prefetch") else ""
    name += f"|h{int(p['heads_per_tile'])}" if int(p.get("heads_per_tile", 1)) != 1 else ""
    name += "|nx" if p.get("next_item") else ""
    return name


def tuned_equivalent(name: str) -> dict[str, Any]:
    """The candidate ``name`` restated in the ``tuned`` family's parameters (the Optuna search space): a
    ``stream_k`` candidate is ``partition="stream_k"``, a ``balanced`` one the family's defaults (even chunks,
    wave-aware) at its ``ctas_per_sm`` and tile. Not completed with the space's defaults (the caller does, per
    task). Raises ValueError for a name of another policy."""
    policy, params = parse_candidate(name)
    if policy == "stream_k":
        return {**params, "partition": "stream_k"}
    if policy == "balanced":
        return dict(params)
    raise ValueError(f"candidate: {name!r}: only stream_k and balanced candidates have a tuned equivalent")


DEFAULT = "stream_k|c3|n128w4s2"
"""The pool's default: the best single plan over the H200 training set (geomean 1.013x the per-batch best);
a bucket publishes another pool member only when it wins by more than :data:`MARGIN`."""

SERVED_POOL = (
    "stream_k|c3|n128w4s2",
    "stream_k|c3|n64w4s3",
    "stream_k|c2|n128w4s3",
    "stream_k|c3|n128w4s2|o2m4",
    "balanced|c3|n128w4s2",
    "balanced|c4|n128w4s2",
    "balanced|c4|n64w4s2",
    # two KV heads per work tile: the candidates whose worst H200 training batch is within 1.36x of its best
    "balanced|c3|n32w4s3|pf|h2",
    "balanced|c3|n64w4s2|h2",
    "stream_k|c2|n32w4s4|pf|h2",
    "stream_k|c2|n64w8s2|h2",
    "stream_k|c3|n32w4s3|pf|h2",
    "stream_k|c3|n64w4s2|h2",
    "stream_k|c4|n32w4s2|h2",
    # the look-ahead over a CTA's work items (next_item) at one and two CTAs per SM
    "stream_k|c1|n64w8s3|pf|h2|nx",
    "stream_k|c1|n64w4s3|pf|h2|nx",
    "balanced|c2|n32w4s3|pf|h2|nx",
    "stream_k|c2|n32w4s3|pf|h2|nx",
    "balanced|c4|n32w4s2|h2",
)
"""The 19 candidates a campaign times on every training batch (docs/decisions/table-hysteresis.md gives the rule that admits them). The
default tile of the balanced rule (``balanced|c4|n64w4s2``: one tile per request on large batches of even
lengths) is in it and is picked only where it wins by the margin."""


def fitted_pool(pool: Sequence[str], num_qo_heads: int, num_kv_heads: int, q_len: int = 1) -> tuple[str, ...]:
    """``pool`` as the shape's launch takes it: each candidate's ``heads_per_tile`` lowered by
    :func:`kvsplit.kernels.rulespec.fit_heads_per_tile` (the refit a :class:`~kvsplit.kernels.policy_table.PolicyTable`
    applies when it serves the candidate to this shape) and the candidate renamed (:func:`candidate_name`); a
    restated candidate already in the pool is kept once, in its first place.

    Without it a two-head candidate is infeasible where two heads' rows do not fit one work tile (at G = 8: q_len 8,
    128 rows; H_kv = 1) and is left out of the campaign, which leaves 7 of the 19 candidates of :data:`SERVED_POOL`
    and none of its one- and two-CTA-per-SM plans. Candidates that fit are unchanged, so the pool of every shape
    whose tiles take them (G = 8 at q_len 1-4, G = 4) is :data:`SERVED_POOL` itself.

    Parameters
    ----------
    pool : sequence of str
        Candidate names (:func:`parse_candidate` raises ValueError naming one that is not).
    num_qo_heads, num_kv_heads : int
        H_q and H_kv of the campaign's shape.
    q_len : int
        Query tokens per request (1-8).
    """
    out: list[str] = []
    for name in pool:
        policy, params = parse_candidate(name)
        fitted = fit_heads_per_tile(params, num_qo_heads, num_kv_heads, q_len)
        restated = name if fitted is params else candidate_name(policy, fitted)
        if restated is None:  # pragma: no cover - fit_heads_per_tile keeps every key the grammar names
            raise ValueError(f"candidate: {name!r} refitted to {dict(fitted)!r} has no candidate name")
        if restated not in out:
            out.append(restated)
    return tuple(out)


MARGIN = 0.01
"""A pick must beat the plan it would replace by more than this fraction (geomean over the bucket's training
batches): ten-repetition kernel timings vary by < 1 % run to run (docs/decisions/table-hysteresis.md)."""

NEIGHBOUR_DISTANCE = 1.5
"""A bucket's pick is judged on its own training batches and on those of keys within this
:func:`kvsplit.kernels.buckets.distance` (for example one batch-size class, one token class and half the tokens
one half-octave bin apart; 4 neighbours per key in the median of a Qwen3-30B-A3B campaign): the lookup serves
batches between the keys from one of them, and a plan that wins on one batch but loses on its neighbours is not
published. Chosen on one H200 campaign's pool timings re-scored against 171 held-out evaluation batches (1.5 to
2.5 within 0.1 % in geomean; 0.5 and 1.0 served one batch at 1.165x the per-batch best plan), then measured: the
campaign rerun with it served its worst evaluation batch at 1.040x the best plan timed, against 1.165x with 0.5
(geomean 1.0034 against 1.0053), docs/decisions/table-hysteresis.md."""


def choose_scores(scores: Mapping[str, float], keep: Sequence[str | None] = (), margin: float = MARGIN) -> str:
    """The name of least score, unless it beats a name of ``keep`` (tried in order) by less than ``margin``:
    then that one. ``scores`` are comparable positive figures (geomean time over the same batches); a ``keep``
    entry that is None or not scored is skipped. Raises ValueError on an empty or non-positive ``scores``."""
    if not scores:
        raise ValueError("scores: no candidate was timed on every batch")
    if any(not (v > 0 and math.isfinite(v)) for v in scores.values()):
        raise ValueError(f"scores: expected positive finite figures, got {dict(scores)}")
    best = min(scores, key=lambda k: (scores[k], k))
    for k in keep:
        if k is not None and k in scores and scores[best] >= (1.0 - margin) * scores[k]:
            return k
    return best


def choose_published(scores: Mapping[str, float], margin: float = MARGIN) -> str:
    """Which of a campaign's finalists a bucket publishes: ``scores`` maps ``"best"`` (the Optuna study's best
    trial), ``"pool"`` (the pool pick of :func:`pick_per_key`) and ``"previous"`` (the replaced table's plan), the
    last two optional, to their geomean time (seconds) over the bucket's own training batches.

    The pool pick stays unless another finalist beats it by more than ``margin``; then the replaced plan stays
    unless the best beats it by the margin. The pool pick comes first because it was already judged against
    the replaced plan on the training batches of the bucket's neighbours too (:data:`NEIGHBOUR_DISTANCE`): on
    one bucket's single training batch a near-tie is noise (a replaced plan 0.4 % faster there ran 5.4 % slower
    on the held-out batch, docs/decisions/table-hysteresis.md). Raises ValueError as :func:`choose_scores`."""
    return choose_scores(scores, ("pool", "previous"), margin)


def choose(
    batches: Sequence[Mapping[str, float | None]],
    pool: Sequence[str] = SERVED_POOL,
    previous: str | None = None,
    default: str = DEFAULT,
    margin: float = MARGIN,
) -> str:
    """The ``pool`` member with the least geomean time over ``batches`` (one ``{name: seconds or None}`` per
    training batch; only members timed on every batch compete), unless it beats ``previous`` (what the table
    being replaced publishes for this key) or else ``default`` by less than ``margin``.

    Each batch's times are divided by its fastest competing time first (times of different batches are
    comparable only as ratios). Keeping ``previous`` within the margin is a hysteresis: a rebuild does not trade
    a plan for one that is as fast on the training batches and slower on the batches the key serves.
    Raises ValueError when no member was timed on every batch."""
    names = [k for k in pool if batches and all(t.get(k) for t in batches)]
    if not names:
        raise ValueError("batches: no pool candidate was timed on every training batch of the bucket")
    best_of = [min(float(t[n]) for n in names) for t in batches]
    scores = {
        k: math.exp(sum(math.log(float(t[k]) / b) for t, b in zip(batches, best_of)) / len(batches)) for k in names
    }
    return choose_scores(scores, (previous, default), margin)


def pick_per_key(
    timings: Mapping[str, Sequence[Mapping[str, float | None]]],
    *,
    pool: Sequence[str] = SERVED_POOL,
    previous: Mapping[str, str] | None = None,
    default: str = DEFAULT,
    margin: float = MARGIN,
    neighbour_distance: float = NEIGHBOUR_DISTANCE,
) -> dict[str, str]:
    """Bucket key -> its pool pick: :func:`choose` over the key's training batches and those of every other key
    within ``neighbour_distance``, keeping ``previous[key]`` within the margin. ``timings``: bucket key (a
    :class:`~kvsplit.kernels.buckets.BucketKey` string) -> its training batches' ``{candidate: seconds}``.
    When no candidate was timed on every one of those batches, the key's own batches decide; a key with no
    candidate timed on all of its own batches (every plan infeasible for the shape) is left out."""
    from ..kernels.buckets import distance

    previous = previous or {}
    keys = list(timings)
    out = {}
    for key in keys:
        near = [t for k2 in keys if k2 != key and distance(key, k2) <= neighbour_distance for t in timings[k2]]
        for batches in (list(timings[key]) + near, list(timings[key])):
            try:
                out[key] = choose(batches, pool, previous.get(key), default, margin)
                break
            except ValueError:
                continue
    return out


def previous_picks(doc: Mapping[str, Any] | str | Path, pool: Sequence[str] = SERVED_POOL) -> dict[str, str]:
    """Bucket key -> the pool candidate a policies export (``kvsplit db export``'s format, e.g.
    ``kernels/data/h200_policies.json``) publishes for it. A policy whose params are not exactly a candidate's
    of ``pool`` (``whole_wave`` / ``whole_wave_heads`` aside) is left out; a ``tuned`` policy is matched through
    :func:`tuned_equivalent` completed with nothing else (a tuned policy that names more is not a candidate).
    ``doc`` is the parsed export or its path. Raises ValueError when it is not a policies export."""
    if not isinstance(doc, Mapping):
        doc = read_export(doc, arg="--previous")
    elif not isinstance(doc.get("policies"), list):
        raise ValueError("--previous: not a policies export (no 'policies' list)")
    pool = set(pool)
    out = {}
    for p in doc["policies"]:
        name = candidate_name(p.get("name", ""), p.get("params") or {})
        if name in pool:
            out[p["bucket"]["key"]] = name
    return out


WHOLE_WAVE_EPS = 0.05
"""The whole-wave rule's excess (``params.whole_wave``): one work tile per request when the tiles fill at most
two resident waves within 5 %."""
WHOLE_WAVE_WORST = 1.01
"""A bucket keeps the whole-wave rule off when any batch it acts on runs more than this much slower with it
(ten-repetition timings vary by < 1 %)."""


def whole_wave_decision(
    ratios: Iterable[float], untimed: int = 0, worst: float = WHOLE_WAVE_WORST, gain: float = MARGIN
) -> dict[str, Any]:
    """Whether one bucket's plan gets the whole-wave rule.

    ``ratios``: for each batch the rule acts on (its plan differs with the rule), the time with the rule / the
    time of the bucket's chosen plan without it; ``untimed``: such batches without both timings. On when at
    least one ratio exists, none is untimed, their geomean is below ``1 - gain`` (the rule must win by more
    than :data:`MARGIN`, as a study's best must win over the pool pick) and none exceeds ``worst``. Returns
    ``{"on", "batches", "untimed", "geomean", "worst"}`` (geomean and worst NaN without ratios)."""
    rs = [float(x) for x in ratios]
    geo = math.exp(sum(math.log(x) for x in rs) / len(rs)) if rs else float("nan")
    top = max(rs) if rs else float("nan")
    on = bool(rs) and untimed == 0 and geo < 1.0 - gain and top <= worst
    return {"on": on, "batches": len(rs), "untimed": int(untimed), "geomean": geo, "worst": top}


def whole_wave_by_bucket(
    rows: Mapping[str, Sequence[Sequence[float | None]]],
    owner: Mapping[str, str],
    variants: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The whole-wave decision of every bucket of a campaign, each on its own batches.

    ``rows``: per timed batch group (a bucket's training batches, or a probe batch), one row per batch of
    ``len(variants)`` ratios, time with that variant of the rule / time without it; 1.0 where the variant
    leaves the plan unchanged, None where it cannot plan the batch. ``owner``: the bucket each group's rows
    belong to (a probe batch: its nearest bucket, whose chosen params it was timed with). Each bucket takes the
    variant of lowest geomean among those :func:`whole_wave_decision` turns on, over the ratios of its groups
    that the variant changes.

    Per bucket, not per shape family: the rule gives one tile per request when the tiles fill whole resident
    waves, and whether that beats the split plan depends on the bucket's own residency (``ctas_per_sm``, tile)
    and batch size. On the H200 (Qwen3-30B-A3B shape) it won 7 % at B = 192 and lost 3 % at B = 256 of the same
    total (docs/decisions/whole-wave-rule.md).

    Returns ``{"on", "buckets", "batches", "geomean", "worst"}``: ``buckets`` maps each bucket that gets the rule
    to ``{"params", "batches", "geomean", "worst"}`` (``params``: the variant's keys to add to its plan's params);
    ``on`` whether any does; ``batches``, ``geomean``, ``worst`` of the variant timed on the most batches over all
    buckets (what the summary gives when the rule is off everywhere).
    """
    groups: dict[str, list[Sequence[float | None]]] = {}
    for label, per in rows.items():
        if label in owner:
            groups.setdefault(owner[label], []).extend(per)
    buckets: dict[str, dict[str, Any]] = {}
    for key, per in sorted(groups.items()):
        best: dict[str, Any] | None = None
        for i, v in enumerate(variants):
            d = whole_wave_decision([r[i] for r in per if r[i] is not None and r[i] != 1.0])
            if d["on"] and (best is None or d["geomean"] < best["geomean"]):
                best = {"params": dict(v), "batches": d["batches"], "geomean": d["geomean"], "worst": d["worst"]}
        if best is not None:
            buckets[key] = best
    seen: dict[str, Any] = {"batches": 0, "geomean": float("nan"), "worst": float("nan")}
    for i in range(len(variants)):
        rs = [r[i] for per in groups.values() for r in per if r[i] is not None and r[i] != 1.0]
        if len(rs) > seen["batches"]:
            d = whole_wave_decision(rs)
            seen = {"batches": d["batches"], "geomean": d["geomean"], "worst": d["worst"]}
    return {"on": bool(buckets), "buckets": buckets, **seen}
