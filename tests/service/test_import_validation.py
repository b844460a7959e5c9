"""An entry that could not be served never reaches the served table (import or a hand-edited store)."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import update

from kvsplit.db import store
from kvsplit.db.models import Policy
from kvsplit.service.app import create_app
from kvsplit.service.queries import load_table_doc
from kvsplit.service.settings import Settings

SHIPPED = Path(__file__).resolve().parents[2] / "kernels" / "data" / "h200_policies.json"


def _store(tmp_path):
    url = f"sqlite:///{tmp_path}/k.db"
    store.upgrade(url)
    return url


def test_import_with_a_key_that_disagrees_with_its_fields_is_422_and_stores_nothing(tmp_path):
    url = _store(tmp_path)
    doc = json.loads(SHIPPED.read_text())
    # the shipped file covers three shapes (H_kv 1, 4 and 8) and its first entry is not an H_kv 4 one:
    # take an H_kv 4 entry, so that rewriting ".kv4." really makes its key disagree with its fields
    entry = next(p for p in doc["policies"] if p["bucket"]["num_kv_heads"] == 4)
    bad = dict(doc, policies=[json.loads(json.dumps(entry))])
    bad["policies"][0]["bucket"]["key"] = bad["policies"][0]["bucket"]["key"].replace(".kv4.", ".kv8.")
    assert ".kv8." in bad["policies"][0]["bucket"]["key"]
    with TestClient(create_app(Settings(database_url=url, admin_token="tok"))) as c:
        r = c.post("/v1/policies/import", content=json.dumps(bad), headers={"Authorization": "Bearer tok"})
        assert r.status_code == 422
        assert "num_kv_heads 8 differs from the entry's 4" in r.text
        assert c.get("/v1/policies").json()["data"] == []
    with store.session_scope(url) as s:
        assert store.list_policies(s) == []


def test_a_hand_edited_unservable_row_is_left_out_and_the_service_still_starts(tmp_path):
    url = _store(tmp_path)
    doc = json.loads(SHIPPED.read_text())
    with store.session_scope(url, write=True) as s:
        ids = store.import_policies(s, doc)
    with store.session_scope(url, write=True) as s:
        s.execute(update(Policy).where(Policy.id == ids[0]).values(params={"block_n": 7}))
    served = {p["id"] for p in load_table_doc(url)["data"]}
    assert served == set(ids) - {ids[0]}
    with TestClient(create_app(Settings(database_url=url))) as c:
        assert c.get("/healthz").status_code == 200
        assert len(c.get("/v1/policies").json()["data"]) == len(ids) - 1


def test_a_hand_edited_bucket_key_is_left_out_and_the_rest_served(tmp_path):
    """A published row whose bucket key no longer parses (edited by hand) is left out of the served table, which
    still loads; the other entries carry their family's kv_dtype and q_len."""
    url = _store(tmp_path)
    doc = json.loads(SHIPPED.read_text())
    with store.session_scope(url, write=True) as s:
        ids = store.import_policies(s, doc)
    with store.session_scope(url, write=True) as s:
        s.execute(update(Policy).where(Policy.id == ids[0]).values(bucket_key="not a bucket key"))
    data = load_table_doc(url)["data"]
    assert {p["id"] for p in data} == set(ids) - {ids[0]}
    assert all((p["kv_dtype"], p["q_len"]) == ("bfloat16", 1) for p in data)


def test_reimport_keeps_a_retired_policy_retired(tmp_path):
    url = _store(tmp_path)
    doc = json.loads(SHIPPED.read_text())
    with store.session_scope(url, write=True) as s:
        ids = store.import_policies(s, doc)
    with store.session_scope(url, write=True) as s:
        store.retire(s, ids[0])
    with store.session_scope(url, write=True) as s:
        again = store.import_policies(s, doc)
    assert again == ids
    with store.session_scope(url) as s:
        assert store.get_policy(s, ids[0]).status == "retired"
        assert store.get_policy(s, ids[1]).status == "published"


def test_table_from_an_export_equals_the_table_the_store_serves(tmp_path):
    """PolicyTable.from_export (benches, scripts and tests build the shipped table with it) gives the entries
    and plans that importing the file into a store and loading GET /v1/policies' document gives."""
    import numpy as np

    from kvsplit.kernels.policy_table import PolicyTable

    url = _store(tmp_path)
    doc = json.loads(SHIPPED.read_text())
    with store.session_scope(url, write=True) as s:
        store.import_policies(s, doc)
    served = PolicyTable.from_json(load_table_doc(url))
    direct = PolicyTable.from_export(doc)

    def rows(t):
        return sorted(
            (e.bucket, e.name, json.dumps(dict(e.params), sort_keys=True), e.backend, e.source) for e in t.entries
        )

    assert len(direct) == len(served) == len(doc["policies"]) and rows(direct) == rows(served)
    shape = dict(gpu="NVIDIA H200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)
    for lens in ([210000] + [3400] * 15, [2048] * 128, list(np.random.default_rng(3).integers(1, 9000, 300))):
        a, b = direct.plan(lens, **shape), served.plan(lens, **shape)
        assert a[0] == b[0] and a[1] == b[1]
        assert {k: v for k, v in a[2].items() if k != "id"} == {k: v for k, v in b[2].items() if k != "id"}
