"""``kvsplit tune``: tune, verify and publish ``tuned`` policies per bucket.

One of three workload selections:

- ``--family F --batch-size B [--total-tokens T]``: the bucket of that
  synthetic batch (jittered training / held-out draws, DESIGN.md §6);
- ``--trace NAME``: the buckets of a shipped trace (continuous-batching
  replay of Azure code/conv and Mooncake, i.i.d. draws of ShareGPT/arXiv) at
  ``--batch-size`` (default 16, 64 and 256), with ``--rate-scale``,
  ``--token-budget``, ``--max-batch-size``, ``--max-kv-len``;
- ``--all``: the default library (:func:`kvsplit.tuner.search.default_library`).

Storage of the Optuna studies: the ``--database-url`` for one worker;
``--journal PATH`` for ``--workers K`` processes on one host; a PostgreSQL URL
for several hosts. Re-running the same command resumes and stops at exactly
``--trials`` finished trials per bucket. Ctrl-C stops after the current trial
(twice: at once).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

__all__ = ["register"]


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code=code)


def register(app: typer.Typer) -> None:
    """Add ``tune`` to ``app``."""

    @app.command("tune")
    def tune_cmd(
        gpu: str = typer.Option("NVIDIA H200", "--gpu", help="GPU name as torch reports it (or an alias)"),
        num_qo_heads: int = typer.Option(32, "--num-qo-heads", min=1, help="H_q"),
        num_kv_heads: int = typer.Option(4, "--num-kv-heads", min=1, help="H_kv"),
        head_dim: int = typer.Option(128, "--head-dim", help="D: 64, 128 or 256"),
        dtype: str = typer.Option("bfloat16", "--dtype", help="float16, bfloat16 or float32"),
        page_size: int = typer.Option(16, "--page-size", min=1, max=256, help="tokens per KV page"),
        family: Optional[str] = typer.Option(None, "--family", help="uniform, skewed40, skewed60, skewed80, 2x40"),
        batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help="B of the family / trace batches"),
        total_tokens: int = typer.Option(262_144, "--total-tokens", min=1, help="T of the family batch"),
        trace: Optional[str] = typer.Option(None, "--trace", help="azure_code, azure_conv, mooncake, sharegpt, arxiv"),
        all_: bool = typer.Option(False, "--all", help="tune the default bucket library"),
        trials: int = typer.Option(40, "--trials", min=1, help="finished (complete + pruned) trials per bucket"),
        backend: str = typer.Option("sim", "--backend", help="sim (calibrated simulator) or gpu (the kernel)"),
        database_url: Optional[str] = typer.Option(None, "--database-url",
                                                   help="policy store URL (default KVSPLIT_DATABASE_URL)"),
        workers: int = typer.Option(1, "--workers", min=1, help="worker processes sharing each study"),
        timeout: Optional[float] = typer.Option(None, "--timeout", help="seconds per bucket; then verify the best"),
        journal: Optional[Path] = typer.Option(None, "--journal", help="Optuna JournalFileBackend file (multi-process)"),
        seed: int = typer.Option(0, "--seed", min=0, help="seed of the batches and the TPE sampler"),
        num_train: int = typer.Option(8, "--num-train", min=1, help="training batches per bucket"),
        num_heldout: int = typer.Option(8, "--num-heldout", min=1, help="held-out batches per bucket"),
        rate_scale: Optional[float] = typer.Option(None, "--rate-scale", help="trace arrival-rate multiplier (auto)"),
        token_budget: Optional[int] = typer.Option(None, "--token-budget", min=1, help="trace replay KV capacity"),
        max_batch_size: Optional[int] = typer.Option(None, "--max-batch-size", min=1,
                                                     help="trace replay batch cap (default --batch-size)"),
        max_kv_len: Optional[int] = typer.Option(None, "--max-kv-len", min=1, help="cap kv_len (model context)"),
        max_buckets: Optional[int] = typer.Option(None, "--max-buckets", min=1, help="most buckets of a trace"),
        heartbeat_interval: int = typer.Option(5, "--heartbeat-interval", min=1, help="seconds"),
        grace_period: int = typer.Option(30, "--grace-period", min=2, help="seconds before a silent trial fails"),
        publish: bool = typer.Option(True, "--publish/--no-publish", help="publish verified policies"),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="tqdm progress bar"),
        json_out: bool = typer.Option(False, "--json", help="print the results as JSON"),
    ) -> None:
        """Tune the `tuned` policy of one or more buckets, verify it against the baselines, publish it."""
        from ..db import store
        from . import search

        chosen = [x for x in (family is not None, trace is not None, all_) if x]
        if len(chosen) != 1:
            _fail("choose exactly one of --family, --trace, --all")
        shape = dict(gpu=gpu, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     dtype=dtype, page_size=page_size)
        try:
            cfg = search.TuneConfig(
                database_url=store.resolve_url(database_url), n_trials=trials, backend=backend, workers=workers,
                timeout=timeout, journal=str(journal) if journal else None, seed=seed, progress=progress,
                heartbeat_interval=heartbeat_interval, grace_period=grace_period, publish=publish,
            )
            search.storage_spec(cfg.database_url, journal=cfg.journal, workers=workers,
                                heartbeat_interval=heartbeat_interval, grace_period=grace_period)
            if family is not None:
                if batch_size is None:
                    _fail("--family needs --batch-size")
                tasks = [search.family_task(family, batch_size, total_tokens, num_train=num_train,
                                            num_heldout=num_heldout, seed=seed, **shape)]
            elif trace is not None:
                tasks = search.trace_tasks(
                    trace, batch_sizes=(batch_size,) if batch_size else (16, 64, 256), num_train=num_train,
                    num_heldout=num_heldout, seed=seed, rate_scale=rate_scale, token_budget=token_budget,
                    max_batch_size=max_batch_size, max_kv_len=max_kv_len, max_buckets=max_buckets, **shape)
            else:
                tasks = search.default_library(num_train=num_train, num_heldout=num_heldout, seed=seed, **shape)
        except ValueError as exc:
            _fail(str(exc))
        eng = store.get_engine(cfg.database_url)
        if store.current_revision(eng) is None:
            store.upgrade(cfg.database_url)
            typer.echo(f"created the kvsplit store at {eng.url.render_as_string(hide_password=True)}", err=True)
        try:
            store.check_schema(eng)
        except store.SchemaError as exc:
            _fail(str(exc), code=1)
        typer.echo(f"tuning {len(tasks)} bucket(s), {trials} trials each, backend {backend}, "
                   f"{workers} worker(s), studies in {search.storage_spec(cfg.database_url, journal=cfg.journal, workers=workers).describe()}",
                   err=True)
        stop = search.Stop().install()
        results = []
        try:
            for t in tasks:
                if stop.is_set():
                    break
                try:
                    results.append(search.tune_task(t, cfg, stop=stop))
                except (ValueError, RuntimeError) as exc:
                    _fail(f"{t.source}: {exc}", code=1)
        finally:
            stop.restore()
        if json_out:
            typer.echo(json.dumps([r.to_dict() for r in results], indent=2))
        else:
            for r in results:
                v = r.verification or {}
                line = f"{r.bucket_key}: {r.status}, {r.n_finished} trials"
                if v:
                    sp = ", ".join(f"{k} {x:.2f}x" for k, x in v.get("speedup_vs", {}).items())
                    line += (f"; tuned {v['tuned_geomean_ratio']:.3f}x floor vs best baseline {v['best_baseline']} "
                             f"{v['best_baseline_geomean_ratio']:.3f}x; speedup {sp}; "
                             f"{'published' if r.published else 'not published'} (policy {r.policy_id})")
                if r.message:
                    line += f" [{r.message}]"
                typer.echo(line)
        if stop.is_set() or any(r.status == "interrupted" for r in results):
            typer.echo("interrupted: re-run the same command to resume", err=True)
            raise typer.Exit(code=130)
