"""``kvsplit tune --campaign``: build a GPU's policy table for one model shape (:mod:`kvsplit.tuner.campaign`).

Exit status: 0 finished (a rerun does nothing), 75 stopped at ``--max-minutes`` with work left (run the same
command again), 130 interrupted (Ctrl-C; run it again), 2 bad input, 1 the store or a run failed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from ...kernels.policy_table import read_export
from .options import check_backend, fail, first_line, flag_message, gpu_or_fail, store_url

__all__ = ["campaign_cmd"]


def _ints(flag: str, text: str | None, default: tuple[int, ...]) -> tuple[int, ...]:
    if text is None:
        return default
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        fail(f"{flag}: expected comma-separated integers, got {text!r}")
    if not out or min(out) < 1:
        fail(f"{flag}: expected integers >= 1, got {text!r}")
    return out


def campaign_cmd(
    *,
    gpu: str,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
    page_size: int,
    model_shape: str | None,
    kv_dtype: str | None = None,
    q_len: int = 1,
    backend: str,
    database_url: str | None,
    budget_minutes: float,
    max_minutes: float | None,
    seed: int,
    workers: int,
    journal: Path | None,
    previous: Path | None,
    batch_sizes: str | None,
    totals: str | None,
    traces: str | None,
    trials: int | None,
    num_train: int | None,
    num_heldout: int | None,
    publish: bool,
    progress: bool,
    json_out: bool,
) -> None:
    """``kvsplit tune --campaign``: validate the options, open (or create) the store, run
    :func:`kvsplit.tuner.campaign.run_campaign` and print its result (JSON with ``json_out``).

    Exits with status 2 and an ``error: --option: ...`` line on bad input, 1 when the store cannot be opened or
    the campaign fails, 75 (:data:`kvsplit.tuner.campaign.EXIT_PAUSED`) when ``--max-minutes`` paused it with work
    left, 130 when interrupted; 0 when it finished.
    """
    from ...db import store
    from ...kernels.shape import Shape
    from ...tuner import campaign as cp
    from ...tuner.search import Stop, storage_spec
    from ...tuner.workloads import TRACES

    url = store_url(database_url)
    dev = gpu_or_fail(gpu)
    try:
        if model_shape is not None:
            num_qo_heads, num_kv_heads, head_dim = cp.parse_model_shape(model_shape)
        checked = Shape.of(
            device=dev.name,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            page_size=page_size,
            kv_dtype=kv_dtype,
            q_len=q_len,
        )
        dtype = checked.dtype  # an alias such as bf16 becomes torch's name
        kv_dtype = None if checked.kv_dtype == dtype else checked.kv_dtype  # fp8 -> float8_e4m3fn
    except ValueError as exc:
        msg = flag_message(str(exc))  # "--head-dim: expected ...", as kvsplit tune and plan say it
        if msg.startswith(("--num-qo-heads", "--num-kv-heads", "--head-dim")):
            msg = "--model-shape or " + msg  # the preset (or H_q/H_kv/head_dim) gives these three
        fail(msg if msg.startswith("--") else f"--model-shape/--dtype/--page-size: {msg}")
    if traces is None:
        trace_names = cp.LIBRARY_TRACES
    elif traces.strip().lower() == "none":
        trace_names = ()
    else:
        trace_names = tuple(x.strip() for x in traces.split(",") if x.strip())
        bad = [t for t in trace_names if t not in TRACES]
        if bad:
            fail(f"--traces: unknown trace(s) {bad}; known: {sorted(TRACES)} or 'none'")
    prev_doc = None
    if previous is not None:
        try:
            prev_doc = read_export(previous, arg="--previous")
        except ValueError as exc:
            fail(first_line(exc))
    check_backend(backend)
    try:
        cfg = cp.CampaignConfig(
            database_url=url,
            gpu=dev.name,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            page_size=page_size,
            kv_dtype=kv_dtype,
            q_len=q_len,
            backend=backend,
            budget_minutes=budget_minutes,
            max_minutes=max_minutes,
            seed=seed,
            workers=workers,
            journal=str(journal) if journal else None,
            batch_sizes=_ints("--batch-sizes", batch_sizes, cp.FAMILY_BATCH_SIZES),
            totals=_ints("--totals", totals, cp.TOTALS),
            traces=trace_names,
            num_train=num_train or 1,
            num_heldout=num_heldout or 1,
            max_trials=trials or 48,
            previous=prev_doc,
            publish=publish,
            progress=progress,
        )
        storage_spec(url, journal=cfg.journal, workers=workers)
    except ValueError as exc:
        msg = str(exc)
        fail(msg if msg.startswith("--") else f"--journal/--workers: {msg}")
    try:
        eng = store.get_engine(url)
        if store.current_revision(eng) is None:
            store.upgrade(url)
            typer.echo(f"created the kvsplit store at {store.safe_url(url)}", err=True)
        store.check_schema(eng)
    except store.SchemaError as exc:
        fail(str(exc), code=1)
    except Exception as exc:  # noqa: BLE001 - server down, bad credentials
        fail(f"cannot open the policy store at {store.safe_url(url)}: {first_line(exc)}", code=1)
    typer.echo(
        f"campaign {cp.campaign_name(cfg)}: {dev.name} {num_qo_heads}/{num_kv_heads}/{head_dim} {dtype} "
        f"{f'(KV {kv_dtype}) ' if kv_dtype else ''}{f'q_len {q_len} ' if q_len != 1 else ''}"
        f"page {page_size}, backend {backend}, budget {budget_minutes:g} min, {workers} worker(s)",
        err=True,
    )
    stop = Stop().install()
    try:
        res = cp.run_campaign(cfg, stop=stop, say=lambda s: typer.echo(s, err=True))
    except ValueError as exc:
        fail(str(exc))
    except RuntimeError as exc:
        fail(str(exc), code=1)
    finally:
        stop.restore()
    _report(res, json_out)
    if res.status == "paused":
        if not res.timings:  # the slice ended in its start-up (store, device, state): the same slice would again
            typer.echo(
                f"this slice timed no plan: its {res.wall_s:.1f} s of wall time went to opening the store, the "
                f"device and the campaign's state, past --max-minutes {max_minutes:g} ({max_minutes * 60:.1f} s); "
                "give a longer --max-minutes",
                err=True,
            )
        typer.echo(f"paused after --max-minutes {max_minutes:g}: run the same command again to continue", err=True)
        raise typer.Exit(code=cp.EXIT_PAUSED)
    if res.status == "interrupted":
        typer.echo("interrupted: run the same command again to resume", err=True)
        raise typer.Exit(code=130)


def _report(res: Any, json_out: bool) -> None:
    from ...tuner.pool import MARGIN, WHOLE_WAVE_WORST

    if json_out:
        typer.echo(json.dumps(res.to_dict(), indent=2))
        return
    kind = "GPU time" if res.time_kind == "gpu" else "simulated GPU time (60 ms per timed plan)"
    so_far = ""
    if res.status != "finished" and res.published < res.buckets:
        so_far = " so far (the verify step, the campaign's last, publishes each bucket that passes it)"
    typer.echo(
        f"{res.status}: {res.buckets} buckets, {res.published} published{so_far}; {kind} spent "
        f"{res.spent_s / 60:.2f} min in all; this run timed {res.timings} plans in {res.wall_s:.1f} s wall"
    )
    if res.status == "finished" and res.published < res.buckets:
        typer.echo(
            f"not published: {res.buckets - res.published} bucket(s) whose plan did not pass verification against "
            "the best baseline on its held-out batches (on --backend sim it must win by the simulator's error); "
            "they stay drafts, and their batches get the nearest published bucket's plan or `balanced`"
        )
    if res.calibration:
        typer.echo(f"calibration: {res.calibration}")
    ww = res.whole_wave or {}
    if ww:
        on = ww.get("buckets") or {}
        if on:
            typer.echo(
                f"whole-wave rule: on in {len(on)} bucket(s), where it won by more than {MARGIN:.0%} on the batches "
                f"whose plan it changes, none more than {WHOLE_WAVE_WORST - 1:.0%} slower:"
            )
            for key, d in on.items():
                typer.echo(
                    f"  {key}: {d['params']} (geomean {d['geomean']:.4f}, worst {d['worst']:.4f} over "
                    f"{d['batches']} batches)"
                )
        elif ww.get("batches"):
            typer.echo(
                f"whole-wave rule: off in every bucket (over the {ww['batches']} batches whose plan it changes: "
                f"geomean {ww['geomean']:.4f}, worst {ww['worst']:.4f})"
            )
        else:
            typer.echo("whole-wave rule: off (it changed the plan of no training or probe batch)")
    for line in res.lines:
        typer.echo(line)
