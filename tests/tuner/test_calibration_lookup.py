"""Which stored calibration a simulation uses (:func:`kvsplit.tuner.calibrate.stored_calibration`): the one of
the task's GPU, KV dtype and q_len, else the q_len-1 fit of the model's dtype (said, with the command that stores
the exact one), else the defaults; never a fit of another fp8 / q_len > 1 shape. On SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kvsplit.db import store
from kvsplit.kernels.shape import Shape
from kvsplit.service.cli import app
from kvsplit.tuner import verify
from kvsplit.tuner.backends import make_backend
from kvsplit.tuner.calibrate import calibrate, stored_calibration
from kvsplit.tuner.search import calibration_for

GPU = "NVIDIA H200"
FP8 = "float8_e4m3fn"
CMD = "kvsplit calibrate --gpu 'NVIDIA H200'"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request, tmp_path):
    u = f"sqlite:///{tmp_path / 'cal.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    store.upgrade(u)
    yield u
    store.dispose_engines()


def _device(s):
    return store.get_or_create_device(s, name=GPU, num_sms=132, hbm_bandwidth_gbps=4800, software={"t": 1}).id


def test_the_exact_fit_else_the_q_len_1_fit_of_the_model_dtype_else_none(url):
    with store.session_scope(url, write=True) as s:
        dev = _device(s)
        bf = store.record_calibration(s, device_id=dev, constants={"hbm_bw": 4.5e12}, kv_dtype="bfloat16").id
        f8 = store.record_calibration(s, device_id=dev, constants={"hbm_bw": 4.6e12}, kv_dtype=FP8).id
    with store.session_scope(url) as s:

        def pick(**kw):
            row, note = stored_calibration(s, GPU, **kw)
            return (row.id if row is not None else None), note

        assert pick(dtype="bfloat16") == (bf, "")
        assert pick(dtype="bf16", kv_dtype="bfloat16") == (bf, "")  # aliases and kv_dtype == dtype: the same shape
        assert pick(dtype="bfloat16", kv_dtype="fp8") == (f8, "")
        # fp8 at q_len 4: not the fp8 q_len-1 fit (its rates hold q_len 1's math), the bf16 q_len-1 one, said
        got, note = pick(dtype="bfloat16", kv_dtype="fp8", q_len=4)
        assert got == bf
        assert note == (
            f"no calibration of {GPU} for KV {FP8}, q_len 4: the simulator uses calibration {bf} (KV bfloat16, "
            f"q_len 1) and models the KV dtype's bytes and the q_len tiles on it; `{CMD} --kv-dtype fp8 --q-len 4` "
            "stores a fit of this shape"
        )
        assert pick(dtype="bfloat16", q_len=2)[0] == bf
        # the KV dtype is the key: an fp8 cache's fit serves an fp16 model's fp8 cache too
        assert pick(dtype="float16", kv_dtype="fp8") == (f8, "")
        # an fp16 model has no q_len-1 fit of its own dtype: the defaults, said
        assert pick(dtype="float16", kv_dtype="fp8", q_len=2) == (
            None,
            f"no calibration of {GPU} for KV {FP8}, q_len 2: the simulator uses its defaults; "
            f"`{CMD} --dtype float16 --kv-dtype fp8 --q-len 2` stores one",
        )
        assert pick(dtype="bfloat16")[0] is not None
        assert stored_calibration(s, "NVIDIA H100 80GB HBM3", dtype="bfloat16")[0] is None
        for kw, name in (
            (dict(dtype="bfloat16", kv_dtype="int8"), "kv_dtype"),
            (dict(dtype="bfloat16", q_len=9), "q_len"),
            (dict(dtype="fp64"), "dtype"),
        ):
            with pytest.raises(ValueError, match=f"^{name}: "):
                stored_calibration(s, GPU, **kw)


def test_a_later_fp8_q_len_4_calibration_leaves_the_bf16_simulation_alone(url):
    """``calibrate`` (timed by the simulator of fp8 at q_len 4) stores its fit as that shape's; the bf16 q_len-1
    simulation keeps the bf16 fit stored before it, by id and by the verification margin it sets."""
    with store.session_scope(url, write=True) as s:
        bf = store.record_calibration(
            s,
            device_id=_device(s),
            constants={"hbm_bw": 4.5e12, "sm_bw": 5.1e10, "cta_bw": 1.7e10},
            kv_dtype="bfloat16",
            error={"heldout": {"median": 0.031, "worst": 0.4}},
        ).id
    shape = Shape.of(device=GPU, num_qo_heads=32, num_kv_heads=4, kv_dtype="fp8", q_len=4)
    rep = calibrate(
        make_backend("sim", shape=shape),
        gpu=GPU,
        num_kv_heads=4,
        head_dim=128,
        dtype="bfloat16",
        page_size=16,
        database_url=url,
        kv_dtype="fp8",
        q_len=4,
        num_qo_heads=32,
    )
    f8 = rep["calibration_id"]
    with store.session_scope(url) as s:
        (row,) = [c for c in store.list_calibrations(s, gpu=GPU) if c.id == f8]
        assert (row.kv_dtype, row.q_len, row.version) == (FP8, 4, 1)
        assert row.constants == rep["constants"] and row.error["heldout"]["median"] == rep["heldout"]["median"]
    cal, _ = calibration_for(url, GPU, "sim", dtype="bfloat16")
    assert (cal["id"], cal["kv_dtype"], cal["q_len"], cal["note"]) == (bf, "bfloat16", 1, "")
    assert cal["constants"]["hbm_bw"] == 4.5e12
    cal, _ = calibration_for(url, GPU, "sim", dtype="bfloat16", kv_dtype=FP8, q_len=4)
    assert (cal["id"], cal["constants"]) == (f8, rep["constants"])
    assert calibration_for(url, GPU, "gpu", dtype="bfloat16") == (None, None)
    assert verify.sim_margin(url, GPU, dtype="bfloat16") == (
        0.031,
        f"held-out median error of calibration {bf} (KV bfloat16, q_len 1)",
    )
    assert verify.sim_margin(url, GPU, dtype="bfloat16", kv_dtype="fp8", q_len=4)[0] == rep["heldout"]["median"]
    assert verify.sim_margin(url, GPU, dtype="bfloat16", kv_dtype="fp8", q_len=2)[0] == 0.031  # the stand-in


def test_tune_says_which_calibration_stands_in_for_its_kv_dtype_and_q_len(tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    store.upgrade(url)
    with store.session_scope(url, write=True) as s:
        bf = store.record_calibration(
            s,
            device_id=_device(s),
            constants={"hbm_bw": 4.5e12, "sm_bw": 5.1e10, "cta_bw": 1.7e10},
            kv_dtype="bfloat16",
        ).id
    args = ["tune", "--backend", "sim", "--gpu", "h200", "--family", "uniform", "--batch-size", "16"]
    args += ["--trials", "2", "--num-train", "1", "--num-heldout", "1", "--no-progress", "--database-url", url]
    r = CliRunner().invoke(app, [*args, "--kv-dtype", "fp8", "--q-len", "4"])
    assert r.exit_code == 0, r.output
    notes = [ln for ln in r.output.splitlines() if ln.startswith("note: ")]
    assert notes == [
        f"note: no calibration of {GPU} for KV {FP8}, q_len 4: the simulator uses calibration {bf} (KV bfloat16, "
        f"q_len 1) and models the KV dtype's bytes and the q_len tiles on it; `{CMD} --kv-dtype fp8 --q-len 4` "
        "stores a fit of this shape"
    ]
    r = CliRunner().invoke(app, args)  # the bf16 q_len-1 tune has its own fit: nothing to say
    assert r.exit_code == 0, r.output
    assert not [ln for ln in r.output.splitlines() if ln.startswith("note: ")]
