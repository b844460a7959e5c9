"""schemathesis against the live service's OpenAPI schema (/v1/openapi.json).

Runs schemathesis's CLI (``st run``: positive and negative data, all checks:
no 5xx, documented status codes, content types, response schemas, positive
data accepted / negative data rejected, ...) with a bounded number of examples
per operation against a ``kvsplit serve`` subprocess with admin routes on,
so the whole file stays under 2 minutes on 2 cores. A failure prints the
schemathesis report with the reproducing requests.

``positive_data_acceptance`` (schema-valid data must get a 2xx) is checked on
every operation except ``POST /v1/plan`` and ``POST /v1/policies/import``,
whose validity has rules JSON Schema cannot state (H_q a multiple of H_kv, a
GPU name the server knows unless a ``device`` is sent; an export file's bucket
key grammar and software fingerprints): those two run in a second pass with
every other check.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("schemathesis")
from tests.service_support import LiveServer, fill_store

TOKEN = "schemathesis-token"
ST = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")


@pytest.mark.timeout(240)
@pytest.mark.skipif(ST is None, reason="schemathesis CLI (st) not installed")
def test_schemathesis_finds_nothing(tmp_path):
    info = fill_store(f"sqlite:///{tmp_path}/store.db")
    # One worker: schemathesis's worker threads parse lambda sources through hypothesis
    # concurrently, and CPython 3.11.x can fail that with "SystemError: AST constructor
    # recursion depth mismatch" (a first-run flake seen on 3.11.7). One thread runs the same
    # examples and checks, deterministically, in about 16 s on 2 cores.
    with LiveServer(info.url, admin_token=TOKEN, reload_interval=1.0, cwd=str(tmp_path)) as srv:
        base = [
            ST,
            "run",
            srv.url + "/v1/openapi.json",
            "--mode",
            "all",
            "--max-examples",
            os.environ.get("KVSPLIT_SCHEMATHESIS_EXAMPLES", "25"),
            "--generation-deterministic",
            "--no-shrink",
            "--workers",
            "1",
            "--request-timeout",
            "20",
            "-H",
            f"Authorization: Bearer {TOKEN}",
            "--phases",
            "examples,coverage,fuzzing",
            "--continue-on-failure",
        ]
        semantic = ["--include-operation-id", "plan", "--include-operation-id", "import_policies"]
        runs = [
            base + ["--checks", "all", "--exclude-operation-id", "plan", "--exclude-operation-id", "import_policies"],
            base + ["--checks", "all", "--exclude-checks", "positive_data_acceptance"] + semantic,
        ]
        for cmd in runs:
            out = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=200,
                cwd=str(tmp_path),
                env={**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_TELEMETRY": "false"},
            )
            assert out.returncode == 0, out.stdout[-12000:] + out.stderr[-4000:]
