"""Write the shipped H200 data of ``make run`` from a campaign store.

    python scripts/export_shipped.py sqlite:////path/to/campaign.db

Writes ``service/data/h200_policies.json`` (``kvsplit db export`` of the
published GPU-tuned policies) and ``service/data/h200_measurements.json`` (their
held-out verification measurements, so the dashboard shows measured speedups
and time / HBM floor per batch size on a fresh store).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvsplit.db import store

ROOT = Path(__file__).resolve().parents[1] / "service" / "data"


def main(url: str) -> None:
    with store.session_scope(url) as s:
        doc = store.export_published(s)
        keys = {p["bucket"]["key"] for p in doc["policies"]}
        key_of = {b.id: b.key for b in store.list_buckets(s)}
        rows = []
        for m in store.list_measurements(s, stage="verify"):
            if key_of.get(m.bucket_id) not in keys or m.role != "heldout":
                continue
            rows.append({"bucket": key_of[m.bucket_id], "policy_name": m.policy_name, "params": dict(m.params or {}),
                         "kv_lens": list(m.kv_lens), "time_s": m.time_s, "floor_s": m.floor_s, "role": m.role,
                         "batch_index": m.batch_index, "backend": m.backend, "software": dict(m.software or {})})
    (ROOT / "h200_policies.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (ROOT / "h200_measurements.json").write_text(json.dumps(
        {"format": "kvsplit.measurements", "format_version": 1, "source": "scripts/h200_campaign.py on an H200",
         "measurements": rows}) + "\n")
    print(f"{len(doc['policies'])} policies, {len(rows)} measurements")


if __name__ == "__main__":
    main(sys.argv[1])
