"""The ``kvsplit`` command line (typer).

Commands: ``tune``, ``serve``, ``plan``, ``bench``, ``calibrate``, ``db``
(``upgrade``, ``export``, ``import``) and ``run`` (the main job of ``make run``).
Each area registers its own commands: ``kvsplit.tuner.cli``, ``kvsplit.db.cli``,
``kvsplit.service.serve_cli``; heavy imports happen inside the commands.
"""

from __future__ import annotations

import typer

from ..db.cli import register as _register_db
from ..tuner.bench_cli import register as _register_bench
from ..tuner.calibrate_cli import register as _register_calibrate
from ..tuner.cli import register as _register_tuner
from .serve_cli import register as _register_serve

app = typer.Typer(
    name="kvsplit",
    help="kvsplit: auto-tuned split-KV policies for LLM decode attention.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_register_db(app)
_register_tuner(app)
_register_bench(app)
_register_calibrate(app)
_register_serve(app)


@app.command("run")
def run_main_job(
    host: str = typer.Option("127.0.0.1", "--host", help="interface to serve on"),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="port (a free one if taken; KVSPLIT_PORT)"),
    tune: bool = typer.Option(True, "--tune/--no-tune", help="tune the demo buckets before serving"),
) -> None:
    """The main job (make run): store, shipped H200 policies, demo tuning, plan service until Ctrl-C."""
    from .main_job import run

    run(host=host, port=port, tune=tune)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
