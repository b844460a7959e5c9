"""Held-out kernel timings of the served plan beside its peers, as the dashboard's headline shows them.

The figures come from ``bench/peers.py`` runs on a GPU (one CSV per implementation and case set, with a JSON of the
versions and bandwidth beside it; docs/results.md). :func:`import_peer_csvs` copies such CSVs into one package data
file, ``kvsplit/service/data/peer_timings.json`` (the documented import step, run from the repository root)::

    python -m kvsplit.service.dashboard.evidence --measured 2026-12-04 docs/results/h200/*.csv

:func:`load_peer_timings` reads it back and :func:`shape_evidence` summarises one (GPU, shape): per case set
(``reference`` = the five length families x B 1..512 x T 262,144 and 1,048,576; ``traces`` = held-out batches
of the shipped traces), per implementation, the geometric mean and worst time / read floor, and the served plan's
speed-up over it (implementation time / served time on the same case, geomean and minimum). None of these batches
is a policy's training batch: the shipped policies were tuned on jittered draws around the families (each length x
U(0.9, 1.1)) and on other trace steps (``kvsplit.tuner.workloads``), so these are held-out batches.
Nothing is computed here that was not measured: an implementation without rows for a set is "not measured".
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import math
import sys
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "DATA_FILE",
    "IMPLEMENTATIONS",
    "SERVED",
    "import_peer_csvs",
    "load_peer_timings",
    "shape_evidence",
    "geomean",
]

DATA_FILE = "peer_timings.json"
"""Name of the package data file in ``kvsplit.service.data``."""
SERVED = "kvsplit"
"""``bench/peers.py``'s name of the served plan (the shipped table's plan on kvsplit's kernel)."""
IMPLEMENTATIONS: dict[str, str] = {
    "kvsplit": "served plan (tuned table)",
    "kvsplit_balanced": "balanced (untuned fallback, same kernel)",
    "flashinfer_batch_attention": "FlashInfer BatchAttention",
    "flashinfer_decode": "FlashInfer decode wrapper (tensor cores)",
    "fa3": "FlashAttention-3 (num_splits=0)",
}
"""Display name of each ``bench/peers.py`` implementation, in the headline's order."""
_CSV_COLUMNS = ("implementation", "set", "family", "B", "total_tokens", "time_us", "ratio_to_read_floor")
_META_KEYS = ("gpu", "torch", "triton", "cuda", "label", "peer_version", "read_bandwidth_bytes_per_s", "cases")
_SHAPE_KEYS = ("num_qo_heads", "num_kv_heads", "head_dim", "dtype", "page_size")


def geomean(xs: Sequence[float]) -> float:
    """Geometric mean of the finite positive values of ``xs``; NaN when there is none."""
    v = [float(x) for x in xs if x is not None and math.isfinite(x) and x > 0]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else float("nan")


def _read_csv(path: Path) -> list[list[Any]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = set(_CSV_COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)}")
        rows = []
        for i, r in enumerate(reader, start=2):
            try:
                rows.append(
                    [
                        r["implementation"],
                        r["set"],
                        r["family"],
                        int(r["B"]),
                        int(r["total_tokens"]),
                        float(r["time_us"]),
                        float(r["ratio_to_read_floor"]),
                    ]
                )
            except ValueError as exc:
                raise ValueError(f"{path}:{i}: {exc}") from None
            if not (rows[-1][5] > 0 and rows[-1][6] > 0):
                raise ValueError(f"{path}:{i}: time_us and ratio_to_read_floor must be > 0")
    return rows


def import_peer_csvs(paths: Sequence[str | Path], *, measured: str, run: str | None = None) -> dict[str, Any]:
    """The data-file document of ``bench/peers.py`` CSVs (each with its ``<csv>.json`` beside it).

    Parameters
    ----------
    paths : sequence of path
        CSVs with the columns ``implementation, set, family, B, total_tokens, time_us, ratio_to_read_floor``.
    measured : str
        ISO date (``YYYY-MM-DD``) the CSVs were measured on (the JSONs do not record it).
    run : str, optional
        A name for this group of CSVs (timed in one session on one machine); the served plan's speed-up over an
        implementation uses the served timings of the same run where the run has them. Default ``measured``.

    Returns
    -------
    dict
        ``{"format": "kvsplit.peer_timings", "format_version": 1, "sets": [...]}``, one entry per CSV: its
        implementation, case set, ``run``, ``measured``, ``source`` (file name), ``shape``, GPU, software versions,
        read bandwidth, the ``kv_dtype`` and ``q_len`` it was timed at (when its JSON records them) and ``rows`` ``[set, family, B, total_tokens, time_us, ratio_to_read_floor]``.

    Raises
    ------
    ValueError
        ``measured`` is not an ISO date; a CSV or its JSON is missing, malformed, or names no shape and no other
        CSV of the same call does; a CSV mixes implementations.
    """
    try:
        _dt.date.fromisoformat(measured)
    except (TypeError, ValueError):
        raise ValueError(f"measured: expected an ISO date YYYY-MM-DD, got {measured!r}") from None
    entries = []
    for p in map(Path, paths):
        meta_path = Path(str(p) + ".json")
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{meta_path}: {exc}") from None
        rows = _read_csv(p)
        impls = {r[0] for r in rows}
        if len(impls) != 1:
            raise ValueError(f"{p}: expected one implementation per file, got {sorted(impls)}")
        entries.append(
            {
                "implementation": rows[0][0],
                "cases": meta.get("cases", ""),
                "run": run or measured,
                "measured": measured,
                "source": p.name,
                "shape": meta.get("shape"),
                **{k: meta[k] for k in _META_KEYS if k in meta and k != "cases"},
                # the family it was timed at (shape_evidence matches it), when the JSON records it
                **({"kv_dtype": str(meta["kv_dtype"]).removeprefix("torch.")} if meta.get("kv_dtype") else {}),
                **({"q_len": int(meta["q_len"])} if meta.get("q_len") else {}),
                "rows": rows,
            }
        )
    shapes = {json.dumps(e["shape"], sort_keys=True) for e in entries if e["shape"]}
    if len(shapes) > 1:
        raise ValueError(f"the CSVs were measured on different shapes {sorted(shapes)}: import them separately")
    for e in entries:
        if not e["shape"]:
            if not shapes:
                raise ValueError(f"{e['source']}: its JSON names no shape and no other file of this import does")
            e["shape"] = json.loads(next(iter(shapes)))
        if set(_SHAPE_KEYS) - set(e["shape"]):
            raise ValueError(f"{e['source']}: shape lacks {sorted(set(_SHAPE_KEYS) - set(e['shape']))}")
    return {
        "format": "kvsplit.peer_timings",
        "format_version": 1,
        "source": "bench/peers.py CSVs (docs/results.md), imported by python -m kvsplit.service.dashboard.evidence",
        "sets": entries,
    }


@lru_cache(maxsize=1)
def load_peer_timings() -> tuple[dict[str, Any], ...]:
    """The entries of the shipped ``peer_timings.json`` (empty when the file is absent)."""
    try:
        text = resources.files("kvsplit.service").joinpath("data", DATA_FILE).read_text()
    except (FileNotFoundError, OSError):
        return ()
    doc = json.loads(text)
    return tuple(doc.get("sets", ()))


def _gpu_matches(a: str, b: str) -> bool:
    """Same GPU: equal slugs of the names, a known alias (``"h200"``) resolved to its GPU's name first."""
    from ...kernels.buckets import gpu_slug
    from ...kernels.device import resolve_device

    def canon(name: str) -> str:
        try:
            name = resolve_device(name).name
        except ValueError:
            pass
        return gpu_slug(name)

    try:
        return canon(a) == canon(b)
    except ValueError:
        return False


def _entry_family(e: dict[str, Any]) -> tuple[str, int]:
    """(KV dtype, q_len) a data-file entry was timed at: its ``kv_dtype`` / ``q_len`` (``bench/peers.py``'s JSON
    writes torch's name, ``"torch.float8_e4m3fn"``), else K/V in the shape's dtype at q_len 1 (entries imported
    from JSONs that do not record them)."""
    kv = str(e.get("kv_dtype") or e["shape"]["dtype"]).removeprefix("torch.")
    return kv, int(e.get("q_len") or 1)


def shape_evidence(
    gpu: str,
    *,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
    page_size: int,
    kv_dtype: str | None = None,
    q_len: int = 1,
    entries: Sequence[dict] | None = None,
) -> dict[str, Any] | None:
    """Held-out peer timings of one (GPU, shape) of one bucket family (``kv_dtype`` None: K/V in ``dtype``;
    ``q_len``), or None when none were measured: timings of another KV dtype or q_len are another family's.

    Returns
    -------
    dict or None
        ``{"sets": [{"cases", "label", "n", "rows": [{"implementation", "name", "n", "geomean", "worst",
        "speedup_geomean", "speedup_min", "paired"}]}], "provenance": [...], "shape": {...}, "entries": [...]}``
        (``entries``: the data file's sets of this GPU and shape, in import order): ``geomean`` /
        ``worst`` are of time / read floor; ``speedup_*`` of (implementation time / served time) per case, paired by
        (set, family, B, total tokens), None for the served plan itself. ``provenance`` lists each CSV's
        implementation, date, GPU, versions and file. Implementations of :data:`IMPLEMENTATIONS` without rows for a
        set are listed with ``n`` 0 ("not measured").
    """
    entries = load_peer_timings() if entries is None else entries
    mine = [
        e
        for e in entries
        if _gpu_matches(e.get("gpu", ""), gpu)
        and e["shape"]["num_kv_heads"] == num_kv_heads
        and e["shape"]["head_dim"] == head_dim
        and e["shape"]["dtype"] == dtype
        and e["shape"]["page_size"] == page_size
        and _entry_family(e) == (kv_dtype or dtype, int(q_len))
    ]
    if not mine:
        return None
    sets_out = []
    for cases in ("reference", "traces"):
        group = [e for e in mine if e["cases"] == cases]
        if not group:
            continue
        served_by_run = {e["run"]: e for e in group if e["implementation"] == SERVED}
        primary = next(iter(served_by_run.values()), None)
        rows = []
        impls = list(IMPLEMENTATIONS) + sorted({e["implementation"] for e in group} - set(IMPLEMENTATIONS))
        for impl in impls:
            es = [e for e in group if e["implementation"] == impl]
            if not es:
                rows.append({"implementation": impl, "name": IMPLEMENTATIONS.get(impl, impl), "n": 0})
                continue
            e = es[0]  # one CSV per (implementation, case set) and run; the first imported wins
            ratios = [r[6] for r in e["rows"]]
            row = {
                "implementation": impl,
                "name": IMPLEMENTATIONS.get(impl, impl),
                "n": len(ratios),
                "geomean": geomean(ratios),
                "worst": max(ratios),
                "measured": e["measured"],
                "run": e["run"],
                "speedup_geomean": None,
                "speedup_min": None,
                "paired": 0,
            }
            base = served_by_run.get(e["run"], primary)
            if impl != SERVED and base is not None:
                served_t = {tuple(r[1:5]): r[5] for r in base["rows"]}
                sp = [r[5] / served_t[tuple(r[1:5])] for r in e["rows"] if tuple(r[1:5]) in served_t]
                if sp:
                    row.update(speedup_geomean=geomean(sp), speedup_min=min(sp), paired=len(sp), served_run=base["run"])
            rows.append(row)
        n = max(len(e["rows"]) for e in group)
        label = (
            f"{n} reference batches (5 length families × B 1–512 × T 262,144 and 1,048,576)"
            if cases == "reference"
            else f"{n} held-out batches of real traces (continuous batching replayed)"
        )
        sets_out.append({"cases": cases, "label": label, "n": n, "rows": rows})
    prov = [
        {
            "implementation": e["implementation"],
            "name": IMPLEMENTATIONS.get(e["implementation"], e["implementation"]),
            "label": e.get("label", ""),
            "cases": e["cases"],
            "measured": e["measured"],
            "run": e["run"],
            "gpu": e.get("gpu", ""),
            "versions": ", ".join(f"{k} {e[k]}" for k in ("torch", "triton", "cuda") if e.get(k))
            + (f", {e['peer_version']}" if e.get("peer_version") else ""),
            "read_bandwidth_tbps": (e.get("read_bandwidth_bytes_per_s") or 0) / 1e12,
            "source": e["source"],
        }
        for e in mine
    ]
    return {"sets": sets_out, "provenance": prov, "shape": dict(mine[0]["shape"]), "entries": mine}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvsplit.service.dashboard.evidence``: write the package data file from peer CSVs."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+", type=Path, help="bench/peers.py CSVs, each with <csv>.json beside it")
    ap.add_argument("--measured", required=True, help="ISO date the CSVs were measured on")
    ap.add_argument("--run", default=None, help="name of this group of CSVs (default: the date)")
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "data" / DATA_FILE,
        help="the data file (default: service/data/peer_timings.json of this checkout)",
    )
    ap.add_argument("--append", action="store_true", help="keep the sets already in --out (another run)")
    args = ap.parse_args(argv)
    try:
        doc = import_peer_csvs(args.csv, measured=args.measured, run=args.run)
    except ValueError as exc:
        ap.error(str(exc))
    if args.append and args.out.exists():
        old = json.loads(args.out.read_text())
        doc["sets"] = old.get("sets", []) + doc["sets"]
    args.out.write_text(json.dumps(doc, indent=None, separators=(",", ":")) + "\n")
    print(f"{len(doc['sets'])} case sets -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
