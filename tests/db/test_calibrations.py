"""Calibrations per (GPU, KV dtype, q_len): migration 0005 on a store made at 0004, the lookup keeping an FP8 or
q_len > 1 fit apart from the bf16 q_len-1 one, the unique constraint, and the downgrade; on SQLite and on
PostgreSQL (``KVSPLIT_TEST_POSTGRES_URL``)."""

from __future__ import annotations

import re

import pytest
from alembic import command
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from kvsplit.db import engine as db_engine
from kvsplit.db import store
from kvsplit.db.models import Calibration

GPU = "NVIDIA H200"
FP8 = "float8_e4m3fn"
OLD = "0004"  # the head before the calibrations' kv_dtype / q_len


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_url(request, tmp_path):
    """An empty store: a SQLite file, or a fresh PostgreSQL schema (:func:`tests.conftest.pg_url`)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'cal.db'}"
        store.dispose_engines()
    else:
        yield request.getfixturevalue("pg_url")


def _downgrade(url: str, revision: str) -> None:
    """Alembic's downgrade on the kvsplit migrations (the project ships no downgrade command)."""
    cfg = db_engine._alembic_config(url)
    with store.get_engine(url).connect().execution_options(kvsplit_write=True) as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)
        conn.commit()
    db_engine._checked.discard(url)


def _old_store_with_a_calibration(url: str) -> None:
    """A store at 0004 holding one device and two versions of its calibration, written with 0004's columns."""
    assert store.upgrade(url, OLD) == OLD
    with store.get_engine(url).begin() as c:
        c.execute(
            text(
                "INSERT INTO devices (id, name, num_sms, hbm_bandwidth_gbps, read_bandwidth_gbps, software, "
                "fingerprint, created_at) VALUES (1, :gpu, 132, 4800.0, 4520.0, '{}', 'fp0', :t)"
            ),
            {"gpu": GPU, "t": "2026-11-30 00:00:00+00:00"},
        )
        for v, bw in ((1, 4.40e12), (2, 4.52e12)):
            c.execute(
                text(
                    "INSERT INTO calibrations (device_id, config_key, kernel_config, constants, error, num_samples, "
                    "version, created_at) VALUES (1, '{}', '{}', :k, :e, 240, :v, :t)"
                ),
                {
                    "k": f'{{"hbm_bw": {bw}, "sm_bw": 5e10, "cta_bw": 1.7e10}}',
                    "e": '{"heldout": {"median": 0.03, "worst": 0.4}}',
                    "v": v,
                    "t": f"2026-11-30 0{v}:00:00+00:00",
                },
            )


def test_upgrade_keeps_calibrations_and_reads_them_as_bf16_q_len_1(any_url):
    url = any_url
    _old_store_with_a_calibration(url)
    assert store.upgrade(url) == store.head_revision()
    cols = {c["name"] for c in inspect(store.get_engine(url)).get_columns("calibrations")}
    assert {"kv_dtype", "q_len"} <= cols
    with store.session_scope(url, write=True) as s:
        rows = s.query(Calibration).order_by(Calibration.id).all()
        assert [(r.version, r.kv_dtype, r.q_len, r.num_samples) for r in rows] == [
            (1, "bfloat16", 1, 240),
            (2, "bfloat16", 1, 240),
        ]
        assert rows[1].constants == {"hbm_bw": 4.52e12, "sm_bw": 5e10, "cta_bw": 1.7e10}
        assert rows[1].error["heldout"]["median"] == 0.03
        assert store.latest_calibration(s, gpu=GPU, kv_dtype="bfloat16").id == rows[1].id
        assert store.latest_calibration(s, gpu=GPU, kv_dtype=FP8) is None
        assert store.latest_calibration(s, gpu=GPU, kv_dtype="bfloat16", q_len=4) is None
        # the version counts per KV dtype and q_len: the bf16 q_len-1 fit goes on from the old rows, an fp8 one starts
        bf = store.record_calibration(s, device_id=1, constants={"hbm_bw": 4.5e12}, kv_dtype="bfloat16")
        f8 = store.record_calibration(s, device_id=1, constants={"hbm_bw": 4.6e12}, kv_dtype=FP8)
        q4 = store.record_calibration(s, device_id=1, constants={"hbm_bw": 4.7e12}, kv_dtype="bfloat16", q_len=4)
        assert (bf.version, f8.version, q4.version) == (3, 1, 1)


def test_bf16_fp8_and_q_len_calibrations_of_one_gpu_stay_apart(any_url):
    url = any_url
    store.upgrade(url)
    with store.session_scope(url, write=True) as s:
        d = store.get_or_create_device(s, name=GPU, num_sms=132, hbm_bandwidth_gbps=4800, software={"torch": "2.11"})
        bf = store.record_calibration(s, device_id=d.id, constants={"hbm_bw": 4.5e12}, kv_dtype="bfloat16")
        # newer fits of other shapes, stored after the bf16 q_len-1 one
        f8 = store.record_calibration(s, device_id=d.id, constants={"hbm_bw": 4.6e12}, kv_dtype=FP8)
        f8q4 = store.record_calibration(s, device_id=d.id, constants={"hbm_bw": 4.7e12}, kv_dtype=FP8, q_len=4)
        with pytest.raises(ValueError, match="^q_len"):
            store.record_calibration(s, device_id=d.id, constants={}, kv_dtype=FP8, q_len=0)
        with pytest.raises(ValueError, match="^kv_dtype"):
            store.record_calibration(s, device_id=d.id, constants={}, kv_dtype=None)
    with store.session_scope(url) as s:
        got = {
            (kd, q): store.latest_calibration(s, gpu=GPU, kv_dtype=kd, q_len=q).constants["hbm_bw"]
            for kd, q in (("bfloat16", 1), (FP8, 1), (FP8, 4))
        }
        assert got == {("bfloat16", 1): 4.5e12, (FP8, 1): 4.6e12, (FP8, 4): 4.7e12}
        assert store.latest_calibration(s, gpu=GPU, kv_dtype="float16") is None
        assert [c.id for c in store.list_calibrations(s, gpu=GPU)] == [bf.id, f8.id, f8q4.id]
    # the unique constraint takes the KV dtype and q_len: a second fp8 q_len-4 version 1 is refused
    with pytest.raises(IntegrityError):
        with store.session_scope(url, write=True) as s:
            s.add(Calibration(device_id=d.id, config_key="{}", kv_dtype=FP8, q_len=4, version=1))
            s.flush()


def test_downgrade_to_0004_keeps_bf16_rows_and_refuses_other_shapes(any_url):
    url = any_url
    _old_store_with_a_calibration(url)
    store.upgrade(url)
    with store.session_scope(url, write=True) as s:
        f8 = store.record_calibration(s, device_id=1, constants={"hbm_bw": 4.6e12}, kv_dtype=FP8, q_len=2)
        f8_id = f8.id
    with pytest.raises(RuntimeError, match=r"downgrade below 0005 refused: 1 calibration\(s\)"):
        _downgrade(url, OLD)
    store.dispose_engines()
    assert store.current_revision(store.get_engine(url)) == store.head_revision()
    with store.session_scope(url, write=True) as s:
        assert len(store.list_calibrations(s)) == 3  # nothing lost
        s.delete(s.get(Calibration, f8_id))
    _downgrade(url, OLD)
    store.dispose_engines()
    eng = store.get_engine(url)
    assert store.current_revision(eng) == OLD
    assert "kv_dtype" not in {c["name"] for c in inspect(eng).get_columns("calibrations")}
    with eng.connect() as c:
        rows = c.execute(text("SELECT version, num_samples FROM calibrations ORDER BY version")).all()
    assert [tuple(r) for r in rows] == [(1, 240), (2, 240)]
    assert store.upgrade(url) == store.head_revision()  # and up again


def test_export_import_round_trip_keeps_kv_dtype_and_q_len(any_url, tmp_path):
    """``kvsplit db export --calibrations`` -> ``kvsplit db import`` into a fresh store: every calibration comes
    back with its device, KV dtype, q_len, constants, error and fit time; the lookup of each shape finds its own;
    a second import changes nothing; a bad entry stores nothing and names the field."""
    import copy
    import json

    from typer.testing import CliRunner

    from kvsplit.service.cli import app

    url = any_url
    store.upgrade(url)
    base = {"hbm_bw": 4.5e12, "sm_bw": 5.1e10, "cta_bw": 1.7e10}
    with store.session_scope(url, write=True) as s:
        d = store.get_or_create_device(
            s, name=GPU, num_sms=132, hbm_bandwidth_gbps=4800, software={"torch": "2.11"}, read_bandwidth_gbps=4520.0
        )
        for i, (kd, q) in enumerate((("bfloat16", 1), (FP8, 1), (FP8, 4))):
            store.record_calibration(
                s,
                device_id=d.id,
                constants={**base, "tile_fixed_s": 1e-6 * (i + 1)},
                kv_dtype=kd,
                q_len=q,
                error={"heldout": {"median": 0.02 + i / 100, "worst": 0.3}},
                kernel_config={"block_n": 64} if q == 4 else {},
                num_samples=100 + i,
            )
    out = tmp_path / "cal.json"
    r = CliRunner().invoke(app, ["db", "export", "--calibrations", "--database-url", url, "--output", str(out)])
    assert r.exit_code == 0 and "exported 3 calibrations" in r.output, r.output
    doc = json.loads(out.read_text())
    assert doc["format"] == "kvsplit.calibrations" and doc["format_version"] == 1
    assert [(e["kv_dtype"], e["q_len"]) for e in doc["calibrations"]] == [("bfloat16", 1), (FP8, 1), (FP8, 4)]
    u2 = f"sqlite:///{tmp_path / 'fresh.db'}"
    store.upgrade(u2)
    r = CliRunner().invoke(app, ["db", "import", str(out), "--database-url", u2])
    assert r.exit_code == 0 and "imported 3 calibrations" in r.output, r.output
    with store.session_scope(u2) as s:
        again = store.export_calibrations(s)["calibrations"]
        assert again == doc["calibrations"]  # every field, the fit times and the device's fingerprint included
        got = store.latest_calibration(s, gpu=GPU, kv_dtype=FP8, q_len=4)
        assert (got.constants["tile_fixed_s"], got.kernel_config, got.num_samples) == (3e-6, {"block_n": 64}, 102)
        assert store.latest_calibration(s, gpu=GPU, kv_dtype="bfloat16").constants["tile_fixed_s"] == 1e-6
    r = CliRunner().invoke(app, ["db", "import", str(out), "--database-url", u2])  # again: nothing new
    assert r.exit_code == 0 and "nothing new: the 3 calibrations are already stored" in r.output, r.output
    with store.session_scope(u2) as s:
        assert len(store.list_calibrations(s)) == 3
    for path, mutate, msg in (
        ("q9.json", lambda e: e.update(q_len=9), r"calibrations\[2\]: q_len: expected an integer in \[1, 8\]"),
        ("kd.json", lambda e: e.update(kv_dtype="int4"), r"calibrations\[2\]: kv_dtype: expected one of"),
        ("c.json", lambda e: e["constants"].pop("sm_bw"), r"calibrations\[2\]: constants: calibration: missing"),
        ("fp.json", lambda e: e["device"].update(fingerprint="0" * 16), r"calibrations\[2\].device.fingerprint"),
    ):
        bad = copy.deepcopy(doc)
        bad["calibrations"][0]["q_len"] = 2  # a good new entry before the bad one: rolled back with it
        mutate(bad["calibrations"][2])
        (tmp_path / path).write_text(json.dumps(bad))
        r = CliRunner().invoke(app, ["db", "import", str(tmp_path / path), "--database-url", u2])
        assert r.exit_code == 2 and "nothing stored" in r.output, r.output
        assert len(re.findall(msg, r.output)) == 1, (msg, r.output)
        with store.session_scope(u2) as s:
            assert len(store.list_calibrations(s)) == 3
