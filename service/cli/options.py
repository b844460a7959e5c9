"""What the ``kvsplit`` commands share: typer ``Annotated`` options and one-line errors.

The shape options (``--gpu``, ``--num-qo-heads``, ``--num-kv-heads``,
``--head-dim``, ``--dtype``, ``--page-size``, ``--kv-dtype``, ``--q-len``) and ``--database-url`` are
defined once here; each command gives its own default (or none: required).
"""

from __future__ import annotations

from typing import Annotated, NoReturn, Optional

import typer

__all__ = [
    "DatabaseUrl",
    "Gpu",
    "NumQoHeads",
    "NumKvHeads",
    "HeadDim",
    "Dtype",
    "PageSize",
    "KvDtype",
    "QLen",
    "fail",
    "check_backend",
    "flag_message",
    "store_url",
    "existing_store",
    "first_line",
]

DatabaseUrl = Annotated[
    Optional[str],
    typer.Option(
        "--database-url",
        metavar="URL",
        help="policy store: a SQLAlchemy URL or a SQLite file path (default: KVSPLIT_DATABASE_URL from the "
        "environment or ./.env, else sqlite:///./kvsplit.db)",
    ),
]
Gpu = Annotated[
    str,
    typer.Option(
        "--gpu", metavar="NAME", help="GPU name as torch reports it ('NVIDIA H200') or an alias (h200, h100, a100, ...)"
    ),
]
NumQoHeads = Annotated[
    int, typer.Option("--num-qo-heads", metavar="H_Q", min=1, help="query heads H_q (a multiple of H_kv)")
]
NumKvHeads = Annotated[int, typer.Option("--num-kv-heads", metavar="H_KV", min=1, help="KV heads H_kv")]
HeadDim = Annotated[int, typer.Option("--head-dim", metavar="D", help="head dim D: 64, 128 or 256")]
Dtype = Annotated[
    str, typer.Option("--dtype", metavar="DTYPE", help="float16, bfloat16 or float32 (aliases fp16, bf16, fp32)")
]
PageSize = Annotated[int, typer.Option("--page-size", metavar="TOKENS", min=1, max=256, help="tokens per KV page")]
KvDtype = Annotated[
    Optional[str],
    typer.Option(
        "--kv-dtype",
        metavar="DTYPE",
        help="KV cache dtype when it differs from --dtype: float8_e4m3fn (alias fp8; with a 16-bit --dtype). "
        "Another KV dtype is another bucket family",
    ),
]
QLen = Annotated[
    int,
    typer.Option(
        "--q-len",
        metavar="N",
        help="query tokens per request, 1..8 (k + 1 for a speculative-decoding verify step of k draft tokens); "
        "another q_len is another bucket family",
    ),
]


def fail(msg: str, code: int = 2) -> NoReturn:
    """Print ``error: msg`` on stderr and exit with ``code`` (2: bad input, 1: the store or a run failed)."""
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code=code)


def check_backend(backend: str) -> None:
    """``--backend gpu`` needs a CUDA GPU and torch with CUDA: without them, exit 2 with one line saying so."""
    if backend != "gpu":
        return
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        fail("--backend: 'gpu' needs a CUDA GPU and torch with CUDA, none here; use --backend sim")


def gpu_or_fail(gpu: str):
    """The :class:`~kvsplit.kernels.device.DeviceSpec` of ``--gpu`` (a reported name or an alias), or exit 2 with
    ``error: --gpu: unknown GPU ...`` listing the known names and aliases."""
    from ...kernels.device import device_aliases, known_devices, resolve_device

    try:
        return resolve_device(gpu)
    except ValueError:
        names = ", ".join(f"'{d.name}'" for d in known_devices())
        fail(f"--gpu: unknown GPU {gpu!r}; known GPUs: {names}; aliases: {', '.join(sorted(device_aliases()))}")


_FLAGS = {
    "device": "--gpu",
    "num_qo_heads": "--num-qo-heads",
    "num_kv_heads": "--num-kv-heads",
    "head_dim": "--head-dim",
    "dtype": "--dtype",
    "page_size": "--page-size",
    "kv_dtype": "--kv-dtype",
    "q_len": "--q-len",
    "backend": "--backend",
    "policies": "--policies",
}


def flag_message(msg: str) -> str:
    """A ValueError's message with the argument it names spelled as the command-line flag (``"q_len: expected
    ..."`` -> ``"--q-len: expected ..."``); other messages unchanged."""
    name, sep, rest = msg.partition(":")
    return f"{_FLAGS[name]}:{rest}" if sep and name in _FLAGS else msg


def checked_shape(
    *,
    device: str,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
    page_size: int,
    kv_dtype: str | None,
    q_len: int,
):
    """The :class:`kvsplit.kernels.shape.Shape` of the command's flags; a bad one is a one-line error naming the
    flag and the value, in the kernels' words (:func:`flag_message`: ``--head-dim: expected one of (64, 128, 256),
    got 100``)."""
    from ...kernels.shape import Shape

    try:
        return Shape.of(
            device=device,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            page_size=page_size,
            kv_dtype=kv_dtype,
            q_len=q_len,
        )
    except ValueError as exc:
        fail(flag_message(str(exc)))


def store_url(database_url: str | None) -> str:
    """``--database-url`` (or the settings' URL) as a SQLAlchemy URL; a bad one is a one-line error."""
    from pydantic import ValidationError

    from ...db import store

    try:
        return store.resolve_url(database_url)
    except ValidationError as exc:  # a bad KVSPLIT_* value in the environment or ./.env
        from .faults import settings_error

        fail(settings_error(exc))
    except ValueError as exc:
        fail(f"--database-url: {exc}")


def existing_store(database_url: str | None) -> str:
    """Like :func:`store_url`, for read-only commands: the store must exist and be at the current schema.

    A missing SQLite file is refused without creating it (a read must leave no
    empty file behind).
    """
    from ...db import store

    url = store_url(database_url)
    try:
        store.check_exists(url)
        store.check_schema(store.get_engine(url))
    except Exception as exc:  # noqa: BLE001 - server down, bad credentials, read-only, bad setting: one line
        from .faults import store_failure

        store_failure(exc, url)
    return url


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (a DBAPI error's driver message rather than SQLAlchemy's wrapper),
    or the exception's class name when it has none: what the CLI prints after ``error:``.
    """
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
