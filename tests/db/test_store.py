"""The policy store: migrations, schema check, publish rules, export/import, runs, measurements."""

from __future__ import annotations

import copy
import json
import threading

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError
from typer.testing import CliRunner

from kvsplit.db import store
from kvsplit.db.models import Policy
from kvsplit.kernels.buckets import bucket_key
from kvsplit.kernels.policy_table import check_policy_entry as plan_check_entry
from kvsplit.service.cli import app

GPU = "NVIDIA H200"


def _key(lens=(4096, 17, 9000)):
    return str(bucket_key(list(lens), num_kv_heads=4, head_dim=128, dtype="bfloat16", device=GPU, page_size=16))


@pytest.fixture()
def url(tmp_path):
    u = f"sqlite:///{tmp_path / 'kvsplit.db'}"
    store.upgrade(u)
    yield u
    store.dispose_engines()


def _bucket(s, key=None):
    return store.get_or_create_bucket(
        s, key=key or _key(), gpu=GPU, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16, source="test"
    )


def _policy(s, b, *, params=None, backend="sim", score=1.5, passed=True):
    return store.create_policy(
        s,
        bucket_id=b.id,
        params=params or {"ctas_per_sm": 4.0},
        backend=backend,
        score=score,
        verification={"passed": passed, "tuned_geomean_ratio": score},
    )


# ---------------------------------------------------------------------------
# migrations and the schema check
# ---------------------------------------------------------------------------


def test_migration_up_from_empty(tmp_path):
    u = f"sqlite:///{tmp_path / 'empty.db'}"
    eng = store.get_engine(u)
    assert store.current_revision(eng) is None
    assert store.upgrade(u) == store.head_revision()
    names = set(inspect(eng).get_table_names())
    assert {
        "devices",
        "calibrations",
        "buckets",
        "policies",
        "tuning_runs",
        "measurements",
        "store_state",
        "kvsplit_alembic_version",
    } <= names
    assert "alembic_version" not in names  # Optuna's table name stays free
    with store.session_scope(u) as s:
        assert store.policies_version(s) == 0
    # idempotent
    assert store.upgrade(u) == store.head_revision()
    # SQLite settings
    with eng.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert c.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
        assert c.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    store.dispose_engines()


def test_empty_database_says_how_to_upgrade(tmp_path):
    u = f"sqlite:///{tmp_path / 'new.db'}"
    with pytest.raises(store.SchemaError, match=r"kvsplit db upgrade --database-url sqlite:///"):
        with store.session_scope(u):
            pass
    store.dispose_engines()


def test_outdated_database_says_how_to_upgrade(url, monkeypatch):
    # the code now expects a newer revision than the one stamped in the file
    monkeypatch.setattr("kvsplit.db.engine.head_revision", lambda: "0099")
    store.dispose_engines()  # also forgets which URLs passed the schema check
    with pytest.raises(
        store.SchemaError, match=rf"at revision {store.head_revision()}, older than 0099: run `kvsplit db upgrade"
    ):
        with store.session_scope(url):
            pass


def test_newer_database_says_upgrade_kvsplit(url):
    with store.get_engine(url).begin() as c:
        c.execute(text("UPDATE kvsplit_alembic_version SET version_num = 'f00d'"))
    store.dispose_engines()  # also forgets which URLs passed the schema check
    with pytest.raises(store.SchemaError, match="newer version"):
        with store.session_scope(url):
            pass


def test_cli_outdated_message(tmp_path):
    u = f"sqlite:///{tmp_path / 'x.db'}"
    r = CliRunner().invoke(app, ["db", "export", "--database-url", u])
    assert r.exit_code == 1
    assert "`kvsplit db upgrade --database-url" in r.output and "`kvsplit run --no-tune --database-url" in r.output
    assert not (tmp_path / "x.db").exists()  # a read-only command creates no empty store
    r = CliRunner().invoke(app, ["db", "upgrade", "--database-url", u])
    assert r.exit_code == 0 and f"upgraded empty -> {store.head_revision()}" in r.output
    r = CliRunner().invoke(app, ["db", "upgrade", "--database-url", u])
    assert f"already at revision {store.head_revision()}" in r.output
    store.dispose_engines()


def test_upgrade_0001_to_0002_keeps_runs_and_ages_ownerless_running_rows(tmp_path):
    """A store of revision 0001 with a ``running`` row (no owner): 0002 keeps it and its start time ages it."""
    u = f"sqlite:///{tmp_path / 'old.db'}"
    assert store.upgrade(u, "0001") == "0001"
    eng = store.get_engine(u)
    with eng.begin() as c:
        c.execute(
            text(
                "INSERT INTO buckets (key, gpu, num_kv_heads, head_dim, dtype, page_size, signature, source, "
                "sample_batches, created_at) VALUES ('b', 'NVIDIA H200', 4, 128, 'bfloat16', 16, '{}', '', "
                "'{}', '2026-01-01 00:00:00')"
            )
        )
        c.execute(
            text(
                "INSERT INTO tuning_runs (bucket_id, study_name, storage_kind, backend, n_trials, n_finished, "
                "workers, status, message, started_at) VALUES (1, 'st', 'rdb', 'sim', 4, 2, 1, 'running', '', "
                ":t)"
            ),
            {"t": "2026-01-01 00:00:00"},
        )
    assert store.upgrade(u) == store.head_revision()
    with store.session_scope(u, write=True) as s:
        (marked,) = store.reap_runs(s)
        assert marked.study_name == "st" and marked.n_finished == 2 and marked.status == "failed"
        assert marked.message.startswith(
            "abandoned: no heartbeat from its process (an unrecorded process) since "
            "2026-01-01T00:00:00+00:00, more than 600 s"
        )
    store.dispose_engines()


def test_concurrent_upgrades_of_an_empty_store_all_succeed(tmp_path):
    """Four processes upgrading one new SQLite store at once: one migrates, the others find it done."""
    import subprocess
    import sys

    u = f"sqlite:///{tmp_path / 'race.db'}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "kvsplit.service.cli", "db", "upgrade", "--database-url", u],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outs = [(p, *p.communicate(timeout=120)) for p in procs]
    assert all(p.returncode == 0 for p, _, _ in outs), [e for _, _, e in outs]
    said = sorted(o.split(": ", 1)[1].strip() for _, o, _ in outs)
    head = store.head_revision()
    assert said == [f"already at revision {head}"] * 3 + [f"upgraded empty -> {head}"], said
    assert store.current_revision(store.get_engine(u)) == head
    store.dispose_engines()


def test_settings_default_and_env(monkeypatch, tmp_path):
    from kvsplit.db.settings import get_settings

    get_settings.cache_clear()
    monkeypatch.delenv("KVSPLIT_DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    assert get_settings().database_url == "sqlite:///./kvsplit.db"
    get_settings.cache_clear()
    monkeypatch.setenv("KVSPLIT_DATABASE_URL", "sqlite:////tmp/other.db")
    assert store.resolve_url(None) == "sqlite:////tmp/other.db"
    get_settings.cache_clear()
    with pytest.raises(ValueError, match="database_url: not a SQLAlchemy URL"):
        store.resolve_url("postgresql://host:notaport/db")
    # a plain file path is that SQLite file, from the environment or an argument
    monkeypatch.setenv("KVSPLIT_DATABASE_URL", "./store.db")
    assert get_settings().database_url == "sqlite:///./store.db"
    assert store.resolve_url("/tmp/k.db") == "sqlite:////tmp/k.db"
    get_settings.cache_clear()
    monkeypatch.undo()
    get_settings.cache_clear()  # leave no cached settings from this test's environment


# ---------------------------------------------------------------------------
# publish rules
# ---------------------------------------------------------------------------


def test_versions_and_publish_rules(url):
    with store.session_scope(url, write=True) as s:
        b = _bucket(s)
        p1 = _policy(s, b, score=1.5)
        p2 = _policy(s, b, params={"ctas_per_sm": 3.0}, score=1.7)
        assert (p1.version, p2.version, p1.status) == (1, 2, "draft")
        store.publish(s, p1.id)
        assert store.policies_version(s) == 1
        with pytest.raises(store.PublishRefused, match="better"):
            store.publish(s, p2.id)  # worse score, same backend
        assert store.get_published(s, b.key).id == p1.id
        p3 = _policy(s, b, params={"ctas_per_sm": 2.0}, backend="gpu", score=1.9)
        store.publish(s, p3.id)  # GPU-measured replaces simulated whatever the score
        assert (p1.status, p3.status) == ("retired", "published")
        p4 = _policy(s, b, params={"ctas_per_sm": 5.0}, backend="sim", score=1.01)
        with pytest.raises(store.PublishRefused, match="simulated one never replaces"):
            store.publish(s, p4.id)
        p5 = _policy(s, b, params={"ctas_per_sm": 6.0}, backend="gpu", score=1.2, passed=False)
        with pytest.raises(store.PublishRefused, match="failed verification"):
            store.publish(s, p5.id)
        p6 = _policy(s, b, params={"ctas_per_sm": 7.0}, backend="gpu", score=1.8)
        store.publish(s, p6.id)  # better GPU policy
        assert store.policies_version(s) == 3
        assert [p.id for p in store.list_published(s)] == [p6.id]
        store.retire(s, p6.id)
        assert store.list_published(s) == [] and store.policies_version(s) == 4
        with pytest.raises(KeyError):
            store.publish(s, 10_000)


def test_one_published_per_bucket_index(url):
    with store.session_scope(url, write=True) as s:
        b = _bucket(s)
        p1, p2 = _policy(s, b), _policy(s, b, params={"x": 1})
        store.publish(s, p1.id)
    # bypassing publish(): the partial unique index refuses a second published row
    with pytest.raises(IntegrityError):
        with store.session_scope(url, write=True) as s:
            s.get(Policy, p2.id).status = "published"
            s.flush()
    with store.session_scope(url) as s:
        assert [p.id for p in store.list_published(s)] == [p1.id]


def test_concurrent_publishers_leave_one_published(url):
    with store.session_scope(url, write=True) as s:
        b = _bucket(s)
        ids = [_policy(s, b, params={"i": i}, score=1.0 + i / 100, backend="gpu").id for i in range(6)]
    errors = []

    def go(pid):
        try:
            with store.session_scope(url, write=True) as s:
                store.publish(s, pid, force=True)
        except Exception as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(i,)) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with store.session_scope(url) as s:
        assert len(store.list_published(s)) == 1
        assert store.policies_version(s) == 6


def test_list_published_filters(url):
    with store.session_scope(url, write=True) as s:
        b1 = _bucket(s)
        k2 = str(bucket_key([100, 200], num_kv_heads=8, head_dim=128, dtype="bfloat16", device=GPU))
        b2 = store.get_or_create_bucket(
            s, key=k2, gpu=GPU, num_kv_heads=8, head_dim=128, dtype="bfloat16", page_size=16
        )
        store.publish(s, _policy(s, b1).id)
        store.publish(s, _policy(s, b2).id)
        assert len(store.list_published(s, gpu=GPU)) == 2
        assert len(store.list_published(s, gpu="nvidia-h200")) == 2
        assert len(store.list_published(s, gpu="NVIDIA H100 80GB HBM3")) == 0
        assert [p.bucket_key for p in store.list_published(s, num_kv_heads=8)] == [k2]
        assert len(store.list_published(s, head_dim=64)) == 0
        # rows usable after the session: bucket loaded
        rows = store.list_published(s, num_kv_heads=4)
    assert rows[0].bucket.num_kv_heads == 4 and rows[0].params == {"ctas_per_sm": 4.0}


def test_bucket_shape_mismatch(url):
    with store.session_scope(url, write=True) as s:
        b = _bucket(s)
        with pytest.raises(ValueError, match="stored for"):
            store.get_or_create_bucket(
                s, key=b.key, gpu=GPU, num_kv_heads=8, head_dim=128, dtype="bfloat16", page_size=16
            )


# ---------------------------------------------------------------------------
# export / import
# ---------------------------------------------------------------------------


def _published_doc(url):
    with store.session_scope(url, write=True) as s:
        b = _bucket(s)
        dev = store.get_or_create_device(
            s,
            name=GPU,
            num_sms=132,
            hbm_bandwidth_gbps=4800.0,
            software={"torch": "2.11", "triton": "3.6.0"},
            read_bandwidth_gbps=4520.0,
        )
        p = store.create_policy(
            s,
            bucket_id=b.id,
            params={"ctas_per_sm": 6.5, "max_splits": 64, "block_n": 64},
            backend="gpu",
            score=1.21,
            device_id=dev.id,
            verification={"passed": True, "tuned_geomean_ratio": 1.21},
        )
        store.publish(s, p.id)
        k2 = _key([100] * 64)
        b2 = store.get_or_create_bucket(
            s, key=k2, gpu=GPU, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16
        )
        store.publish(s, _policy(s, b2, params={"ctas_per_sm": 2.0}).id)
        return json.loads(json.dumps(store.export_published(s)))


def test_export_import_round_trip(url, tmp_path):
    doc = _published_doc(url)
    assert doc["format"] == "kvsplit.policies" and doc["format_version"] == 1 and len(doc["policies"]) == 2
    gpu_entry = next(e for e in doc["policies"] if e["backend"] == "gpu")
    assert gpu_entry["device"]["fingerprint"] == store.software_fingerprint({"torch": "2.11", "triton": "3.6.0"})
    u2 = f"sqlite:///{tmp_path / 'fresh.db'}"
    store.upgrade(u2)
    with store.session_scope(u2, write=True) as s:
        ids = store.import_policies(s, doc, validate_entry=plan_check_entry)
        assert len(ids) == 2 and store.policies_version(s) == 1
    with store.session_scope(u2) as s:
        again = store.export_published(s)

    def strip(d):
        return sorted(
            (
                {
                    k: v
                    for k, v in e.items()
                    if k not in ("id", "created_at", "published_at", "version", "tuning_run_id")
                }
                for e in d["policies"]
            ),
            key=lambda e: e["bucket"]["key"],
        )

    assert strip(again) == strip(doc)
    # importing the same file again changes nothing
    with store.session_scope(u2, write=True) as s:
        assert store.import_policies(s, doc) == ids
        assert store.policies_version(s) == 1
        assert len(store.list_policies(s)) == 2


def _count_rows(u):
    with store.session_scope(u) as s:
        return (len(store.list_policies(s)), len(store.list_buckets(s)), store.policies_version(s))


def _bad_variants(doc):
    def mut(f):
        d = copy.deepcopy(doc)
        f(d)
        return d

    yield "format", mut(lambda d: d.update(format="other"))
    yield "format_version", mut(lambda d: d.update(format_version=2))
    yield r"policies\[1\]: missing fields \['params'\]", mut(lambda d: d["policies"][1].pop("params"))
    yield r"policies\[1\].bucket.head_dim", mut(lambda d: d["policies"][1]["bucket"].update(head_dim=96))
    yield r"policies\[0\].backend", mut(lambda d: d["policies"][0].update(backend="tpu"))
    yield r"policies\[0\].params.ctas_per_sm", mut(lambda d: d["policies"][0]["params"].update(ctas_per_sm=[1]))
    yield (
        "fingerprint",
        mut(lambda d: next(e for e in d["policies"] if e["device"])["device"].update(fingerprint="0" * 16)),
    )
    yield "appears twice", mut(lambda d: d["policies"].append(copy.deepcopy(d["policies"][0])))
    yield r"params do not make a plan", mut(lambda d: d["policies"][1]["params"].update(ctas_per_sm=1e6))
    yield r"bucket.key", mut(lambda d: d["policies"][1]["bucket"].update(key="nvidia-h200.kv8.junk"))
    yield "unknown fields", mut(lambda d: d["policies"][1].update(extra=1))
    yield r"policies\[1\].score", mut(lambda d: d["policies"][1].update(score=float("nan")))


def test_import_bad_file_stores_nothing(url, tmp_path):
    doc = _published_doc(url)
    u2 = f"sqlite:///{tmp_path / 'fresh.db'}"
    store.upgrade(u2)
    before = _count_rows(u2)
    for msg, bad in _bad_variants(doc):
        with pytest.raises(store.ImportValidationError, match=msg):
            with store.session_scope(u2, write=True) as s:
                store.import_policies(s, bad, validate_entry=plan_check_entry)
        assert _count_rows(u2) == before, msg


def test_cli_export_import(url, tmp_path):
    _published_doc(url)
    out = tmp_path / "export.json"
    r = CliRunner().invoke(app, ["db", "export", "--database-url", url, "--output", str(out)])
    assert r.exit_code == 0, r.output
    u2 = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert CliRunner().invoke(app, ["db", "upgrade", "--database-url", u2]).exit_code == 0
    r = CliRunner().invoke(app, ["db", "import", str(out), "--database-url", u2])
    assert r.exit_code == 0 and "imported 2 policies (2 published)" in r.output
    r = CliRunner().invoke(app, ["db", "import", str(out), "--database-url", u2])  # again: the same rows stand
    assert r.exit_code == 0 and "nothing new: the 2 policies are already stored (2 published)" in r.output, r.output
    assert _count_rows(u2)[0] == 2
    report = tmp_path / "report.json"  # a `kvsplit calibrate` report is not an export: refused, naming FILE
    report.write_text(json.dumps({"format": "kvsplit.calibration", "format_version": 2}))
    r = CliRunner().invoke(app, ["db", "import", str(report), "--database-url", u2])
    assert r.exit_code != 0 and "FILE:" in r.output and "'kvsplit.calibration' document" in r.output, r.output
    assert "'kvsplit.calibrations'" in r.output and "nothing stored" in r.output
    bad = json.loads(out.read_text())
    bad["policies"][0]["bucket"]["page_size"] = 0
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    u3 = f"sqlite:///{tmp_path / 'third.db'}"
    CliRunner().invoke(app, ["db", "upgrade", "--database-url", u3])
    r = CliRunner().invoke(app, ["db", "import", str(tmp_path / "bad.json"), "--database-url", u3])
    assert r.exit_code == 2 and "nothing stored" in r.output and "page_size" in r.output
    assert _count_rows(u3) == (0, 0, 0)
    (tmp_path / "junk.json").write_text("{not json")
    r = CliRunner().invoke(app, ["db", "import", str(tmp_path / "junk.json"), "--database-url", u3])
    assert r.exit_code == 2 and "not JSON" in r.output


def test_import_keeps_better_gpu_policy(url, tmp_path):
    doc = _published_doc(url)
    # a simulated entry for the bucket that has a GPU policy: stored as draft, not published
    with store.session_scope(url, write=True) as s:
        gpu_pol = next(p for p in store.list_published(s) if p.backend == "gpu")
        sim = copy.deepcopy(next(e for e in doc["policies"] if e["backend"] == "gpu"))
        sim.update(backend="sim", score=1.0, device=None, params={"ctas_per_sm": 9.0})
        ids = store.import_policies(s, {**doc, "policies": [sim]})
        assert store.get_policy(s, ids[0]).status == "draft"
        assert "simulated one never replaces" in store.get_policy(s, ids[0]).note
        assert store.get_published(s, gpu_pol.bucket_key).id == gpu_pol.id


# ---------------------------------------------------------------------------
# devices, calibrations, runs, measurements
# ---------------------------------------------------------------------------


def test_runs_measurements_calibrations(url):
    with store.session_scope(url, write=True) as s:
        b = _bucket(s)
        d = store.get_or_create_device(s, name=GPU, num_sms=132, hbm_bandwidth_gbps=4800, software={"t": 1})
        assert (
            store.get_or_create_device(s, name=GPU, num_sms=132, hbm_bandwidth_gbps=4800, software={"t": 1}).id == d.id
        )
        run = store.start_run(s, bucket_id=b.id, study_name="st", backend="sim", n_trials=5, device_id=d.id)
        m = store.record_measurement(
            s,
            bucket_id=b.id,
            policy_name="tuned",
            kv_lens=[100, 300],
            time_s=2e-5,
            floor_s=1e-5,
            backend="sim",
            tuning_run_id=run.id,
            device_id=d.id,
        )
        assert (m.ratio, m.batch_size, m.total_tokens) == (2.0, 2, 400)
        with pytest.raises(ValueError, match="time_s"):
            store.record_measurement(s, bucket_id=b.id, policy_name="x", kv_lens=[1], time_s=0.0, backend="sim")
        with pytest.raises(ValueError, match="backend"):
            store.record_measurement(s, bucket_id=b.id, policy_name="x", kv_lens=[1], time_s=1.0, backend="cpu")
        store.finish_run(s, run.id, status="finished", n_finished=5, best_value=1e-5, best_params={"a": 1})
        c1 = store.record_calibration(
            s,
            device_id=d.id,
            constants={"hbm_bw": 4.5e12},
            kv_dtype="bfloat16",
            error={"median": 0.03},
            kernel_config={"block_n": 64},
        )
        c2 = store.record_calibration(
            s, device_id=d.id, constants={"hbm_bw": 4.4e12}, kv_dtype="bfloat16", kernel_config={"block_n": 64}
        )
        assert (c1.version, c2.version) == (1, 2)
        store.set_device_bandwidth(s, d.id, 4520.0)
    with store.session_scope(url) as s:
        runs = store.list_runs(s, bucket_key=b.key)
        assert len(runs) == 1 and runs[0].status == "finished" and runs[0].best_params == {"a": 1}
        ms = store.list_measurements(s, bucket_key=b.key, policy_name="tuned")
        assert len(ms) == 1 and ms[0].kv_lens == [100, 300]
        assert store.latest_calibration(s, gpu=GPU, kv_dtype="bfloat16").constants == {"hbm_bw": 4.4e12}
        assert store.measured_read_bandwidth(s, GPU) == 4520.0


# ---------------------------------------------------------------------------
# PostgreSQL (CI starts it; see .ci/run)
# ---------------------------------------------------------------------------


@pytest.mark.postgres
def test_postgres_store(pg_url):
    store.upgrade(pg_url)
    with store.session_scope(pg_url, write=True) as s:
        b = _bucket(s)
        p1, p2 = _policy(s, b), _policy(s, b, params={"x": 2}, score=1.2)
        store.publish(s, p1.id)
        store.publish(s, p2.id)
        assert store.policies_version(s) == 2
    with pytest.raises(IntegrityError):
        with store.session_scope(pg_url, write=True) as s:
            s.get(Policy, p1.id).status = "published"
            s.flush()
    with store.session_scope(pg_url) as s:
        doc = store.export_published(s)
        assert [e["params"] for e in doc["policies"]] == [{"x": 2}]


def test_shipped_policy_ids_are_those_an_empty_store_gives_them(url):
    """load_shipped_table() and a store that imported shipped_policies() (``kvsplit db import``, `make run`) name
    each shipped policy by the same id, so an id from an in-process plan finds the policy over HTTP."""
    from kvsplit.kernels.policy_table import load_shipped_table, shipped_policies

    doc = shipped_policies()
    with store.session_scope(url) as s:
        ids = store.import_policies(s, doc)
        stored = {p.bucket.key: p.id for p in store.list_published(s)}
    assert len(ids) == len(doc["policies"]) == len(stored) > 1000  # the H200's and the H100's tables
    in_process = {e.bucket: e.id for e in load_shipped_table().entries}
    assert in_process == stored
    assert [p["id"] for p in doc["policies"]] == ids  # the document's ids are the store's, in file order
