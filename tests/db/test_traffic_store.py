"""The traffic tables in the store: migration 0004 and the atomic upsert-add (SQLite and PostgreSQL)."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import inspect, select, text

from kvsplit.db import store
from kvsplit.db.models import Traffic, TrafficBin


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'k.db'}"
        store.dispose_engines()
    else:
        yield request.getfixturevalue("pg_url")


def test_0004_adds_the_traffic_tables_and_keeps_earlier_rows_both_ways(db_url):
    assert store.upgrade(db_url, "0002") == "0002"
    eng = store.get_engine(db_url)
    with eng.begin() as c:
        c.execute(
            text(
                "INSERT INTO buckets (key, gpu, num_kv_heads, head_dim, dtype, page_size, signature, source, "
                "sample_batches, created_at) VALUES ('b', 'NVIDIA H200', 4, 128, 'bfloat16', 16, '{}', '', "
                "'{}', '2026-01-01 00:00:00')"
            )
        )
    assert "traffic" not in inspect(eng).get_table_names()
    assert store.upgrade(db_url) == store.head_revision()
    names = set(inspect(store.get_engine(db_url)).get_table_names())
    assert {"traffic", "traffic_bins"} <= names
    with store.session_scope(db_url, write=True) as s:
        assert [b.key for b in store.list_buckets(s)] == ["b"]
        store.add_traffic(s, [store.TrafficCell("k", 1, requests=1, batch_min=1, batch_max=1, batch_bins={1: 1})])
    # and back down (Alembic's downgrade, the path an operator rolling back kvsplit takes)
    from alembic import command

    from kvsplit.db.engine import _alembic_config

    cfg = _alembic_config(store.resolve_url(db_url))
    with eng.connect() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0002")
        conn.commit()
    eng.dispose()
    names = set(inspect(store.get_engine(db_url)).get_table_names())
    assert "traffic" not in names and "traffic_bins" not in names and "buckets" in names


def _cell(key: str, hour: int, n: int, b: int, t: int, source: str, d: float | None) -> store.TrafficCell:
    c = store.TrafficCell(key, hour, requests=n, batch_min=b, batch_max=b, tokens_min=t, tokens_max=t)
    setattr(c, {"tuned": "n_tuned", "simulated": "n_simulated", "fallback": "n_fallback"}[source], n)
    c.distance_max = d
    c.distance_sum = 0.0 if d is None else d * n
    c.batch_bins = {b.bit_length(): n}
    c.tokens_bins = {t.bit_length(): n}
    return c


def test_upsert_adds_counts_and_merges_ranges(db_url):
    store.upgrade(db_url)
    adds = [
        _cell("k", 7, 3, 16, 1000, "fallback", None),
        _cell("k", 7, 2, 40, 900, "tuned", 0.5),
        _cell("k", 7, 1, 8, 5000, "simulated", 0.25),
        _cell("k", 8, 4, 16, 1000, "tuned", 0.0),
    ]
    for c in adds:
        with store.session_scope(db_url, write=True) as s:
            store.add_traffic(s, [c])
    with store.session_scope(db_url) as s:
        row = s.get(Traffic, ("k", 7))
        assert (row.requests, row.n_tuned, row.n_simulated, row.n_fallback) == (6, 2, 1, 3)
        assert (row.batch_min, row.batch_max, row.tokens_min, row.tokens_max) == (8, 40, 900, 5000)
        assert row.distance_max == 0.5 and row.distance_sum == pytest.approx(1.25)
        bins = {(b.kind, b.bin): b.n for b in s.scalars(select(TrafficBin).where(TrafficBin.hour == 7))}
        assert bins == {("batch", 5): 3, ("batch", 6): 2, ("batch", 4): 1, ("tokens", 10): 5, ("tokens", 13): 1}
        (summed,) = store.read_traffic(s, since_hour=7)
        assert (summed.requests, summed.first_hour, summed.last_hour, summed.distance_max) == (10, 7, 8, 0.5)
        assert store.read_traffic(s, since_hour=8)[0].requests == 4
    with store.session_scope(db_url, write=True) as s:
        assert store.prune_traffic(s, before_hour=8) == 1
    with pytest.raises(ValueError, match="requests must be >= 1"):
        with store.session_scope(db_url, write=True) as s:
            store.add_traffic(s, [store.TrafficCell("k", 9)])


def test_concurrent_upserts_of_one_row_lose_nothing(db_url):
    """Eight threads, each with its own connection, add 50 times into the same (key, hour) rows."""
    store.upgrade(db_url)
    errors: list = []

    def work(i: int) -> None:
        try:
            for j in range(50):
                with store.session_scope(db_url, write=True) as s:
                    store.add_traffic(
                        s, [_cell("k", 1, 1, 1 + i, 100 + j, "fallback", None), _cell("k2", 1, 2, 3, 7, "tuned", 1.0)]
                    )
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with store.session_scope(db_url) as s:
        r = s.get(Traffic, ("k", 1))
        assert (r.requests, r.n_fallback, r.batch_min, r.batch_max, r.tokens_min, r.tokens_max) == (
            400,
            400,
            1,
            8,
            100,
            149,
        )
        assert s.get(Traffic, ("k2", 1)).requests == 800
        assert sum(b.n for b in s.scalars(select(TrafficBin).where(TrafficBin.kind == "batch"))) == 1200
