"""The main job of ``make run`` (``kvsplit run``).

1. Create or migrate the policy store (``KVSPLIT_DATABASE_URL``, default
   ``sqlite:///./kvsplit.db``).
2. Import the policies the project ships (:data:`kvsplit.kernels.policy_table.SHIPPED_TABLES`: the H200's
   table, tuned with the GPU backend, docs/guides/tuning.md "Rebuilding the shipped table", and the H100's,
   built by ``kvsplit tune --campaign``), their GPU measurements and each GPU's simulator calibration fitted with
   its table (:data:`SHIPPED_DATA`), and the calibrations of its other families (:data:`SHIPPED_CALIBRATIONS`) —
   once; a second run finds them.
3. Tune a small demo set of buckets, one per shipped model shape
   (Qwen3-30B-A3B 32/4/128, Llama-3.1-8B 32/8/128, Llama-3.1-70B at TP 8,
   8/1/128; bf16, page_size 16), on the best backend here: the GPU when CUDA is
   present and ``kvsplit.kernels.device`` describes it (the buckets are then that GPU's), else the calibrated
   simulator (the H200's buckets). GPU results are published under the
   store's rules; simulator results stay drafts (tuning run, held-out
   verification with the simulator's error margin, all in the store and on the
   dashboard), so the service this job starts serves measured policies only: a
   simulator claim is never served by default (publish a draft with ``POST
   /v1/policies/{id}/publish`` to accept it). A bucket whose study finished and
   was verified before is not tuned again, so a second run records no new
   tuning run.
4. Serve the plan service on localhost, print the dashboard URL and a sample
   ``curl`` of ``POST /v1/plan`` with its answer, and serve until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
import urllib.request
from importlib import resources
from typing import Any

from ..kernels.policy_table import shipped_policies
from ..tuner.workloads import MODEL_SHAPES

__all__ = ["run", "prepare", "serve", "DEMO_BUCKETS", "SAMPLE_REQUEST", "SHIPPED_DATA", "SHIPPED_CALIBRATIONS"]

GPU = "NVIDIA H200"
SHAPES = {  # the models of the demo buckets: their heads per GPU (kvsplit.tuner.workloads.MODEL_SHAPES)
    name: dict(zip(("num_qo_heads", "num_kv_heads", "head_dim"), MODEL_SHAPES[preset], strict=True))
    for name, preset in (
        ("Qwen3-30B-A3B", "qwen3-30b-a3b"),
        ("Llama-3.1-8B", "llama-3.1-8b"),
        ("Llama-3.1-70B TP8", "llama-3.1-70b-tp8"),
    )
}
DEMO_BUCKETS = (
    ("Qwen3-30B-A3B", "family", ("2x40", 1024, 1_048_576)),
    ("Llama-3.1-8B", "trace", ("azure_conv", 64)),
    ("Llama-3.1-70B TP8", "trace", ("mooncake", 16)),
)
"""(shape, kind, args) of the demo buckets ``make run`` tunes."""
DEMO_TRIALS = 30


def _sample_kv_lens() -> list[int]:
    # a skewed80 batch of 64 requests (one holds 80 % of 262,144 tokens), lengths jittered
    # by +-10 % as real batches are: it falls in a bucket the shipped H200 policies cover
    from ..tuner.workloads import family_batches

    return [int(x) for x in family_batches("skewed80", 64, 262_144, num_batches=1, seed=42, role="heldout")[0]]


SAMPLE_REQUEST: dict[str, Any] = {
    "gpu": GPU,
    "num_qo_heads": 32,
    "num_kv_heads": 4,
    "head_dim": 128,
    "dtype": "bfloat16",
    "page_size": 16,
}


def _say(msg: str) -> None:
    print(f"[kvsplit run] {msg}", flush=True)


def _data(name: str) -> dict[str, Any]:
    return json.loads(resources.files("kvsplit.service").joinpath("data", name).read_text())


def _per_gpu(doc: dict[str, Any]) -> str:
    """``"263 NVIDIA H200, 840 NVIDIA H100 80GB HBM3"``: an export's policies counted per GPU, in file order."""
    n: dict[str, int] = {}
    for p in doc["policies"]:
        n[p["bucket"]["gpu"]] = n.get(p["bucket"]["gpu"], 0) + 1
    return ", ".join(f"{v} {k}" for k, v in n.items())


SHIPPED_DATA = (
    ("h200_measurements.json", "h200_calibration.json"),
    ("h100_measurements.json", "h100_calibration.json"),
)
"""Per shipped table (:data:`kvsplit.kernels.policy_table.SHIPPED_TABLES`, same order), in ``kvsplit/service/data``:
its GPU measurements (the H200's: each bucket's training batch, timed with its plan and ``balanced``; the H100's:
each bucket's held-out batch, timed with its plan and the four baselines, and an fp8 bucket's also with its
family's fallback, by the campaign's verify step) and the simulator calibration of that GPU fitted with it (the
bf16 q_len-1 fit: the import stores one per GPU)."""

SHIPPED_CALIBRATIONS = ("h100_calibrations.json",)
"""Calibration exports (``kvsplit db export --calibrations``, format ``kvsplit.calibrations``), in
``kvsplit/service/data``, of the shipped tables' families other than bf16 q_len 1: the fits the H100's campaigns
made at their own shape before building the table's verify-step (bf16 KV, q_len 2, 4 and 8) and fp8-KV (q_len 1)
families (docs/results.md), so that the simulator (``kvsplit tune --backend sim``, the dashboard's plan viewer)
models those families with their own fit, not the q_len-1 one. An entry whose (GPU, KV dtype, q_len) has a stored
calibration is not imported."""


def _import_shipped(url: str) -> None:
    from ..db import store
    from ..kernels.device import resolve_device
    from ..tuner.calibrate import check_calibration_entry

    doc = shipped_policies()
    said: list[str] = []  # said once the transaction has committed (a full disk fails at the commit)
    with store.session_scope(url, write=True) as s:
        have = {b.key for b in store.list_buckets(s)}
        want = {p["bucket"]["key"] for p in doc["policies"]}
        if want <= have:  # imported before (policies an operator retired since stay retired)
            said.append(f"shipped policies already in the store ({len(want)} buckets: {_per_gpu(doc)})")
        else:
            # a store from before a table was shipped gets that table's buckets; its own are imported again
            # (nothing changes: import_policies reuses identical rows) and keep their measurements
            new = want - have
            store.import_policies(s, doc)
            meas = [m for f, _ in SHIPPED_DATA for m in _data(f)["measurements"] if m["bucket"] in new]
            buckets = {k: store.get_bucket(s, k).id for k in {m["bucket"] for m in meas}}
            published = {p.bucket_id: p.id for p in store.list_published(s)}
            for m in meas:
                b = buckets[m["bucket"]]
                store.record_measurement(
                    s,
                    bucket_id=b,
                    policy_name=m["policy_name"],
                    params=m["params"],
                    kv_lens=m["kv_lens"],
                    time_s=m["time_s"],
                    floor_s=m["floor_s"],
                    role=m["role"],
                    batch_index=m["batch_index"],
                    backend=m["backend"],
                    software=m["software"],
                    stage="verify",
                    # a held-out timing of the shipped plan is its policy's own verification (the dashboard's
                    # figures); the H200's training timings predate its whole-wave params, so they name no policy
                    policy_id=published.get(b) if m["policy_name"] == "tuned" and m["role"] == "heldout" else None,
                )
            added = {**doc, "policies": [p for p in doc["policies"] if p["bucket"]["key"] in new]}
            line = f"imported {len(added['policies'])} shipped policies (GPU-tuned: {_per_gpu(added)})"
            if meas:
                n: dict[tuple[str, str], int] = {}
                for m in meas:
                    k = ("held-out" if m["role"] == "heldout" else "training", m["software"].get("gpu", "?"))
                    n[k] = n.get(k, 0) + 1
                line += " and their GPU measurements (" + ", ".join(f"{v} {r} on the {g}" for (r, g), v in n.items())
                line += ")"
            said.append(line)
        for _, cal_file in SHIPPED_DATA:
            cal = _data(cal_file)
            if store.latest_calibration(s, gpu=cal["gpu"], kv_dtype=cal["dtype"], q_len=1) is not None:
                continue
            spec = resolve_device(cal["gpu"])
            dev = store.get_or_create_device(
                s,
                name=cal["gpu"],
                num_sms=spec.num_sms,
                hbm_bandwidth_gbps=spec.hbm_bandwidth_gbps,
                software={"source": cal["source"]},
                read_bandwidth_gbps=cal["read_bandwidth_gbps"],
            )
            store.record_calibration(
                s,
                device_id=dev.id,
                constants=cal["constants"],
                kv_dtype=cal["dtype"],  # the shipped fits: K/V in the model's dtype, q_len 1
                q_len=1,
                error=cal["error"],
                kernel_config=cal["kernel_config"],
                num_samples=cal["num_samples"],
            )
            said.append(
                f"stored the {cal['gpu']} simulator calibration (held-out error median "
                f"{cal['error']['heldout']['median']:.1%}, worst {cal['error']['heldout']['worst']:.1%})"
            )
        for f in SHIPPED_CALIBRATIONS:
            cal_doc = _data(f)
            missing = [
                e
                for e in cal_doc["calibrations"]
                if store.latest_calibration(s, gpu=e["device"]["name"], kv_dtype=e["kv_dtype"], q_len=e["q_len"])
                is None
            ]
            if missing:
                store.import_calibrations(
                    s, {**cal_doc, "calibrations": missing}, validate_entry=check_calibration_entry
                )
                fits = ", ".join(
                    f"KV {e['kv_dtype']} q_len {e['q_len']} ({e['error']['heldout']['median']:.1%})" for e in missing
                )
                said.append(
                    f"stored {len(missing)} more {missing[0]['device']['name']} simulator calibrations, "
                    f"held-out error median: {fits}"
                )
    for line in said:
        _say(line)


def _local_gpu() -> str | None:
    """This machine's CUDA GPU by its ``kvsplit.kernels.device`` name, or None (no CUDA, or a GPU the project does
    not describe: the demo then runs on the simulator)."""
    from ..kernels.device import resolve_device

    try:
        import torch

        if torch.cuda.is_available():
            return resolve_device(torch.cuda.get_device_name()).name
    except (ImportError, ValueError):
        pass
    return None


def _backend_name() -> str:
    return "gpu" if _local_gpu() is not None else "sim"


def _demo_gpu(backend: str) -> str:
    """The GPU the demo buckets are for: this machine's when they are tuned on its GPU (a bucket is timed only on
    its own GPU: an H100 tunes H100 buckets), else :data:`GPU`, the GPU of the shipped simulator calibration."""
    return (_local_gpu() or GPU) if backend == "gpu" else GPU


def _verified_before(url: str, task: Any, backend: str) -> Any:
    """The policy verified from a finished study of ``task`` on ``backend``, or None.

    Such a bucket has nothing left to tune: a restart of ``make run`` leaves it
    alone instead of recording another tuning run that only re-verifies.
    """
    from ..db import store
    from ..tuner import search

    name = search.study_name(task, backend)
    with store.session_scope(url) as s:
        runs = {
            r.id
            for r in store.list_runs(s, bucket_key=task.key, status="finished", limit=None)
            if r.study_name == name and r.n_finished >= DEMO_TRIALS
        }
        if not runs:
            return None
        return next(
            (
                p
                for p in store.list_policies(s, bucket_key=task.key)
                if p.backend == backend and p.verification and p.tuning_run_id in runs
            ),
            None,
        )


def _result_line(key: str, state: str, verification: dict | None, published: bool, note: str) -> str:
    v = (verification or {}).get("policies", {})
    tuned = v.get("tuned", {}).get("geomean_ratio")
    best_base = min((x["geomean_ratio"], k) for k, x in v.items() if k != "tuned") if len(v) > 1 else None
    line = f"  {key}: {state}"
    if tuned and best_base:
        line += f", tuned {tuned:.2f}x floor vs best baseline {best_base[1]} {best_base[0]:.2f}x"
    if published:
        line += " -> published" + (f" ({note})" if note else "")
    else:
        line += " -> " + (note or "not published")
    return line


def _tune_demo(url: str, backend: str) -> None:
    from ..tuner import search

    tasks = []
    gpu = _demo_gpu(backend)
    for shape_name, kind, args in DEMO_BUCKETS:
        shape = dict(SHAPES[shape_name], gpu=gpu, dtype="bfloat16", page_size=16, seed=0)
        if kind == "family":
            fam, B, T = args
            tasks.append(search.family_task(fam, B, T, **shape))
        else:
            name, B = args
            tasks += search.trace_tasks(name, batch_sizes=(B,), **shape)[:1]
    todo = []
    for t in tasks:
        done = _verified_before(url, t, backend)
        if done is None:
            todo.append(t)
        else:
            print(
                _result_line(
                    t.key,
                    f"tuned before ({backend}), verified as policy {done.id}",
                    done.verification,
                    done.status == "published",
                    "" if done.status == "published" else (done.note or f"not published ({done.status})"),
                ),
                flush=True,
            )
    if not todo:
        _say(f"all {len(tasks)} demo buckets were tuned and verified before: nothing to tune")
        return
    what = (
        "the GPU (CUDA found; verified policies are published)"
        if backend == "gpu"
        else "the calibrated simulator (no GPU here; results stay drafts, not served: see the dashboard)"
    )
    _say(f"tuning {len(todo)} demo buckets on {what}, {DEMO_TRIALS} trials each")
    # a live progress bar on a terminal; one line per bucket in logs
    cfg = search.TuneConfig(
        database_url=url,
        n_trials=DEMO_TRIALS,
        backend=backend,
        progress=sys.stderr.isatty(),
        publish=backend == "gpu",  # a simulator claim is never served by default (module doc, step 3)
    )
    for r in search.tune(todo, cfg):
        note = r.message
        if backend != "gpu" and not r.published and not note:
            note = (
                f"draft (simulated, not served; publish it with POST /v1/policies/{r.policy_id}/publish and the "
                "admin token, on a server started with KVSPLIT_ADMIN_TOKEN set)"
            )
        print(
            _result_line(r.bucket_key, f"{r.status}, {r.n_finished} trials", r.verification, r.published, note),
            flush=True,
        )


def _free_port(host: str, preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            # as uvicorn binds: TIME_WAIT sockets of a previous run must not push us off the port
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
                return s.getsockname()[1]
            except OSError:
                continue
    raise RuntimeError("no free TCP port")


def _show_sample(base: str, server: Any) -> None:
    # the app's start-up compiles (or loads from numba's disk cache) the request scan and the answer writer:
    # a minute or more on a fresh install of a 2-core machine, so wait for it rather than a fixed 10 s
    deadline = time.monotonic() + 900
    while not server.started and not server.should_exit and time.monotonic() < deadline:
        time.sleep(0.05)
    if not server.started:
        return
    body = json.dumps({**SAMPLE_REQUEST, "kv_lens": _sample_kv_lens()})
    req = urllib.request.Request(base + "/v1/plan", data=body.encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            answer = json.loads(resp.read())
    except Exception as exc:  # noqa: BLE001 - printed, the server keeps running
        _say(f"sample request failed: {exc}")
        _say("serving until Ctrl-C")
        return
    print(flush=True)
    _say(f"dashboard:  {base}/")
    _say(f"policies:   {base}/v1/policies    metrics: {base}/metrics    API docs: {base}/v1/docs")
    _say("sample plan request:")
    # -w '\n': the JSON answer has no trailing newline; without it the shell prompt lands on its last line
    print(f"curl -s -w '\\n' -X POST {base}/v1/plan -H 'Content-Type: application/json' -d '{body}'", flush=True)
    short = {k: answer[k] for k in ("policy", "bucket", "num_splits", "config") if k in answer}
    short["work_items"] = len(answer.get("work_request", []))
    _say("answer (work list omitted):")
    print("{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in short.items()) + "\n}", flush=True)
    _say("serving until Ctrl-C")


def prepare(url: str, *, tune: bool = True) -> None:
    """Steps 1-3 of the module doc on the store at ``url``: create or migrate it, import the shipped
    policies, tune the demo buckets (``tune``). Store failures propagate (``kvsplit run`` prints one line)."""
    from ..db import store

    _say(f"opening the policy store {store.safe_url(url)} (creating or migrating its schema)")
    _say(f"store {store.safe_url(url)} ready (schema revision {store.upgrade(url)})")
    _import_shipped(url)
    from .warmup import heartbeat, warmup

    # loads what `make` compiled into numba's disk cache (seconds); compiles it, saying so, where it is cold
    warmup(_say)
    if tune:  # a terminal shows tqdm's live bar; logs get a line every 4 s
        with contextlib.nullcontext() if sys.stderr.isatty() else heartbeat(_say, "tuning the demo buckets"):
            _tune_demo(url, _backend_name())


def serve(settings: Any, *, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Step 4: serve the store of ``settings`` on ``host:port`` (another free port if taken, said so) until
    Ctrl-C, with the dashboard URL and a sample request printed once it is up."""
    import uvicorn

    from .app import create_app

    wanted = port
    port = _free_port(host, wanted)
    if wanted and port != wanted:
        _say(f"port {wanted} is busy on {host}: serving on port {port} instead")
    config = uvicorn.Config(
        create_app(settings), host=host, port=port, log_level="warning", timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    _say(f"starting the plan service on http://{host}:{port} (then a sample plan request)")
    threading.Thread(target=_show_sample, args=(f"http://{host}:{port}", server), daemon=True).start()
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the captured Ctrl-C after its clean shutdown
        pass
    _say("stopped")


def run(
    *, host: str = "127.0.0.1", port: int | None = None, tune: bool = True, database_url: str | None = None
) -> None:
    """Run the main job (see the module doc); blocks until Ctrl-C. ``database_url``: the store (default
    KVSPLIT_DATABASE_URL from the environment or ./.env, else ./kvsplit.db); ``port``: default KVSPLIT_PORT,
    else 8000.

    Raises
    ------
    pydantic.ValidationError
        A bad ``KVSPLIT_*`` setting.
    sqlalchemy.exc.SQLAlchemyError, OSError
        The store cannot be created or written (``kvsplit run`` prints them as one line).
    """
    from ..db import store
    from .settings import Settings

    over: dict[str, Any] = {}
    if database_url is not None:
        over["database_url"] = database_url
    if port is not None:
        over["port"] = port
    settings = Settings(**over)
    url = store.resolve_url(settings.database_url)
    prepare(url, tune=tune)
    serve(settings, host=host, port=settings.port)


if __name__ == "__main__":  # pragma: no cover
    run()
    sys.exit(0)
