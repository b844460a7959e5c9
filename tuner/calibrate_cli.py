"""``kvsplit calibrate``: fit the simulator's constants to the real kernel on this GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` to ``app``."""

    @app.command("calibrate")
    def calibrate_cmd(
        gpu: Optional[str] = typer.Option(None, "--gpu", help="expected GPU name (default: the local one)"),
        num_qo_heads: int = typer.Option(32, "--num-qo-heads", min=1),
        num_kv_heads: int = typer.Option(4, "--num-kv-heads", min=1),
        head_dim: int = typer.Option(128, "--head-dim"),
        dtype: str = typer.Option("bfloat16", "--dtype"),
        page_size: int = typer.Option(16, "--page-size", min=1, max=256),
        database_url: Optional[str] = typer.Option(None, "--database-url", help="store (default KVSPLIT_DATABASE_URL)"),
        out: Optional[Path] = typer.Option(None, "--out", help="also write the report as JSON here"),
        seed: int = typer.Option(0, "--seed", min=0),
    ) -> None:
        """Time a calibration sample on the local GPU, fit the simulator, store the constants."""
        from ..db import store
        from .backends import make_backend
        from .calibrate import calibrate

        try:
            import torch

            if not torch.cuda.is_available():
                raise RuntimeError
        except (ImportError, RuntimeError):
            typer.echo("error: kvsplit calibrate needs a CUDA GPU (it times the real kernel)", err=True)
            raise typer.Exit(code=2)
        local = torch.cuda.get_device_name()
        name = gpu or local
        url = store.resolve_url(database_url)
        store.upgrade(url)
        backend = make_backend("gpu", gpu=name, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                               head_dim=head_dim, dtype=dtype, page_size=page_size, max_tokens=300_000, max_batch=512)
        rep = calibrate(backend, gpu=name, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
                        page_size=page_size, seed=seed, database_url=url, progress=True)
        if out is not None:
            out.write_text(json.dumps(rep, indent=1))
        typer.echo(f"calibration {rep.get('calibration_id')} for {rep['gpu']}: held-out error median "
                   f"{rep['heldout']['median']:.1%}, worst {rep['heldout']['worst']:.1%} "
                   f"(defaults: {rep['default_heldout']['median']:.1%} / {rep['default_heldout']['worst']:.1%})")
        for fam, e in rep["heldout"]["per_family"].items():
            typer.echo(f"  {fam:9s} median {e['median']:.1%}  worst {e['worst']:.1%}  (n={e['n']})")
