"""``kvsplit bench``: the baseline policies on the reference workload, or the published policy on trace batches.

The benchmarks themselves are :mod:`kvsplit.tuner.bench`; this module is the
command line around them.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from ...tuner.bench import BASELINES, PEER_KERNELS
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
    existing_store,
    fail,
    flag_message,
    store_url,
)

__all__ = ["bench_cmd"]


def bench_cmd(
    backend: Annotated[
        str, typer.Option("--backend", metavar="NAME", help="'sim' (simulator) or 'gpu' (real kernel, CUDA)")
    ] = "sim",
    gpu: Gpu = "NVIDIA H200",
    num_qo_heads: NumQoHeads = 32,
    num_kv_heads: NumKvHeads = 4,
    head_dim: HeadDim = 128,
    dtype: Dtype = "bfloat16",
    page_size: PageSize = 16,
    kv_dtype: KvDtype = None,
    q_len: QLen = 1,
    total_tokens: Annotated[
        int, typer.Option("--total-tokens", metavar="T", min=1, help="T, total tokens per batch")
    ] = 262_144,
    out: Annotated[
        Optional[Path], typer.Option("--out", metavar="DIR", help="folder for bench.csv and one PNG per family")
    ] = None,
    policies: Annotated[
        Optional[str],
        typer.Option(
            "--policies",
            metavar="LABELS",
            help=f"comma-separated baseline labels, of {', '.join(BASELINES)} (kvsplit's kernel) and "
            f"{', '.join(PEER_KERNELS)} (the peers' kernels, GPU only) [default: all; the peers' with --backend gpu]",
        ),
    ] = None,
    calibration: Annotated[
        Optional[Path],
        typer.Option(
            "--calibration",
            metavar="FILE",
            help="JSON file of simulator constants (sim) [default: the store's calibration of the GPU, KV dtype "
            "and q_len, as kvsplit tune uses; else the GPU's defaults]",
        ),
    ] = None,
    anchors: Annotated[
        Optional[Path], typer.Option("--anchors", metavar="CSV", help="h200_peers.csv: add the FlashInfer cliff check")
    ] = None,
    trace: Annotated[
        Optional[str],
        typer.Option(
            "--trace",
            metavar="NAME",
            help="instead: batches of this trace (azure_code, azure_conv, mooncake, "
            "sharegpt, arxiv), published policy vs baselines",
        ),
    ] = None,
    batch_sizes: Annotated[
        str, typer.Option("--batch-sizes", metavar="LIST", help="with --trace: target batch sizes")
    ] = "16,64,256",
    batches: Annotated[
        int, typer.Option("--batches", metavar="N", min=1, help="with --trace: held-out batches per batch size")
    ] = 3,
    database_url: DatabaseUrl = None,
) -> None:
    """Baseline policies on the reference workload (or, with --trace, the published policy on trace batches).

    --kv-dtype and --q-len set the KV cache dtype and the query tokens per request (speculative-decoding verify steps) of the shape: plans, simulator, GPU timer and HBM floor follow them. With --backend gpu the peers' own kernels are timed on the same cache: FlashInfer's decode wrapper (kv_data_type fp8 for an fp8 cache; q_len 1), its prefill wrapper (q_len > 1) and BatchAttention, and FlashAttention-3; a peer that is absent or does not take the case is named and given no figure.
    """  # noqa: E501 - one line per paragraph: the help text reflows it
    from ...db import store
    from ...tuner import bench

    shape = dict(
        backend=backend,
        gpu=gpu,
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        page_size=page_size,
        kv_dtype=kv_dtype,
        q_len=q_len,
    )
    if trace is not None:
        url = existing_store(database_url)  # read-only: a missing store is refused, not created
        try:
            sizes = tuple(int(x) for x in batch_sizes.split(",") if x.strip())
            rows = bench.run_trace_bench(trace, database_url=url, batch_sizes=sizes, batches=batches, **shape)
        except (ValueError, OSError, store.SchemaError) as exc:
            fail(flag_message(str(exc)))
        typer.echo(
            f"trace={trace} backend={backend} gpu={_gpu_name(gpu)} {_shape_text(shape)} store={store.safe_url(url)}\n"
        )
        typer.echo(bench.format_trace_table(rows))
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            path = out / f"trace_{trace}.csv"
            with open(path, "w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
            typer.echo(f"wrote {path}")
        return
    if policies is None:
        labels = tuple(BASELINES) + (tuple(PEER_KERNELS) if backend == "gpu" else ())
    else:
        labels = tuple(p.strip() for p in policies.split(",") if p.strip())
    url = None  # the simulator's calibration: --calibration, else the store's (when it exists), else the defaults
    if backend == "sim" and calibration is None:
        url = store_url(database_url)
        try:
            store.check_exists(url)
        except store.SchemaError:  # no store file: nothing to read, and a read creates none
            typer.echo(f"note: no kvsplit store at {store.safe_url(url)}: no stored calibration to read", err=True)
            url = None
        else:
            url = existing_store(database_url)
    try:
        cal = json.loads(calibration.read_text()) if calibration else None
        rows = bench.run_bench(
            total_tokens=total_tokens, policies=labels, calibration=cal, database_url=url, say=typer.echo, **shape
        )
    except (ValueError, OSError, json.JSONDecodeError) as exc:
        fail(flag_message(str(exc)))
    where = f" store={store.safe_url(url)}" if url is not None else ""
    typer.echo(
        f"backend={backend} gpu={_gpu_name(gpu) if backend == 'sim' else 'cuda'} {_shape_text(shape)} "
        f"T={total_tokens}{where}\n"
    )
    typer.echo(bench.format_table(rows))
    typer.echo("columns:\n" + bench.legend(dict.fromkeys(r["policy"] for r in rows)))
    if anchors is not None:
        typer.echo(bench.cliff_comparison(rows, anchors, total_tokens))
    if out is not None:
        for p in bench.write_outputs(rows, out, f"{backend} {gpu} T={total_tokens}"):
            typer.echo(f"wrote {p}")


def _gpu_name(gpu: str) -> str:
    """The GPU's full name (``kvsplit.kernels.device.resolve_device``; ``--gpu h100`` is an alias of it), as every
    other command prints it."""
    from ...kernels.device import resolve_device

    return resolve_device(gpu).name


def _shape_text(shape: dict) -> str:
    """The header's model shape, with the KV dtype and q_len where they differ from the defaults
    (``"H_q=32 H_kv=4 D=128 bfloat16 kv=fp8 q_len=4 page=16"``)."""
    kv_dtype, q_len = shape["kv_dtype"], shape["q_len"]
    return (
        f"H_q={shape['num_qo_heads']} H_kv={shape['num_kv_heads']} D={shape['head_dim']} {shape['dtype']}"
        + (f" kv={kv_dtype}" if kv_dtype else "")
        + (f" q_len={q_len}" if q_len != 1 else "")
        + f" page={shape['page_size']}"
    )
