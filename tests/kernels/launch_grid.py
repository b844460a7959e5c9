"""The launch parameters ``launch_decode`` picks, recorded over a grid of inputs (tests/data/launch_rule.json).

    python -m tests.kernels.launch_grid --rev d1c77fc --out tests/data/launch_rule.json

records, for every point of :func:`grid`, the keywords of the stage-1 and merge launches that
``kernels/decode.py`` *of git revision REV* passes to its kernels (the kernel objects swapped for recorders, so
nothing runs; the launcher's own code picks every value). ``--rev`` loads that revision's decode.py from git
into the installed ``kvsplit.kernels`` package (its relative imports resolve to the working tree's modules);
without ``--rev`` the working tree's ``kvsplit.kernels.decode`` is recorded. The file in tests/data was
recorded from the launcher before its A/B switches were removed (revision d1c77fc), so the test that reads it
checks that the fixed rule picks, for every input, what the old defaults picked.

A point fixes what the pick depends on: the GQA shape and head dim, the K/V element size, the kernel config,
the host-known sizes (num_merge, max_splits) or a device-resident plan (``counts``, ``max_merge``), whether
PDL is available (``_pdl_available``), whether the kernel is compiled (``_INTERPRETED`` false: register caps
apply) and the workspace's overlap counters (full, missing, too few).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import itertools
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from kvsplit.kernels.device_plan import LAUNCH_ARRAYS
from kvsplit.kernels.limits import KernelConfig

ROOT = Path(__file__).resolve().parents[2]
STAGE1_KEYS = ("maxnreg", "SIGNAL", "MERGE_DS", "PDL", "PDL_LAST", "PREFETCH", "NEXT", "BLOCK_H", "num_warps")
INPUT_KEYS = (
    "d", "hq", "hkv", "cfg", "dtype", "compiled", "B", "num_merge", "max_splits", "resident", "wide", "pdl", "sync",
    "schedule",
)  # fmt: skip
MERGE_KEYS = ("num_warps", "BLOCK_S", "BLOCK_D", "WAIT", "POLL_NS", "POLL_RELAXED", "launch_pdl")

CONFIGS = {
    "64,4,2": KernelConfig(64, 4, 2),  # register-capped at D 128 bf16, G != 8
    "128,4,2": KernelConfig(128, 4, 2),
    "64,4,3p": KernelConfig(64, 4, 3, prefetch=True),
    "32,4,3p_h2": KernelConfig(32, 4, 3, prefetch=True, heads_per_tile=2),
    "64,8,3p_nx_h2": KernelConfig(64, 8, 3, prefetch=True, next_item=True, heads_per_tile=2),
}
SIZES = [  # (B, num_merge, max_splits)
    (2, 2, 40),
    (2, 2, 32),
    (5, 5, 2),
    (7, 7, 40),
    (8, 8, 40),
    (8, 8, 2),
    (33, 33, 40),
    (64, 64, 3),
    (64, 0, 1),
    (256, 200, 9),
    (40, 40, 300),
]


def grid() -> list[dict[str, Any]]:
    """The recorded inputs: register caps over (D, G, config, dtype, compiled), the merge over (H_q, D, sizes,
    plan kind, PDL, counters) at a few configs."""
    pts = []
    for d, (hq, hkv), cfg, dt, compiled in itertools.product(
        (64, 128, 256), ((8, 8), (16, 4), (32, 4), (64, 4), (28, 4)), CONFIGS, ("bfloat16", "float32"), (True, False)
    ):
        c = CONFIGS[cfg]
        if c.heads_per_tile * hq // hkv > 16:
            continue
        pts.append(
            dict(
                d=d, hq=hq, hkv=hkv, cfg=cfg, dtype=dt, compiled=compiled, B=3, num_merge=3, max_splits=4,
                resident=False, pdl=compiled, sync="full", schedule="grid",
            )
        )  # fmt: skip
    for d, hq, (B, nm, ms), kind, pdl, sync, cfg in itertools.product(
        (64, 128, 256),
        (8, 32, 64),
        SIZES,
        ("host", "host_persistent", "resident", "resident_wide"),
        (True, False),
        ("full", "none", "short"),
        ("128,4,2",),
    ):
        pts.append(
            dict(
                d=d, hq=hq, hkv=4, cfg=cfg, dtype="bfloat16", compiled=True, B=B, num_merge=nm, max_splits=ms,
                resident=kind.startswith("resident"), wide=kind == "resident_wide", pdl=pdl, sync=sync,
                schedule="grid" if kind == "host" else "persistent",
            )
        )  # fmt: skip
    return pts


class _Recorder:
    def __init__(self, calls: list, name: str) -> None:
        self.calls, self.name = calls, name

    def __getitem__(self, grid):
        return lambda *a, **k: self.calls.append((self.name, list(grid), k))


def record(dec: Any, p: dict[str, Any]) -> dict[str, Any]:
    """The stage-1 and merge launch keywords ``dec.launch_decode`` passes at point ``p``."""
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[p["dtype"]]
    B, hq, hkv, d = p["B"], p["hq"], p["hkv"], p["d"]
    cfg = CONFIGS[p["cfg"]]
    if p["schedule"] == "persistent":
        cfg = dataclasses.replace(cfg, schedule="persistent", num_programs=528)
    q = torch.zeros((B, hq, d), dtype=dtype)
    k = torch.zeros((1, 16, hkv, d), dtype=dtype)
    ws = dec.make_workspace(hq, d, max_partials=1, max_batch=B, device="cpu")
    if p["sync"] == "none":
        ws = dataclasses.replace(ws, sync=None)
    elif p["sync"] == "short":
        ws = dataclasses.replace(ws, sync=ws.sync[:5])
    arrays = {n: torch.zeros(1, dtype=torch.int32) for n in LAUNCH_ARRAYS}
    if p["resident"]:
        sizes = dict(counts=torch.zeros(4, dtype=torch.int32), max_merge=4 * B if p.get("wide") else B)
    else:
        nm = p["num_merge"]
        sizes = dict(num_tiles=7 * hkv // cfg.heads_per_tile, num_merge=nm, max_splits=p["max_splits"])
    calls: list = []
    saved = {n: getattr(dec, n) for n in ("_decode_stage1_kernel", "_decode_merge_kernel", "_pdl_available")}
    saved_interp = dec._INTERPRETED
    dec._decode_stage1_kernel = _Recorder(calls, "stage1")
    dec._decode_merge_kernel = _Recorder(calls, "merge")
    dec._pdl_available = lambda device: p["pdl"]
    dec._INTERPRETED = not p["compiled"]
    try:
        dec.launch_decode(
            q, k, k, torch.zeros(B + 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), arrays, cfg,
            out=torch.empty_like(q), workspace=ws, **sizes,
        )  # fmt: skip
    finally:
        for n, v in saved.items():
            setattr(dec, n, v)
        dec._INTERPRETED = saved_interp
    out: dict[str, Any] = {}
    for name, g, kw in calls:
        keys = STAGE1_KEYS if name == "stage1" else MERGE_KEYS
        out[name] = {"grid": g, **{key: kw.get(key) for key in keys}}
    return out


def as_row(p: dict[str, Any], got: dict[str, Any]) -> list:
    """One row of the JSON file: the point's inputs, the stage-1 launch, the merge launch (or None)."""
    return [
        [p.get(k) for k in INPUT_KEYS],
        [got["stage1"]["grid"]] + [got["stage1"][k] for k in STAGE1_KEYS],
        [got["merge"]["grid"]] + [got["merge"][k] for k in MERGE_KEYS] if "merge" in got else None,
    ]


def load(path: Path = ROOT / "tests/data/launch_rule.json") -> list[tuple[dict[str, Any], list]]:
    """The recorded rows as (point, row) pairs."""
    doc = json.loads(Path(path).read_text())
    return [(dict(zip(doc["input_keys"], r[0])), r) for r in doc["points"]]


def load_revision(rev: str) -> Any:
    """``kernels/decode.py`` of git revision ``rev``, imported as a module of the installed kvsplit.kernels."""
    src = subprocess.run(
        ["git", "show", f"{rev}:kernels/decode.py"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    tmp = Path(tempfile.mkdtemp()) / f"decode_{rev}.py"
    tmp.write_text(src)
    name = f"kvsplit.kernels.decode_{rev}"
    spec = importlib.util.spec_from_file_location(name, tmp)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default=None, help="git revision whose kernels/decode.py is recorded (default: the tree)")
    ap.add_argument("--out", default=None, help="write the JSON here (default: stdout)")
    args = ap.parse_args(argv)
    if args.rev:
        dec = load_revision(args.rev)
    else:
        from kvsplit.kernels import decode as dec
    rows = [as_row(p, record(dec, p)) for p in grid()]
    doc = {
        "about": "launch keywords of kernels/decode.py::launch_decode at revision "
        f"{args.rev or 'working tree'} over tests/kernels/launch_grid.py's grid (its module doc)",
        "command": "TRITON_INTERPRET=1 python -m tests.kernels.launch_grid"
        + (f" --rev {args.rev}" if args.rev else "")
        + " --out tests/data/launch_rule.json",
        "input_keys": INPUT_KEYS,
        "stage1_keys": ("grid",) + STAGE1_KEYS,
        "merge_keys": ("grid",) + MERGE_KEYS,
        "points": rows,
    }
    head = json.dumps({**doc, "points": None}, separators=(",", ":"))
    body = ",\n".join(json.dumps(r, separators=(",", ":")) for r in rows)
    text = head.replace('"points":null', '"points":[\n' + body + "\n]")
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
