"""``kvsplit calibrate``: fit the simulator's constants to the real kernel on this GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from .faults import store_errors, store_failure
from .options import (
    DatabaseUrl,
    Dtype,
    HeadDim,
    KvDtype,
    NumKvHeads,
    NumQoHeads,
    PageSize,
    QLen,
    checked_shape,
    fail,
    store_url,
)

__all__ = ["calibrate_cmd"]


def calibrate_cmd(
    gpu: Annotated[
        Optional[str], typer.Option("--gpu", metavar="NAME", help="expected GPU name (default: the local one)")
    ] = None,
    num_qo_heads: NumQoHeads = 32,
    num_kv_heads: NumKvHeads = 4,
    head_dim: HeadDim = 128,
    dtype: Dtype = "bfloat16",
    page_size: PageSize = 16,
    kv_dtype: KvDtype = None,
    q_len: QLen = 1,
    database_url: DatabaseUrl = None,
    out: Annotated[
        Optional[Path], typer.Option("--out", metavar="FILE", help="also write the report as JSON here")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", metavar="N", min=0, help="seed of the calibration sample")] = 0,
) -> None:
    """Time a calibration sample on the local GPU, fit the simulator, store the constants.

    --kv-dtype and --q-len: the sample is timed with that KV cache dtype and that many query tokens per request, and the simulator is fitted modelling them. The fit is stored as the GPU's calibration for that KV dtype and q_len only: a simulation of another KV dtype or q_len uses its own, else the q_len-1 fit of the model's dtype (and says so).
    """  # noqa: E501 - one line per paragraph: the help text reflows it
    from ...db import store
    from ...tuner.backends import make_backend
    from ...tuner.calibrate import calibrate

    def shape_on(device: str):
        return checked_shape(
            device=device,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            page_size=page_size,
            kv_dtype=kv_dtype,
            q_len=q_len,
        )

    # the flags are checked before the GPU is looked for (a bad --q-len is named on any machine); the shape is
    # built again for the local GPU below
    shape_on(gpu or "NVIDIA H200")
    try:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError
    except (ImportError, RuntimeError):
        fail("kvsplit calibrate needs a CUDA GPU (it times the real kernel)")
    local = torch.cuda.get_device_name()
    name = gpu or local
    shape = shape_on(name)
    url = store_url(database_url)
    with store_errors(url):  # one line naming the cause: disk full, read-only, unreachable, ...
        store.upgrade(url)
    backend = make_backend("gpu", shape=shape, max_tokens=300_000, max_batch=512)
    try:
        rep = calibrate(
            backend,
            gpu=name,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            dtype=shape.dtype,
            page_size=shape.page_size,
            seed=seed,
            database_url=url,
            progress=True,
            kv_dtype=None if shape.kv_dtype == shape.dtype else shape.kv_dtype,
            q_len=shape.q_len,
            num_qo_heads=shape.num_qo_heads,
        )
    except Exception as exc:  # noqa: BLE001 - a store failure while storing the constants: one line
        import sqlalchemy.exc

        if not isinstance(exc, (sqlalchemy.exc.SQLAlchemyError, OSError)):
            raise
        store_failure(exc, url)
    if out is not None:
        out.write_text(json.dumps(rep, indent=1))
    typer.echo(
        f"calibration {rep.get('calibration_id')} for {rep['gpu']} (KV {rep['kv_dtype']}, q_len {rep['q_len']}): held-out error median "
        f"{rep['heldout']['median']:.1%}, worst {rep['heldout']['worst']:.1%} "
        f"(defaults: {rep['default_heldout']['median']:.1%} / {rep['default_heldout']['worst']:.1%})"
    )
    for fam, e in rep["heldout"]["per_family"].items():
        typer.echo(f"  {fam:9s} median {e['median']:.1%}  worst {e['worst']:.1%}  (n={e['n']})")
