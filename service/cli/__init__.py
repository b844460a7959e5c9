"""The ``kvsplit`` command line (typer), the one home of every command.

Commands: ``tune``, ``serve``, ``plan``, ``bench``, ``calibrate``, ``db``
(``upgrade``, ``export``, ``import``) and ``run`` (the main job of ``make
run``). The modules of this package hold the commands; the work is done by
:mod:`kvsplit.tuner`, :mod:`kvsplit.db` and the service. Shared options are in
:mod:`.options`; heavy imports happen inside the commands. Entry point
``kvsplit.service.cli:app``; ``python -m kvsplit.service.cli`` works too.
"""

from __future__ import annotations

import typer

from .bench import bench_cmd
from .calibrate import calibrate_cmd
from .db import db_app
from .serve import plan_cmd, run_cmd, serve_cmd
from .tune import tune_cmd

__all__ = ["app", "main"]

app = typer.Typer(
    name="kvsplit",
    help="kvsplit: auto-tuned split-KV policies for LLM decode attention.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _settings_first() -> None:
    """kvsplit: auto-tuned split-KV policies for LLM decode attention."""
    # a bad KVSPLIT_* store setting (environment or ./.env) is one line naming it, before any command runs
    from ...db.settings import Settings
    from .faults import load_settings

    load_settings(Settings)


app.command("tune")(tune_cmd)
app.command("bench")(bench_cmd)
app.command("calibrate")(calibrate_cmd)
app.command("serve")(serve_cmd)
app.command("plan")(plan_cmd)
app.command("run")(run_cmd)
app.add_typer(db_app, name="db")


def main() -> None:  # pragma: no cover - console entry point
    """The ``kvsplit`` console script: runs the typer app on ``sys.argv``."""
    app()
