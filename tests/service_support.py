"""Test data and a live-server helper for the service tests (tests/service/: test_service, test_client, ...).

``fill_store(url)`` writes, through the store API only, a small but realistic
store: Qwen3-30B-A3B-shape buckets of the five reference families at several
batch sizes with GPU-tuned published policies, one simulated-only bucket, a
draft, tuning runs, and held-out verification measurements of ``tuned`` and the
baselines. ``LiveServer`` runs ``kvsplit serve`` as a real subprocess on a free
loopback port.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvsplit.db import store
from kvsplit.kernels.buckets import bucket_key
from kvsplit.tuner.workloads import family_kv_lens

ROOT = Path(__file__).resolve().parents[1]
GPU = "NVIDIA H200"
SHAPE = dict(gpu=GPU, num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)
SHAPE_ARGS = [x for k, v in SHAPE.items() for x in (f"--{k.replace('_', '-')}", str(v))]  # SHAPE as CLI flags
TOTAL = 262_144
FAMILIES = ("uniform", "skewed40", "skewed80", "2x40")
BATCH_SIZES = (16, 64, 256)
# "measured" time / HBM floor per policy and family (monotone in B like the reference study)
_BASE_RATIO = {"tuned": 1.12, "balanced": 1.3, "fa3": 2.4, "flashinfer": 3.5, "no_split": 9.0}


@dataclass
class StoreInfo:
    url: str
    published: dict  # bucket key -> policy id (GPU-tuned)
    sim_key: str  # bucket key with only a simulated policy
    sim_id: int
    draft_id: int
    draft_key: str


def key_of(lens, **shape) -> str:
    s = dict(SHAPE, **shape)
    return str(
        bucket_key(
            np.asarray(lens),
            num_kv_heads=s["num_kv_heads"],
            head_dim=s["head_dim"],
            dtype=s["dtype"],
            device=s["gpu"],
            page_size=s["page_size"],
        )
    )


def add_bucket(session, lens, source: str, *, signature=None, **shape):
    """The bucket row of the batch ``lens`` at :data:`SHAPE` (with ``shape``'s changes; key :func:`key_of`),
    created with ``source`` and ``signature`` when missing."""
    s = dict(SHAPE, **shape)
    return store.get_or_create_bucket(
        session,
        key=key_of(lens, **shape),
        gpu=s["gpu"],
        num_kv_heads=s["num_kv_heads"],
        head_dim=s["head_dim"],
        dtype=s["dtype"],
        page_size=s["page_size"],
        source=source,
        signature=signature,
    )


def fill_store(url: str) -> StoreInfo:
    store.upgrade(url)
    published = {}
    rng = np.random.default_rng(11)
    with store.session_scope(url, write=True) as s:
        dev = store.get_or_create_device(
            s,
            name=GPU,
            num_sms=132,
            hbm_bandwidth_gbps=4800.0,
            software={"torch": "2.11", "triton": "3.6.0"},
            read_bandwidth_gbps=4500.0,
        )
        for fam in FAMILIES:
            for B in BATCH_SIZES:
                lens = family_kv_lens(fam, B, TOTAL)
                b = add_bucket(s, lens, f"family:{fam} B={B} T={TOTAL}", signature={"family": fam})
                key = b.key
                run = store.start_run(s, bucket_id=b.id, study_name=f"kvsplit/{key}", backend="gpu", n_trials=40)
                store.finish_run(
                    s, run.id, status="finished", n_finished=40, best_value=1.1e-4, best_params={"ctas_per_sm": 3.0}
                )
                ctas = {16: 2.0, 64: 3.0, 256: 6.0}[B]
                pol = store.create_policy(
                    s,
                    bucket_id=b.id,
                    params={"ctas_per_sm": ctas},
                    backend="gpu",
                    score=1.12,
                    verification={"passed": True},
                    tuning_run_id=run.id,
                    device_id=dev.id,
                    name="balanced",
                )
                store.publish(s, pol.id)
                published[key] = pol.id
                growth = 1.0 + np.log2(B) / 8
                for i in range(4):
                    batch = np.maximum(1, (lens * rng.uniform(0.9, 1.1, B)).astype(np.int64))
                    floor = batch.sum() * 4 * 128 * 2 * 2 / 4.5e12
                    for name, r in _BASE_RATIO.items():
                        ratio = r * (growth if name in ("flashinfer", "no_split") and fam != "uniform" else 1.0)
                        ratio *= rng.uniform(0.98, 1.02)
                        store.record_measurement(
                            s,
                            bucket_id=b.id,
                            policy_name=name,
                            kv_lens=batch.tolist(),
                            time_s=floor * ratio,
                            floor_s=floor,
                            role="heldout",
                            batch_index=i,
                            stage="verify",
                            tuning_run_id=run.id,
                            policy_id=pol.id if name == "tuned" else None,
                            backend="gpu",
                        )
        # a bucket far from every family above, with only a simulated policy
        b = add_bucket(s, [1] * 4000, "synthetic tiny")
        sim_key = b.key
        run = store.start_run(s, bucket_id=b.id, study_name=f"kvsplit/{sim_key}", backend="sim", n_trials=20)
        sim = store.create_policy(
            s, bucket_id=b.id, params={"num_splits": 1}, backend="sim", score=1.5, tuning_run_id=run.id, name="fixed"
        )
        store.publish(s, sim.id)
        # a draft for another shape (Llama-3.1-8B: H_kv = 8)
        b = add_bucket(s, family_kv_lens("uniform", 64, TOTAL), "family:uniform B=64", num_kv_heads=8)
        dkey = b.key
        draft = store.create_policy(
            s, bucket_id=b.id, params={"ctas_per_sm": 5.0}, backend="gpu", score=1.1, name="balanced"
        )
    return StoreInfo(url, published, sim_key, sim.id, draft.id, dkey)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """``kvsplit serve`` as a subprocess on a free loopback port (context manager)."""

    def __init__(
        self,
        db_url: str,
        *,
        workers: int = 1,
        admin_token: str | None = None,
        reload_interval: float = 0.5,
        cwd: str | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ)
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        env["KVSPLIT_RELOAD_INTERVAL_S"] = str(reload_interval)
        if admin_token:
            env["KVSPLIT_ADMIN_TOKEN"] = admin_token
        else:
            env.pop("KVSPLIT_ADMIN_TOKEN", None)
        self.cmd = [
            sys.executable,
            "-m",
            "kvsplit.service.cli",
            "serve",
            "--database-url",
            db_url,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            str(workers),
            "--log-level",
            "warning",
        ]
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> LiveServer:
        self.proc = subprocess.Popen(
            self.cmd, env=self.env, cwd=self.cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvsplit serve exited: {self.proc.stdout.read().decode()[-3000:]}")
            try:
                urllib.request.urlopen(self.url + "/healthz", timeout=1).read()
                return self
            except Exception:
                time.sleep(0.1)
        self.__exit__(None, None, None)
        raise RuntimeError("kvsplit serve did not come up in 60 s")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def write_peer_csv(path, impl: str, rows, meta: dict) -> None:
    """A bench/peers.py CSV of ``impl`` with ``rows`` (set, family, B, total_tokens, time_us, ratio_to_read_floor)
    and its ``<path>.json`` holding ``meta``, as the bench writes them."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["implementation", "set", "family", "B", "total_tokens", "time_us", "ratio_to_read_floor"])
        for r in rows:
            w.writerow([impl, *r])
    Path(str(path) + ".json").write_text(json.dumps(meta))
