"""``kvsplit tune``: tune, verify and publish ``tuned`` policies per bucket.

One of three workload selections:

- ``--family F --batch-size B [--total-tokens T]``: the bucket of that
  synthetic batch (jittered training / held-out draws, docs/concepts/design.md §6);
- ``--trace NAME``: the buckets of a shipped trace (continuous-batching
  replay of Azure code/conv and Mooncake, i.i.d. draws of ShareGPT/arXiv) at
  ``--batch-size`` (default 16, 64 and 256), with ``--rate-scale``,
  ``--token-budget``, ``--max-batch-size``, ``--max-kv-len``;
- ``--all``: the default library (:func:`kvsplit.tuner.search.default_library`);
- ``--from-traffic N``: N bucket keys of ``--gpu`` whose policies would serve
  the most requests the plan service answered with the fallback or from far
  away (a greedy cover: nearby keys of one workload count once), on batches
  drawn from its recorded traffic statistics (:mod:`kvsplit.tuner.traffic`);
- ``--campaign``: a GPU's whole table for one model shape, resumable, within
  ``--budget-minutes`` (:mod:`kvsplit.tuner.campaign`, :mod:`.campaign`;
  docs/guides/tuning.md).

Storage of the Optuna studies: the ``--database-url`` for one worker;
``--journal PATH`` for ``--workers K`` processes on one host; a PostgreSQL URL
for several hosts. Re-running the same command resumes and stops at exactly
``--trials`` finished trials per bucket. Tuners sharing a PostgreSQL URL or a
journal cooperate; a SQLite store is tuned by one process at a time (a lock
file ``<store>.tune-lock`` beside it): a second tuner stops at once with one
line naming the first (PID, host). Dead tuners' ``running`` rows are marked
``failed`` at the next start (:func:`kvsplit.db.store.reap_runs`). Ctrl-C
stops after the current trial (twice: at once).

A bucket keeps the training and held-out batches it was first tuned on; a
later ``tune`` into the same bucket whose flags (``--seed``,
``--total-tokens``, ``--num-train``, ...) draw other batches is refused.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from .faults import hold_tuning_lock, is_store_failure, store_errors, store_failure
from .options import (
    DatabaseUrl,
    Dtype,
    Gpu,
    HeadDim,
    KvDtype,
    NumKvHeads,
    NumQoHeads,
    PageSize,
    QLen,
    check_backend,
    existing_store,
    fail,
    flag_message,
    store_url,
)

__all__ = ["tune_cmd"]


def tune_cmd(
    ctx: typer.Context,
    gpu: Gpu = "NVIDIA H200",
    num_qo_heads: NumQoHeads = 32,
    num_kv_heads: NumKvHeads = 4,
    head_dim: HeadDim = 128,
    dtype: Dtype = "bfloat16",
    page_size: PageSize = 16,
    kv_dtype: KvDtype = None,
    q_len: QLen = 1,
    family: Annotated[
        Optional[str], typer.Option("--family", metavar="FAMILY", help="uniform, skewed40, skewed60, skewed80, 2x40")
    ] = None,
    batch_size: Annotated[
        Optional[int], typer.Option("--batch-size", metavar="B", min=1, help="B of the family / trace batches")
    ] = None,
    total_tokens: Annotated[
        int, typer.Option("--total-tokens", metavar="T", min=1, help="T of the family batch")
    ] = 262_144,
    trace: Annotated[
        Optional[str], typer.Option("--trace", metavar="NAME", help="azure_code, azure_conv, mooncake, sharegpt, arxiv")
    ] = None,
    all_: Annotated[bool, typer.Option("--all", metavar="", help="tune the default bucket library")] = False,
    from_traffic: Annotated[
        Optional[int],
        typer.Option(
            "--from-traffic",
            metavar="N",
            min=1,
            help="tune N bucket keys of --gpu's served traffic (GET /v1/traffic) that cover the most fallback "
            "or far requests (a key's policy also serves its neighbours within distance 1.0), on batches drawn "
            "from the recorded statistics",
        ),
    ] = None,
    traffic_hours: Annotated[
        int, typer.Option("--traffic-hours", metavar="H", min=1, help="--from-traffic: hours of statistics read")
    ] = 168,
    trials_given: Annotated[
        Optional[int],
        typer.Option(
            "--trials",
            metavar="N",
            min=1,
            help="finished (complete + pruned) trials per bucket (default 40; with "
            "--campaign: the most per bucket, default 48)",
        ),
    ] = None,
    backend: Annotated[
        str, typer.Option("--backend", metavar="NAME", help="sim (calibrated simulator) or gpu (the kernel)")
    ] = "sim",
    database_url: DatabaseUrl = None,
    workers: Annotated[
        int, typer.Option("--workers", metavar="K", min=1, help="worker processes sharing each study")
    ] = 1,
    timeout: Annotated[
        Optional[float], typer.Option("--timeout", metavar="SECONDS", help="seconds per bucket; then verify the best")
    ] = None,
    journal: Annotated[
        Optional[Path], typer.Option("--journal", metavar="PATH", help="Optuna JournalFileBackend file (multi-process)")
    ] = None,
    seed: Annotated[
        int, typer.Option("--seed", metavar="N", min=0, help="seed of the batches and the TPE sampler")
    ] = 0,
    num_train_given: Annotated[
        Optional[int],
        typer.Option("--num-train", metavar="N", min=1, help="training batches per bucket (default 8; campaign 1)"),
    ] = None,
    num_heldout_given: Annotated[
        Optional[int],
        typer.Option("--num-heldout", metavar="N", min=1, help="held-out batches per bucket (default 8; campaign 1)"),
    ] = None,
    rate_scale: Annotated[
        Optional[float], typer.Option("--rate-scale", metavar="X", help="trace arrival-rate multiplier (auto)")
    ] = None,
    token_budget: Annotated[
        Optional[int], typer.Option("--token-budget", metavar="TOKENS", min=1, help="trace replay KV capacity")
    ] = None,
    max_batch_size: Annotated[
        Optional[int],
        typer.Option("--max-batch-size", metavar="B", min=1, help="trace replay batch cap (default --batch-size)"),
    ] = None,
    max_kv_len: Annotated[
        Optional[int], typer.Option("--max-kv-len", metavar="TOKENS", min=1, help="cap kv_len (model context)")
    ] = None,
    max_buckets: Annotated[
        Optional[int], typer.Option("--max-buckets", metavar="N", min=1, help="most buckets of a trace")
    ] = None,
    heartbeat_interval: Annotated[
        int, typer.Option("--heartbeat-interval", metavar="SECONDS", min=1, help="worker heartbeat period")
    ] = 5,
    grace_period: Annotated[
        int,
        typer.Option("--grace-period", metavar="SECONDS", min=2, help="silence after which a running trial is failed"),
    ] = 30,
    publish: Annotated[
        bool, typer.Option("--publish/--no-publish", metavar="", help="publish verified policies")
    ] = True,
    progress: Annotated[
        bool,
        typer.Option(
            "--progress/--no-progress",
            metavar="",
            help="progress bars when stderr is a terminal, else plain lines on stderr (one per bucket; "
            "with --campaign, one per step and every 10 s)",
        ),
    ] = True,
    json_out: Annotated[bool, typer.Option("--json", metavar="", help="print the results as JSON")] = False,
    campaign: Annotated[
        bool,
        typer.Option(
            "--campaign",
            metavar="",
            help="build the GPU's whole table for a model shape (resumable; docs/guides/tuning.md)",
        ),
    ] = False,
    model_shape: Annotated[
        Optional[str],
        typer.Option(
            "--model-shape",
            metavar="NAME|HQ/HKV/D",
            help="campaign shape: qwen3-30b-a3b, llama-3.1-8b, llama-3.1-70b-tp8 or H_q/H_kv/head_dim "
            "(default: --num-qo-heads/--num-kv-heads/--head-dim)",
        ),
    ] = None,
    budget_minutes: Annotated[
        float,
        typer.Option(
            "--budget-minutes",
            metavar="MIN",
            help="campaign: GPU minutes in all (simulated minutes with --backend sim)",
        ),
    ] = 15.0,
    max_minutes: Annotated[
        Optional[float],
        typer.Option(
            "--max-minutes",
            metavar="MIN",
            help="campaign: stop after this many wall minutes of this invocation (exit 75); rerun to resume",
        ),
    ] = None,
    previous: Annotated[
        Optional[Path],
        typer.Option(
            "--previous",
            metavar="PATH",
            help="campaign: the policies export being replaced (hysteresis); default: the store's published table",
        ),
    ] = None,
    batch_sizes: Annotated[
        Optional[str],
        typer.Option("--batch-sizes", metavar="LIST", help="campaign: family B values (default 1,2,4,...,1024)"),
    ] = None,
    totals: Annotated[
        Optional[str],
        typer.Option("--totals", metavar="LIST", help="campaign: family T values (default 262144,1048576)"),
    ] = None,
    traces: Annotated[
        Optional[str],
        typer.Option("--traces", metavar="LIST", help="campaign: traces ('none' for none; default all shipped)"),
    ] = None,
) -> None:
    """Tune the `tuned` policy of one or more buckets, verify it against the baselines, publish it.

    Several tuners at once: tuners sharing a PostgreSQL --database-url (or a --journal PATH) cooperate on each bucket's study (trials claimed atomically; exactly --trials finished trials). A SQLite store holds the studies of one tuner at a time: another `kvsplit tune` on the same file (without --journal) stops at once with one line naming the tuner that holds it (PID, host).

    A run whose process died (kill -9, crash) is marked failed ("abandoned: ...") at the next tune start and in GET /v1/runs.
    """  # noqa: E501 - one line per paragraph: the help text reflows it
    from ...db import store
    from ...tuner import search

    shape = dict(
        gpu=gpu,
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        page_size=page_size,
        kv_dtype=kv_dtype,
        q_len=q_len,
    )
    if campaign:
        from .campaign import campaign_cmd

        if family is not None or trace is not None or all_ or from_traffic is not None:
            fail("--campaign builds every bucket: give none of --family, --trace, --all, --from-traffic")
        campaign_cmd(
            **shape,
            model_shape=model_shape,
            backend=backend,
            database_url=database_url,
            budget_minutes=budget_minutes,
            max_minutes=max_minutes,
            seed=seed,
            workers=workers,
            journal=journal,
            previous=previous,
            batch_sizes=batch_sizes,
            totals=totals,
            traces=traces,
            trials=trials_given,
            num_train=num_train_given,
            num_heldout=num_heldout_given,
            publish=publish,
            progress=progress,  # bars on a terminal, plain lines in a log (kvsplit.tuner.campaign)
            json_out=json_out,
        )
        return
    trials = trials_given or 40
    num_train = num_train_given or search.DEFAULT_TRAIN
    num_heldout = num_heldout_given or search.DEFAULT_HELDOUT
    chosen = [x for x in (family is not None, trace is not None, all_, from_traffic is not None) if x]
    if len(chosen) != 1:
        fail("choose exactly one of --family, --trace, --all, --from-traffic, --campaign")
    url = store_url(database_url)
    try:
        cfg = search.TuneConfig(
            database_url=url,
            n_trials=trials,
            backend=backend,
            workers=workers,
            timeout=timeout,
            journal=str(journal) if journal else None,
            seed=seed,
            progress=progress and sys.stderr.isatty(),  # no carriage-return redraws in a piped log
            heartbeat_interval=heartbeat_interval,
            grace_period=grace_period,
            publish=publish,
        )
        spec = search.storage_spec(
            cfg.database_url,
            journal=cfg.journal,
            workers=workers,
            heartbeat_interval=heartbeat_interval,
            grace_period=grace_period,
        )
        if family is not None:
            if batch_size is None:
                fail("--family needs --batch-size")
            tasks = [
                search.family_task(
                    family, batch_size, total_tokens, num_train=num_train, num_heldout=num_heldout, seed=seed, **shape
                )
            ]
        elif trace is not None:
            tasks = search.trace_tasks(
                trace,
                batch_sizes=(batch_size,) if batch_size else (16, 64, 256),
                num_train=num_train,
                num_heldout=num_heldout,
                seed=seed,
                rate_scale=rate_scale,
                token_budget=token_budget,
                max_batch_size=max_batch_size,
                max_kv_len=max_kv_len,
                max_buckets=max_buckets,
                **shape,
            )
        elif from_traffic is not None:
            tasks = _traffic_tasks(url, from_traffic, traffic_hours, shape, num_train, num_heldout, seed)
        else:
            tasks = search.default_library(num_train=num_train, num_heldout=num_heldout, seed=seed, **shape)
    except ValueError as exc:
        fail(flag_message(str(exc)))
    check_backend(backend)  # before any worker starts or anything is stored: one error line, not one per worker
    hold_tuning_lock(ctx, spec)  # a SQLite store: one tuner at a time (help text), refused before anything is stored
    with store_errors(cfg.database_url):  # one line naming the cause: disk full, read-only, unreachable, ...
        eng = store.get_engine(cfg.database_url)
        if store.current_revision(eng) is None and store.upgrade_from(cfg.database_url)[0] is None:
            typer.echo(f"created the kvsplit store at {store.safe_url(cfg.database_url)}", err=True)
        store.check_schema(eng)
    cal_notes: dict[str, None] = {}  # which calibration stands in for a task's KV dtype / q_len, said once each
    for t in tasks:  # before any work: a bucket tuned before on other batches is refused (module doc)
        try:
            search.check_task_batches(t, cfg.database_url)
            cal_notes[search.calibration_note(cfg.database_url, t, backend)] = None
        except ValueError as exc:
            fail(str(exc))
        except Exception as exc:
            if not is_store_failure(exc):
                raise
            store_failure(exc, cfg.database_url)
    for note in filter(None, cal_notes):
        typer.echo(f"note: {note}", err=True)
    typer.echo(
        f"tuning {len(tasks)} bucket(s), {trials} trials each, backend {backend}, "
        f"{workers} worker(s), studies in "
        f"{search.storage_spec(cfg.database_url, journal=cfg.journal, workers=workers).describe()}",
        err=True,
    )
    stop = search.Stop().install()
    results = []
    try:
        lines = progress and not sys.stderr.isatty()  # a log gets a line per bucket instead of the bar
        for i, t in enumerate(tasks, 1):
            if stop.is_set():
                break
            try:
                results.append(search.tune_task(t, cfg, stop=stop))
                if lines:  # the bucket's figures follow in the summary on stdout: here only where the run stands
                    r = results[-1]
                    done = f"{r.bucket_key}: {r.status}, {r.n_finished} trials"
                    done += "" if not r.verification else "; published" if r.published else "; not published"
                    typer.echo(f"[{i}/{len(tasks)}] {done}", err=True)
            except (ValueError, RuntimeError) as exc:
                fail(f"{t.source}: {exc}", code=1)
            except Exception as exc:
                if not is_store_failure(exc):
                    raise
                store_failure(exc, cfg.database_url)  # one line naming the cause: disk full, unreachable, ...
    finally:
        stop.restore()
    if json_out:
        typer.echo(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        for r in results:
            typer.echo(_result_line(r))
    if stop.is_set() or any(r.status == "interrupted" for r in results):
        typer.echo("interrupted: re-run the same command to resume", err=True)
        raise typer.Exit(code=130)


def _traffic_tasks(url: str, count: int, hours: int, shape: dict, num_train: int, num_heldout: int, seed: int):
    """``--from-traffic``: the tasks of :func:`kvsplit.tuner.traffic.traffic_tasks` for the keys of
    --num-kv-heads KV heads (GQA group size from --num-qo-heads / --num-kv-heads); stops with one line when the store
    has no such traffic."""
    from ...db import store
    from ...tuner.traffic import traffic_tasks

    if shape["num_qo_heads"] % shape["num_kv_heads"]:
        fail("--num-qo-heads: must be a multiple of --num-kv-heads (the GQA group size of the tuned shapes)")
    url = existing_store(url)  # statistics to read: the store must exist, at the current schema
    with store_errors(url):
        tasks, notes = traffic_tasks(
            url,
            count,
            gpu=shape["gpu"],
            group_size=shape["num_qo_heads"] // shape["num_kv_heads"],
            num_kv_heads=shape["num_kv_heads"],
            hours=hours,
            now_hour=int(time.time() // 3600),
            num_train=num_train,
            num_heldout=num_heldout,
            seed=seed,
        )
    for n in notes:
        typer.echo(f"note: {n}", err=True)
    if not tasks:
        fail(
            f"--from-traffic: no {shape['gpu']} bucket key in the last {hours} h of traffic statistics of "
            f"{store.safe_url(url)} was answered by the fallback or from farther than the bucket distance limit"
        )
    return tasks


def _result_line(r) -> str:
    v = r.verification or {}
    line = f"{r.bucket_key}: {r.status}, {r.n_finished} trials"
    if v:
        sp = ", ".join(f"{k} {x:.2f}x" for k, x in v.get("speedup_vs", {}).items())
        line += (
            f"; tuned {v['tuned_geomean_ratio']:.3f}x floor vs best baseline {v['best_baseline']} "
            f"{v['best_baseline_geomean_ratio']:.3f}x; speedup {sp}; "
            f"{'published' if r.published else 'not published'} (policy {r.policy_id})"
        )
    if r.message:
        msg = r.message
        if v and not r.published and msg.startswith("not published: "):  # said just before
            msg = msg[len("not published: ") :]
        line += f": {msg}" if v else f" [{msg}]"
    return line
