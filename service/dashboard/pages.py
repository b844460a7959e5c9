"""What each dashboard page shows, computed from the store, the served table and the shipped peer timings.

Pages (routes in :mod:`kvsplit.service.routers.dashboard`):

- ``/`` — the summary: per bucket family (GPU, shape, KV dtype and q_len:
  :func:`kvsplit.service.queries.bucket_family`) the held-out headline (served plan vs ``balanced`` vs FlashInfer
  vs FA3, :mod:`.evidence`), the store's policy counts and the coverage map (:mod:`.coverage`);
- ``/shapes/{slug}`` — one bucket family (``slug`` its keys' family part): coverage map, time / read floor against
  B per length family, and the policy table, paginated, sortable and filterable by query parameters
  (:func:`table_query`);
- ``/plan`` — the plan viewer: a batch's served plan beside ``balanced`` and FlashInfer's rule as work tiles on
  SMs over time (:mod:`.gantt`, from :func:`kvsplit.tuner.simulate.timeline`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from markupsafe import Markup

from ...db.engine import safe_url
from ...kernels.buckets import BucketKey, log2_class
from ...kernels.policy_table import SERVE_DISTANCE_LIMIT
from ...tuner.traffic import TrafficDemand, device_name, traffic_demand, traffic_picks
from .. import queries
from ..queries import BASELINES, SIMULATED_SUFFIX, served_gain, served_gain_base
from ..traffic import FAR_DISTANCE, current_hour
from .coverage import coverage_cells, coverage_svg
from .evidence import SERVED, geomean, shape_evidence
from .render import MODEL_QO_HEADS, count, shape_name
from .svg import line_chart
from .viewer import family_shape

__all__ = [
    "summary_context",
    "shape_context",
    "table_query",
    "TableQuery",
    "QueryError",
    "traffic_rows",
    "traffic_families",
    "TRAFFIC_HOURS",
    "UNBUCKETED_MAP",
    "SORT_COLUMNS",
    "PER_PAGE_MAX",
]

SORT_COLUMNS = ("family", "B", "tokens", "policy", "time", "gain", "key")
"""Columns the policy table sorts by (``sort=``)."""
PER_PAGE_MAX = 200
TRAFFIC_HOURS = 24
"""Window of the traffic the dashboard shows (hours up to now)."""
UNBUCKETED_MAP = "traffic without a bucket"
"""Name of the extra coverage map of a shape that draws its recorded traffic whose key is no stored bucket."""
_FAMILY_ORDER = ("uniform", "skewed40", "skewed60", "skewed80", "2x40", "trace", "other")


class QueryError(ValueError):
    """A query parameter of a dashboard page is invalid; ``argument`` names it."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"{argument}: {message}")
        self.argument = argument


@dataclass(frozen=True)
class TableQuery:
    """Validated parameters of the policy table (``/shapes/{slug}?page=&per_page=&sort=&order=&family=&source=&q=``)."""

    page: int = 1
    per_page: int = 50
    sort: str = "family"
    order: str = "asc"
    family: str = ""
    source: str = ""
    q: str = ""


def _int_param(params: dict[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        raise QueryError(name, f"expected an integer, got {raw[:40]!r}") from None
    if not lo <= v <= hi:
        raise QueryError(name, f"expected {lo}..{hi}, got {v}")
    return v


def table_query(params: dict[str, str]) -> TableQuery:
    """Validate the policy table's query parameters.

    Raises
    ------
    QueryError
        Naming the parameter: ``page`` not an integer in 1..100000, ``per_page`` not in 10..200, ``sort`` not one
        of :data:`SORT_COLUMNS`, ``order`` not ``asc``/``desc``, ``source`` not ``tuned``/``simulated``/``none``,
        ``family`` or ``q`` longer than 100 characters, or an unknown parameter.
    """
    known = {"page", "per_page", "sort", "order", "family", "source", "q"}
    extra = sorted(set(params) - known)
    if extra:
        raise QueryError(extra[0], f"unknown parameter; known: {', '.join(sorted(known))}")
    sort = params.get("sort") or "family"
    if sort not in SORT_COLUMNS:
        raise QueryError("sort", f"expected one of {', '.join(SORT_COLUMNS)}, got {sort[:40]!r}")
    order = params.get("order") or "asc"
    if order not in ("asc", "desc"):
        raise QueryError("order", f"expected asc or desc, got {order[:40]!r}")
    source = params.get("source") or ""
    if source not in ("", "tuned", "simulated", "none"):
        raise QueryError("source", f"expected tuned, simulated or none, got {source[:40]!r}")
    for name in ("family", "q"):
        if len(params.get(name) or "") > 100:
            raise QueryError(name, "longer than 100 characters")
    return TableQuery(
        page=_int_param(params, "page", 1, 1, 100_000),
        per_page=_int_param(params, "per_page", 50, 10, PER_PAGE_MAX),
        sort=sort,
        order=order,
        family=params.get("family") or "",
        source=source,
        q=params.get("q") or "",
    )


def _as_dict(r: Any) -> dict[str, Any]:
    """A traffic row as a dict: a mapping, an SQLAlchemy ``Row`` (``_mapping``) or a dataclass."""
    if isinstance(r, dict):
        return r
    if hasattr(r, "_mapping"):
        return dict(r._mapping)
    if dataclasses.is_dataclass(r):
        return dataclasses.asdict(r)
    return dict(r)


def traffic_rows(url: str, hours: int = TRAFFIC_HOURS) -> tuple[list[dict[str, Any]], str]:
    """Rows of :func:`kvsplit.service.queries.traffic_summary` over the last ``hours`` and a note; ``([], why)``
    when the store cannot answer (the coverage map then has no traffic layer, and the page says why)."""
    from ...db import store

    try:
        with store.session_scope(url) as s:
            rows = [_as_dict(r) for r in queries.traffic_summary(s, hours=hours)]
    except Exception as exc:  # noqa: BLE001 - a store without the traffic table: no layer, said on the page
        return [], f"traffic statistics unavailable ({type(exc).__name__})"
    return (
        rows,
        f"traffic of the last {hours} h, all shapes: {count(sum(int(r.get('requests', 0)) for r in rows), 'request')}",
    )


def _traffic_shape(slug: str, traffic: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The dashboard dict (no buckets) of a shape with recorded traffic but no stored bucket, from one of its
    recorded keys; None when no traffic row has that shape."""
    for r in traffic:
        if r.get("family") != slug:
            continue
        try:
            k = BucketKey.parse(str(r["key"]))
        except (KeyError, ValueError):
            continue
        return {
            "gpu": device_name(k.gpu) or k.gpu,
            "num_kv_heads": k.num_kv_heads,
            "head_dim": k.head_dim,
            "dtype": k.dtype,
            "page_size": k.page_size,
            "kv_dtype": k.family[5],
            "q_len": k.q_len,
            "slug": slug,
            "buckets": [],
            "families": {},
        }
    return None


def _unserved(r: dict[str, Any]) -> int:
    """Fallback or far requests of a :func:`traffic_rows` row."""
    return int((r.get("by_source") or {}).get("fallback", 0)) + int(r.get("far") or 0)


def traffic_families(
    url: str, traffic: list[dict[str, Any]], shapes: list[dict[str, Any]], hours: int = TRAFFIC_HOURS
) -> list[dict[str, Any]]:
    """Per bucket family (shape slug) with recorded traffic, most requests first: ``requests``, ``fallback``,
    ``far`` (matched farther than the distance limit), ``share_pct`` (fallback or far, % of requests),
    ``published`` (the store's published policies of that shape) and, where any request was served by the
    fallback or from far away, ``command``: the ``kvsplit tune --from-traffic N`` that tunes this family's keys
    (N = the rank of its last key among the GPU's keys in :func:`kvsplit.tuner.traffic.traffic_picks`' order,
    so the keys of other shapes ranked above it are tuned too; ``note`` says so).

    ``traffic``: rows of :func:`traffic_rows`; ``shapes``: ``dashboard_data(url)["shapes"]``.
    """
    by_fam: dict[str, list[dict[str, Any]]] = {}
    for r in traffic:
        by_fam.setdefault(str(r.get("family")), []).append(r)
    published = {sh["slug"]: sum(1 for b in sh["buckets"] if b["policy"] is not None) for sh in shapes}
    demand: list[TrafficDemand] | None = None
    ranked: dict[str, list[str]] = {}  # GPU slug -> the keys --from-traffic tunes, in its order
    out = []
    for fam, rows in by_fam.items():
        sh = _traffic_shape(fam, rows)
        if sh is None:
            continue
        req = sum(int(r["requests"]) for r in rows)
        fb = sum(int((r.get("by_source") or {}).get("fallback", 0)) for r in rows)
        far = sum(int(r.get("far") or 0) for r in rows)
        row = {
            "family": fam,
            "model": shape_name(sh["num_kv_heads"], sh["head_dim"]),
            "gpu": sh["gpu"],
            "page_size": sh["page_size"],
            "dtype": sh["dtype"],
            "kv_dtype": sh["kv_dtype"],
            "q_len": sh["q_len"],
            "keys": len(rows),
            "requests": req,
            "fallback": fb,
            "far": far,
            "share_pct": 100.0 * (fb + far) / req if req else 0.0,
            "published": published.get(fam, 0),
            "command": None,
            "note": "",
        }
        if fb + far:
            if demand is None:
                demand = traffic_demand(url, hours=hours, now_hour=current_hour())
            gpu = BucketKey.parse(str(rows[0]["key"])).gpu
            if gpu not in ranked:
                ranked[gpu] = [
                    p.demand.key for p in traffic_picks([d for d in demand if BucketKey.parse(d.key).gpu == gpu])
                ]
            mine = [i for i, k in enumerate(ranked[gpu]) if queries.shape_slug(k) == fam]
            if mine and device_name(gpu) is not None:
                n = mine[-1] + 1
                hq = MODEL_QO_HEADS.get((sh["num_kv_heads"], sh["head_dim"]))
                row["command"] = " ".join(
                    [
                        f"kvsplit tune --from-traffic {n} --traffic-hours {hours}",
                        f"--gpu {shlex.quote(sh['gpu'])}",
                        f"--num-qo-heads {hq if hq else 'H_Q'} --num-kv-heads {sh['num_kv_heads']}",
                        f"--backend gpu --database-url {shlex.quote(safe_url(url))}",
                    ]
                )
                others = n - len(mine)
                row["note"] = (
                    f"tunes {len(mine)} key(s) of this family, which cover its fallback or far requests"
                    + (f" and {others} key(s) of other shapes ranked above them" if others else "")
                    + ("; H_Q: your model's query heads per GPU" if not hq else "")
                    + "; --backend sim without that GPU (simulator-labelled policies)"
                )
            elif device_name(gpu) is None:
                row["note"] = f"GPU {gpu!r} is not a known device: kvsplit tune cannot tune it"
            elif not mine and all(BucketKey.parse(str(r["key"])).tokens_class < 0 for r in rows if _unserved(r)):
                row["note"] = (
                    "its fallback requests are all-empty batches (every kv_len 0): no KV to read, nothing to tune"
                )
        out.append(row)
    out.sort(key=lambda f: (-f["requests"], f["family"]))
    return out


_LOOKUPS: dict[str, Any] = {"table": None, "memo": {}}
"""Lookups of the last served table, by (shape, batch): the table is immutable (a reload makes a new one)."""


def _lookup_of(table: Any, sh: dict[str, Any]):
    """``lookup(kv_lens) -> (source, distance)`` of the served table for shape ``sh``, or None without a table."""
    if table is None:
        return None
    if _LOOKUPS["table"] is not table:
        _LOOKUPS.update(table=table, memo={})
    memo = _LOOKUPS["memo"]

    def lookup(lens):
        key = (sh["slug"], lens.tobytes())
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = _lookup(lens)
        return hit

    def _lookup(lens):
        _, bucket, info = table.plan(lens, gpu=sh["gpu"], **family_shape(sh))
        return info["source"], bucket["distance"]

    return lookup if len(memo) < 100_000 else _lookup


def _ranges(buckets: list[dict[str, Any]]) -> tuple[range, range]:
    bs = [b["b_class"] for b in buckets if b.get("b_class") is not None]
    ts = [b["t_class"] for b in buckets if b.get("t_class") is not None]
    if not bs:
        return range(0, 11), range(10, 21)
    return range(min(bs), max(bs) + 1), range(min(ts), max(ts) + 1)


def _coverage(sh: dict[str, Any], table: Any, traffic: list[dict[str, Any]]) -> tuple[list[dict], dict[str, Any]]:
    """Per family the coverage map, and the counts of cell kinds over the synthetic families (with their range)."""
    b_range, t_range = _ranges(sh["buckets"])
    fams = sorted({b["family"] for b in sh["buckets"]}, key=lambda f: (_FAMILY_ORDER + (f,)).index(f))
    lookup = _lookup_of(table, sh)
    # a traffic row's ``family`` is its key's shape part (the slug), not a length family: a row is drawn on the
    # map of the stored bucket with its key, and on one extra map when no bucket has its key
    fam_of = {b["key"]: b["family"] for b in sh["buckets"]}
    mine = [r for r in traffic if r.get("family") == sh["slug"]]
    out = []
    kinds: dict[str, int] = {}
    for fam in fams:
        tr = [r for r in mine if fam_of.get(r.get("key")) == fam]
        cells = coverage_cells(sh["buckets"], fam, lookup, b_range, t_range)
        if fam in _FAMILY_ORDER[:5]:
            for c in cells.values():
                kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1
        svg = coverage_svg(sh["buckets"], fam, lookup=lookup, b_range=b_range, t_range=t_range, traffic=tr, cells=cells)
        out.append({"family": fam, "svg": Markup(svg)})
    rest = [r for r in mine if r.get("key") not in fam_of]
    if rest:
        bs = [log2_class(max(1, int(r[k]))) for r in rest for k in ("b_min", "b_max")]
        ts = [log2_class(max(1, int(r[k]))) for r in rest for k in ("tokens_min", "tokens_max")]
        rb = range(min(bs + [b_range.start]), max(bs + [b_range.stop - 1]) + 1)
        rt = range(min(ts + [t_range.start]), max(ts + [t_range.stop - 1]) + 1)
        svg = coverage_svg([], UNBUCKETED_MAP, lookup=None, b_range=rb, t_range=rt, traffic=rest, cells={})
        out.append({"family": UNBUCKETED_MAP, "svg": Markup(svg)})
    n = sum(kinds.values())
    summary = {
        "cells": n,
        "tuned": kinds.get("measured", 0) + kinds.get("untimed", 0),
        "near": kinds.get("near", 0),
        "holes": kinds.get("hole", 0),
        "hole_pct": 100.0 * kinds.get("hole", 0) / n if n else 0.0,
        "checked": lookup is not None,
        "b_lo": 2**b_range.start,
        "b_hi": 2 ** (b_range.stop - 1),
        "t_lo": 2**t_range.start,
        "t_hi": 2 ** (t_range.stop - 1),
    }
    return out, summary


def _store_counts(sh: dict[str, Any]) -> dict[str, Any]:
    pub = [b for b in sh["buckets"] if b["policy"] is not None]
    gains = [served_gain(b["speedups"]) for b in pub]
    held = [b for b in pub if b["evidence"] == "held-out"]
    held_gains = [g for g in (served_gain(b["speedups"]) for b in held) if g]
    return {
        "buckets": len(sh["buckets"]),
        "published": len(pub),
        "gpu_tuned": sum(1 for b in pub if b["policy"]["source"] == "tuned"),
        "simulated": sum(1 for b in pub if b["policy"]["source"] == "simulated"),
        "untimed": sum(1 for b in pub if b["evidence"] == "none"),
        "training_only": sum(1 for b in pub if b["evidence"] == "training"),
        "heldout": len(held),
        "heldout_sim": bool(held) and all(b["measured_on"] == ["sim"] for b in held),
        "heldout_gain": geomean(held_gains) if held_gains else None,
        "gain_base": served_gain_base(pub),
        "heldout_worst": min(held_gains) if held_gains else None,
        "train_gain": geomean([g for g in gains if g]) if any(gains) else None,
    }


@lru_cache(maxsize=1)
def _shipped_set() -> tuple[dict[str, frozenset], int]:
    """(bucket key, policy name, params) of every shipped policy, per shape slug (:func:`queries.shape_slug`, parsed
    once per process, not once per card and page view), and the shipped table's policies_version."""
    from ...kernels.policy_table import shipped_policies

    doc = shipped_policies()
    rows: dict[str, set] = {}
    for p in doc["policies"]:
        key = p["bucket"]["key"]
        rows.setdefault(queries.shape_slug(key), set()).add((key, p["name"], json.dumps(p["params"], sort_keys=True)))
    return {k: frozenset(v) for k, v in rows.items()}, int(doc.get("policies_version") or 0)


def _served_is_shipped(sh: dict[str, Any]) -> tuple[bool, int, int]:
    """Whether the store's published policies of shape ``sh`` are the shipped table's (the plans the peer timings
    are of); the number of published policies that differ and the shipped table's version."""
    shipped, version = _shipped_set()
    mine = {
        (b["key"], b["policy"]["name"], json.dumps(b["policy"]["params"], sort_keys=True))
        for b in sh["buckets"]
        if b["policy"] is not None
    }
    theirs = shipped.get(sh["slug"], frozenset())
    differ = len(mine ^ theirs)
    return differ == 0, differ, version


def _headline(ev: dict[str, Any] | None) -> list[str]:
    """Plain sentences of what the served plan gains on held-out batches (measured rows only); the worst batch to
    three decimals, so a loss under 0.5 % does not read as 1.00x."""
    if ev is None:
        return []
    lines = []
    for st in ev["sets"]:
        parts = []
        for r in st["rows"]:
            if r["implementation"] == SERVED or not r["n"] or r.get("speedup_geomean") is None:
                continue
            parts.append((r["speedup_geomean"], r["name"].split(" (")[0], r["speedup_min"]))
        if parts:
            what = "reference batches" if st["cases"] == "reference" else "batches from real traces"
            text = ", ".join(
                Markup("<b>{:.2f}×</b> {}{} (worst batch {:.3f}×)").format(g, "" if i else "faster than ", n, w)
                for i, (g, n, w) in enumerate(parts)
            )
            lines.append(Markup("On {} held-out {}, the served plan is ").format(st["n"], what) + Markup(text) + ".")
    return lines


def summary_context(url: str, table: Any = None) -> dict[str, Any]:
    """Context of the summary page (``/``)."""
    data = queries.dashboard_data(url)
    traffic, traffic_note = traffic_rows(url, TRAFFIC_HOURS)
    shapes = []
    for sh in data["shapes"]:
        ev = shape_evidence(
            sh["gpu"],
            num_kv_heads=sh["num_kv_heads"],
            head_dim=sh["head_dim"],
            dtype=sh["dtype"],
            page_size=sh["page_size"],
            kv_dtype=sh["kv_dtype"],
            q_len=sh["q_len"],
        )
        runs: dict[tuple, list] = {}
        for p in (ev or {}).get("provenance", []):
            runs.setdefault((p["run"], p["measured"], p["gpu"]), []).append(p)
        prov = []
        for (run, measured, gpu), files in runs.items():
            versions = []
            for f in files:
                for v in f["versions"].split(", "):
                    v = v.replace(" ?", " (version not recorded)")
                    if v and v not in versions:
                        versions.append(v)
            prov.append(
                {
                    "run": run,
                    "measured": measured,
                    "gpu": gpu,
                    "files": files,
                    "versions": ", ".join(versions),
                    "read_bw": ", ".join(sorted({f"{f['read_bandwidth_tbps']:.2f}" for f in files})),
                }
            )
        same, differ, shipped_version = _served_is_shipped(sh)
        shapes.append(
            {
                **sh,
                "model": shape_name(sh["num_kv_heads"], sh["head_dim"]),
                "evidence": ev,
                "served_is_shipped": same,
                "served_differs": differ,
                "shipped_version": shipped_version,
                "headline": _headline(ev),
                "provenance": prov,
                "counts": _store_counts(sh),
            }
        )
        shapes[-1]["coverage"], shapes[-1]["cov"] = _coverage(sh, table, traffic)
    fams = traffic_families(url, traffic, data["shapes"]) if traffic else []
    for sh in shapes:
        sh["traffic"] = next((f for f in fams if f["family"] == sh["slug"]), None)
    return {
        "traffic_families": fams,
        "traffic_hours": TRAFFIC_HOURS,
        "far_distance": FAR_DISTANCE,
        "serve_distance_limit": SERVE_DISTANCE_LIMIT,
        "shapes": shapes,
        "version": data["version"],
        "n_published": sum(s["counts"]["published"] for s in shapes),
        "traffic_note": traffic_note,
        "runs": data["runs"][:10],
    }


def _sort_key(col: str):
    def k(b: dict[str, Any]) -> tuple:
        if col == "family":
            f = b["family"]
            return ((_FAMILY_ORDER + (f,)).index(f), b["batch_size"] or 0, b["key"])
        v = {
            "B": b["batch_size"],
            "tokens": b["total_tokens"],
            "policy": b["policy"]["id"] if b["policy"] else None,
            "time": b["ratios"].get("tuned"),
            "gain": b["speedups"].get("balanced"),
            "key": b["key"],
        }[col]
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        return (v is None, v if v is not None else 0)

    return k


def _family_charts(sh: dict[str, Any], ev: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per family: the held-out peer timings (time / read floor against B, one chart per T) and the store's."""
    charts = []
    fams = list(sh["families"])
    peer_rows: dict[tuple[str, str], dict[str, list]] = {}
    if ev is not None:
        from .evidence import IMPLEMENTATIONS

        drawn: set[str] = set()
        for e in ev["entries"]:
            # the reference sets; one series per implementation (its first imported run, as the headline)
            if e["cases"] != "reference" or e["implementation"] in drawn:
                continue
            drawn.add(e["implementation"])
            name = IMPLEMENTATIONS.get(e["implementation"], e["implementation"]).split(" (")[0]
            for _, setname, fam, B, _, _, ratio in e["rows"]:
                # bench/peers.py tags the sets of an FP8 cache or q_len > 1 ("T262144/fp8/q4"); ev is one family's
                setname = setname.split("/")[0]
                peer_rows.setdefault((fam, setname), {}).setdefault(name, []).append((B, ratio))
    for fam in _FAMILY_ORDER:
        for setname in ("T262144", "T1048576"):
            d = peer_rows.get((fam, setname))
            if not d:
                continue
            series = [(n, pts) for n, pts in d.items()]
            T = int(setname[1:])
            charts.append(
                {
                    "family": fam,
                    "kind": "held-out",
                    "svg": Markup(
                        line_chart(
                            series,
                            title=f"{fam}, T = {T:,}: held-out, measured",
                            x_label="batch size B",
                            y_label="time / read floor",
                        )
                    ),
                }
            )
    for fam in fams:
        series = [
            (n, pts, "simulated" if n.endswith(SIMULATED_SUFFIX) else "measured") for n, pts in sh["families"][fam]
        ]
        charts.append(
            {
                "family": fam,
                "kind": "store",
                "svg": Markup(
                    line_chart(
                        series,
                        title=f"{fam}: tuned buckets (store)",
                        x_label="batch size B",
                        y_label="time / HBM floor",
                    )
                ),
            }
        )
    return charts


def shape_context(url: str, slug: str, tq: TableQuery, table: Any = None) -> dict[str, Any] | None:
    """Context of one shape's page, or None when neither a bucket nor the recorded traffic has that shape.

    Raises QueryError naming ``family`` when it is neither a length family (:data:`queries.FAMILY_NAMES`) nor
    one of the shape's buckets' families."""
    data = queries.dashboard_data(url)
    traffic, traffic_note = traffic_rows(url, TRAFFIC_HOURS)
    sh = next((s for s in data["shapes"] if s["slug"] == slug), None)
    if sh is None:
        sh = _traffic_shape(slug, traffic)
    if sh is None:
        return None
    ev = shape_evidence(
        sh["gpu"],
        num_kv_heads=sh["num_kv_heads"],
        head_dim=sh["head_dim"],
        dtype=sh["dtype"],
        page_size=sh["page_size"],
        kv_dtype=sh["kv_dtype"],
        q_len=sh["q_len"],
    )
    rows = sh["buckets"]
    if tq.family:
        known = sorted(set(queries.FAMILY_NAMES) | {b["family"] for b in rows})
        if tq.family not in known:
            raise QueryError("family", f"expected one of {', '.join(known)}, got {tq.family[:40]!r}")
        rows = [b for b in rows if b["family"] == tq.family]
    if tq.source == "none":
        rows = [b for b in rows if b["policy"] is None]
    elif tq.source:
        rows = [b for b in rows if b["policy"] is not None and b["policy"]["source"] == tq.source]
    if tq.q:
        ql = tq.q.lower()
        rows = [b for b in rows if ql in b["key"].lower() or ql in (b["source"] or "").lower()]
    rows = sorted(rows, key=_sort_key(tq.sort), reverse=tq.order == "desc")
    if tq.order == "desc":  # unmeasured rows last either way
        rows = [b for b in rows if _sort_key(tq.sort)(b)[0] is False] + [
            b for b in rows if _sort_key(tq.sort)(b)[0] is True
        ]
    n = len(rows)
    pages = max(1, -(-n // tq.per_page))
    page = min(tq.page, pages)
    shown = rows[(page - 1) * tq.per_page : page * tq.per_page]
    baselines = [b for b in BASELINES if any(b in r["speedups"] for r in sh["buckets"])]
    from .viewer import viewer_calibration

    held = (viewer_calibration(url, sh)[2] or {}).get("heldout") or {}
    sim_error = (
        f"predicted by the calibrated simulator: its error against GPU timings it was not fitted on is "
        f"{100 * held['median']:.1f} % median, {100 * held['worst']:.1f} % worst"
        if "median" in held and "worst" in held
        else "predicted by the simulator; no calibration error stored for this GPU"
    )
    return {
        "sim_error": sim_error,
        "has_sim": any("sim" in b["measured_on"] for b in sh["buckets"] if b["policy"] is not None),
        "sh": {**sh, "model": shape_name(sh["num_kv_heads"], sh["head_dim"])},
        "rows": shown,
        "n_rows": n,
        "page": page,
        "pages": pages,
        "tq": tq,
        "baselines": baselines,
        "families": sorted({b["family"] for b in sh["buckets"]}, key=lambda f: (_FAMILY_ORDER + (f,)).index(f)),
        "coverage": _coverage(sh, table, traffic)[0],
        "unbucketed_map": UNBUCKETED_MAP,
        "traffic_note": traffic_note,
        "charts": _family_charts(sh, ev),
        "sort_columns": SORT_COLUMNS,
        "version": data["version"],
    }
