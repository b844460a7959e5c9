"""Write the case file of ``bench/gpu_sweep.py`` (CPU only): every batch the H200
sweep times, with the plan the round-1 service served for it.

Sets (DESIGN.md §6; issue 9's targets):
- ``ref``: the 96 reference cases (5 families x B 1..512 x T 262,144 / 1,048,576), Qwen3-30B-A3B shape;
- ``jitter``: held-out jittered draws of reference cases (``family_batches(role="heldout")``);
- ``untuned``: B in {24, 96, 384, 1024} at T = 524,288, every family;
- ``llama8b``: the Llama-3.1-8B shape (32/8/128) on family batches;
- ``trace``: held-out trace batches (``trace_batches``) of every shipped trace, B in {8, 32, 128, 512, 1024}.

Usage: python scripts/make_sweep_cases.py bench/data/sweep_cases.json           (evaluation sets above)
       python scripts/make_sweep_cases.py --oracle-from docs/data/h200_r2/final.jsonl bench/data/sweep_cases.json
       python scripts/make_sweep_cases.py --train bench/data/train_cases.json    (training draws only)
       python scripts/make_sweep_cases.py --alt-policies OTHER_POLICIES.json bench/data/sweep_cases.json
           (adds ``served_alt``: what another candidate table serves each case)

``--train`` writes the tuning set instead: jittered *training* draws
(``family_batches(role="train")``, never the reference batches themselves) of every family at
B 1..1024 and T 262,144 / 1,048,576, training trace batches of every shipped trace at B 8..1024,
the Llama-3.1-8B (32/8/128) and Llama-3.1-70B TP8 (8/1/128) shapes, and (set ``train_even``) near-equal
lengths (U(0.995, 1.005)) at B 16..1024 and totals drawn around 2^17..2^20 for 32/4 and 32/8.
"""

from __future__ import annotations

import json
import sys
import tempfile

import numpy as np

from kvsplit.db import store
from kvsplit.kernels.policy_table import PolicyTable
from kvsplit.tuner.published import load_table_doc
from kvsplit.tuner.workloads import FAMILIES, family_batches, family_kv_lens, reference_cases, trace_batches


def train_cases() -> list[dict]:
    cases: list[dict] = []

    def add(set_name, fam, B, T, lens, hq=32, hkv=4):
        cases.append({"id": len(cases), "set": set_name, "family": fam, "B": int(len(lens)), "B_nominal": int(B),
                      "T": int(T), "num_qo_heads": hq, "num_kv_heads": hkv, "kv_lens": [int(x) for x in lens]})

    for T in (262_144, 1_048_576):
        for fam in FAMILIES:
            for B in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
                if (fam == "2x40" and B < 3) or (B == 1 and fam != "uniform"):
                    continue
                add("train", fam, B, T, family_batches(fam, B, T, num_batches=1, seed=11, role="train")[0])
    from kvsplit.tuner.workloads import TRACES
    for name in TRACES:
        for B in (8, 16, 32, 64, 128, 256, 512, 1024):
            try:
                train, _ = trace_batches(name, B, num_train=1, num_heldout=1, seed=0)
            except ValueError as exc:
                print(f"skip trace {name} B={B}: {exc}", file=sys.stderr)
                continue
            add("train_trace", name, B, int(train[0].sum()), train[0])
    for hq, hkv, Bs in ((32, 8, (1, 4, 16, 64, 256)), (8, 1, (1, 4, 16, 64, 256))):
        for T in (262_144, 1_048_576):
            for fam in ("uniform", "skewed80", "2x40"):
                for B in Bs:
                    if (fam == "2x40" and B < 3) or (B == 1 and fam != "uniform"):
                        continue
                    add(f"train_{hq}_{hkv}", fam, B, T, family_batches(fam, B, T, num_batches=1, seed=11,
                                                                      role="train")[0], hq=hq, hkv=hkv)
    # near-equal lengths (round 4): requests started together with one prompt length decode in lockstep
    # (fixed-length benchmarks, synchronous batches), a case the +-10 % draws above never show. Each batch
    # is U(0.995, 1.005) around an even split of a T drawn log-uniformly within an octave around 2^17,
    # 2^18, 2^19 or 2^20 (never the reference totals themselves), for both model shapes.
    rng = np.random.default_rng(20261201)
    for hq, hkv in ((32, 4), (32, 8)):
        for B in (16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024):
            for e in (17, 18, 19, 20):
                T = int(round(2 ** (e + rng.uniform(-0.45, 0.45))))
                lens = np.maximum(np.rint(T / B * rng.uniform(0.995, 1.005, size=B)).astype(np.int64), 1)
                add("train_even", "uniform", B, int(lens.sum()), lens, hq=hq, hkv=hkv)
    return cases


def add_oracle_names(path: str, grid_run: str, top: int = 3) -> None:
    """Add each case's ``top`` fastest plans of a run (the oracle's winners) to the case file's
    ``oracle_names``, after those already there (from an earlier ``--oracle-from``), for
    ``bench/gpu_sweep.py --mode retime``."""
    doc = json.load(open(path))
    for line in open(grid_run):
        r = json.loads(line)
        if r["kind"] != "case":
            continue
        t = {k: v for k, v in r["times"].items() if v and k not in ("flashinfer_kernel", "served", "served_r1")
             and "|" in k}
        have = doc["cases"][r["case"]].get("oracle_names", [])
        doc["cases"][r["case"]]["oracle_names"] = have + [k for k in sorted(t, key=t.get)[:top] if k not in have]
    json.dump(doc, open(path, "w"))
    print(f"oracle winners of {grid_run} -> {path}")


def served_by(table: PolicyTable, case: dict) -> dict:
    """What ``table`` serves the case's batch (the reference shape's head_dim 128, bf16, page 16): the policy,
    its params, the table's source and the bucket it matched at which distance."""
    p, bucket, info = table.plan(np.asarray(case["kv_lens"]), gpu="NVIDIA H200", num_qo_heads=case["num_qo_heads"],
                                 num_kv_heads=case["num_kv_heads"], head_dim=128, dtype="bfloat16", page_size=16)
    return {"policy": p.policy, "params": p.params, "source": info["source"], "distance": bucket["distance"],
            "matched": bucket["matched"]}


def add_alt(path: str, policies_path: str) -> None:
    """Add ``served_alt`` to every case of the case file at ``path``: the plan that the policies export at
    ``policies_path`` (a candidate table, e.g. another build of scripts/build_shipped_policies.py) serves it, as
    ``served`` is for the shipped one. bench/gpu_sweep.py --mode retime times it back to back with ``served``
    and ``served_prev``, so two candidate tables are compared in one run."""
    table = PolicyTable.from_export(json.load(open(policies_path)))
    doc = json.load(open(path))
    for c in doc["cases"]:
        c["served_alt"] = {**served_by(table, c), "policies": policies_path}
    json.dump(doc, open(path, "w"))
    print(f"{len(doc['cases'])} cases: served_alt from {policies_path} -> {path}")


def main(path: str) -> None:
    if path == "--oracle-from":
        add_oracle_names(sys.argv[3], sys.argv[2])
        return
    if path == "--alt-policies":
        add_alt(sys.argv[3], sys.argv[2])
        return
    if path == "--train":
        out = sys.argv[2]
        cases = train_cases()
        json.dump({"cases": cases}, open(out, "w"))
        print(f"{len(cases)} training cases -> {out}")
        return
    cases = []

    def add(set_name, fam, B, T, lens, hq=32, hkv=4):
        cases.append({"id": len(cases), "set": set_name, "family": fam, "B": int(len(lens)), "B_nominal": int(B),
                      "T": int(T), "num_qo_heads": hq, "num_kv_heads": hkv, "kv_lens": [int(x) for x in lens]})

    for T in (262_144, 1_048_576):
        for fam, B in reference_cases(T):
            add("ref", fam, B, T, family_kv_lens(fam, B, T))
    for T in (262_144, 1_048_576):
        for fam in FAMILIES:
            for B in (4, 32, 256):
                lens = family_batches(fam, B, T, num_batches=1, seed=7, role="heldout")[0]
                add("jitter", fam, B, T, lens)
    for fam in FAMILIES:
        for B in (24, 96, 384, 1024):
            add("untuned", fam, B, 524_288, family_kv_lens(fam, B, 524_288))
    for fam in ("uniform", "skewed80", "2x40"):
        for B in (4, 32, 256):
            add("llama8b", fam, B, 262_144, family_kv_lens(fam, B, 262_144), hkv=8)
    for fam in ("uniform", "skewed80"):
        add("llama8b", fam, 16, 1_048_576, family_kv_lens(fam, 16, 1_048_576), hkv=8)
    from kvsplit.tuner.workloads import TRACES
    for name in TRACES:
        for B in (8, 32, 128, 512, 1024):
            try:
                _, held = trace_batches(name, B, num_train=1, num_heldout=1, seed=0)
            except ValueError as exc:
                print(f"skip trace {name} B={B}: {exc}", file=sys.stderr)
                continue
            lens = held[0]
            add("trace", name, B, int(lens.sum()), lens)

    # what round 1 served: round 1's shipped H200 export (bench/data/h200_policies_r1.json) through the table
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{d}/s.db"
        store.upgrade(url)
        with store.session_scope(url, write=True) as s:
            store.import_policies(s, json.load(open("bench/data/h200_policies_r1.json")))
        table = PolicyTable.from_json(load_table_doc(url))
    for c in cases:
        p, _, info = table.plan(np.asarray(c["kv_lens"]), gpu="NVIDIA H200", num_qo_heads=c["num_qo_heads"],
                             num_kv_heads=c["num_kv_heads"], head_dim=128, dtype="bfloat16", page_size=16)
        # round 1's rules: balanced and tuned were not wave-aware then (tuned with wave_aware=False is both)
        params = dict(p.params)
        if p.policy == "balanced":
            params = {"ctas_per_sm": params.get("ctas_per_sm", 4.0), **params}
        params["wave_aware"] = False
        for k, v in (("block_n", 64), ("num_warps", 4), ("num_stages", 2)):  # round 1's default tile
            params.setdefault(k, v)
        c["served_r1"] = {"policy": "tuned", "params": params, "source": info["source"]}
    # what this round serves: the shipped export (scripts/build_shipped_policies.py) through the table
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{d}/s.db"
        store.upgrade(url)
        with store.session_scope(url, write=True) as s:
            store.import_policies(s, json.load(open("service/data/h200_policies.json")))
        table = PolicyTable.from_json(load_table_doc(url))
    for c in cases:
        c["served"] = served_by(table, c)
    # what the table before this rebuild served: the existing case file's served plans, kept as "served_prev"
    # (timed back to back with "served" by bench/gpu_sweep.py --mode retime) for batches that did not change
    try:
        before = {c["id"]: c for c in json.load(open(path))["cases"]}
    except (OSError, ValueError, KeyError):
        before = {}
    for c in cases:
        old = before.get(c["id"])
        if old and "served" in old and old["kv_lens"] == c["kv_lens"] and old["num_kv_heads"] == c["num_kv_heads"]:
            c["served_prev"] = old["served"]
    json.dump({"cases": cases}, open(path, "w"))
    print(f"{len(cases)} cases -> {path}")


if __name__ == "__main__":
    main(sys.argv[1])
