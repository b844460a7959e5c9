"""DecodeWrapper(table=PlanClient(...)) against a live ``kvsplit serve`` subprocess: the wrapper plans with the
client's current table, so a policy published on the server reaches the next plan() once the client's refresh
thread has pulled it (eager mode), and graph mode re-picks at the first step after the table changed."""

from __future__ import annotations

import json
import time
import urllib.request

import numpy as np
import pytest
import torch

from kvsplit.db import store
from kvsplit.kernels.plan import make_plan
from kvsplit.kernels.wrapper import DecodeWrapper, GraphOptions
from kvsplit.service.client import PlanClient
from kvsplit.tuner.workloads import family_kv_lens
from tests.service_support import GPU, TOTAL, LiveServer, add_bucket, fill_store

TOKEN = "tok-wrapper"
SHAPE16 = dict(num_qo_heads=32, num_kv_heads=8, head_dim=128, dtype="float16", page_size=16)


def _index(lens: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """kv_indptr, kv_indices, kv_lens (int32, CPU) of a batch whose request b owns the next ceil(kv_len/16) pages."""
    pages = -(-lens // 16)
    indptr = np.concatenate(([0], np.cumsum(pages))).astype(np.int32)
    return torch.from_numpy(indptr), torch.arange(int(indptr[-1]), dtype=torch.int32), torch.from_numpy(lens)


def _publish(url: str, policy_id: int) -> int:
    req = urllib.request.Request(
        f"{url}/v1/policies/{policy_id}/publish",
        data=b"{}",
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["policies_version"]


@pytest.fixture()
def served(tmp_path):
    """A live server whose store holds a draft ``balanced`` policy (ctas_per_sm 5) for the float16 H_kv 8
    bucket of a uniform B = 64 batch (the interpreter runs float16, not bfloat16)."""
    url = f"sqlite:///{tmp_path}/store.db"
    fill_store(url)
    lens = family_kv_lens("uniform", 64, TOTAL).astype(np.int32)
    with store.session_scope(url, write=True) as s:
        b = add_bucket(s, lens, "test", num_kv_heads=8, dtype="float16")
        draft = store.create_policy(
            s, bucket_id=b.id, params={"ctas_per_sm": 5.0}, backend="gpu", score=1.1, name="balanced"
        )
        draft_id = draft.id
    with LiveServer(url, admin_token=TOKEN, reload_interval=0.2, cwd=str(tmp_path)) as srv:
        yield srv, lens, draft_id


def _wait_version(client: PlanClient, version: int) -> None:
    t_end = time.monotonic() + 15
    while client.version != version:
        assert time.monotonic() < t_end, "the refresh thread did not load the published table"
        time.sleep(0.01)


def test_eager_wrapper_plans_with_the_clients_refreshed_table(served):
    srv, lens, draft_id = served
    client = PlanClient(srv.url, refresh_interval_s=0.05)
    try:
        w = DecodeWrapper(32, 8, 128, page_size=16, dtype="float16", device="cpu", max_batch_size=64, table=client)
        indptr, indices, kv_lens = _index(lens)
        mk = dict(num_kv_heads=8, device=GPU, head_dim=128, page_size=16, dtype="float16")
        w.plan(indptr, indices, kv_lens)
        before = w.last_plan
        assert before == make_plan(lens, policy=client.table.fallback_name, params=client.table.fallback_params, **mk)
        assert before.params.get("ctas_per_sm") != 5.0
        _wait_version(client, _publish(srv.url, draft_id))
        w.plan(indptr, indices, kv_lens, kv_lens_host=lens, kv_indptr_host=indptr.numpy())
        after = w.last_plan
        assert w.table is client.table
        assert after == make_plan(lens, policy="balanced", params={"ctas_per_sm": 5.0}, **mk)
        assert after != before
    finally:
        client.close()


def test_graph_wrapper_repicks_when_the_clients_table_changes(served):
    srv, lens, draft_id = served
    client = PlanClient(srv.url, refresh_interval_s=0.05)
    try:
        g = DecodeWrapper(
            32,
            8,
            128,
            page_size=16,
            dtype="float16",
            device="cpu",
            max_batch_size=64,
            table=client,
            use_cuda_graph=True,
            graph=GraphOptions(repick_every=64, planner="device"),
        )
        indptr, indices, kv_lens = _index(lens)
        g.plan(indptr, indices, kv_lens, kv_lens_host=lens)  # first step: a pick
        g.plan(indptr, indices, kv_lens)  # same table, same B, step 2 of 64: no pick, no host copy needed
        _wait_version(client, _publish(srv.url, draft_id))
        with pytest.raises(ValueError, match="^kv_lens_host: required when the policy is re-picked"):
            g.plan(indptr, indices, kv_lens)  # the table changed: this step re-picks
        g.plan(indptr, indices, kv_lens, kv_lens_host=lens)
        g.plan(indptr, indices, kv_lens)  # picked from the new table: no pick until the next change
    finally:
        client.close()
