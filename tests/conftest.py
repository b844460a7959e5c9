"""Shared pytest setup: kernel tests run on the Triton CPU interpreter without a GPU."""

import os
import uuid

import pytest

try:  # torch is part of the test install; the planner tests do not need it
    import torch

    HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    HAS_CUDA = False

if not HAS_CUDA:
    # Must be set before triton compiles anything: @triton.jit reads it at decoration time.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_sessionstart(session):
    """Compile the numba parts of the planner and the plan service once, into numba's disk cache, before
    the tests that start servers in subprocesses: on a fresh clone each server would otherwise compile
    them at start-up (a minute or more on 2 cores) inside the tests' start-up deadlines."""
    try:
        from kvsplit.kernels import fastplan
        from kvsplit.service import fastjson, fastparse
    except ImportError:  # pragma: no cover - the service extras are not installed
        return
    fastplan.warmup()
    fastparse.warmup()
    fastjson.warmup()


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run the suite on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI (``CI=true``) a skip is a failure unless it is for the missing GPU.

    .ci/run installs PostgreSQL, Chromium, Playwright and schemathesis; a test
    that skips there would hide a broken install step.
    """
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI", "").lower() != "true" or not report.skipped:
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if "needs a CUDA GPU" in reason:
        return
    report.outcome = "failed"
    report.longrepr = f"skipped in CI, where every service is installed: {reason}"


@pytest.fixture()
def pg_url():
    """A fresh schema in the PostgreSQL of ``KVSPLIT_TEST_POSTGRES_URL`` (.ci/run starts one), dropped after."""
    base = os.environ.get("KVSPLIT_TEST_POSTGRES_URL")
    if not base:
        pytest.skip("KVSPLIT_TEST_POSTGRES_URL is not set (.ci/run starts PostgreSQL and sets it)")
    from sqlalchemy import create_engine, text

    from kvsplit.db import store

    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base)
    with admin.begin() as c:
        c.execute(text(f"CREATE SCHEMA {schema}"))
    sep = "&" if "?" in base else "?"
    yield f"{base}{sep}options=-csearch_path%3D{schema}"
    store.dispose_engines()
    with admin.begin() as c:
        c.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    admin.dispose()
