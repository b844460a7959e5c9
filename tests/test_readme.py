"""The Python blocks of README.md and docs/ marked runnable run as printed, on the CPU.

A block is runnable when the line before its fence is an HTML comment starting with ``<!-- runnable``
(GitHub shows nothing of it). Each runs in its own process with ``TRITON_INTERPRET=1`` and no CUDA device, so
the kernel runs under Triton's interpreter in fp16 / fp32; where a block leaves a decode output ``o`` of a
``wrapper``, it is compared with the fp32 torch reference of the same inputs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_BLOCK = re.compile(r"^<!--\s*runnable[^\n]*-->\s*\n```python[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)

# after a block that built a wrapper and its output: the last layer against the fp32 reference
_CHECK = """
if "wrapper" in globals() and "o" in globals():
    from kvsplit.kernels.decode import reference_decode_attention

    _ref = reference_decode_attention(q[-1], k_cache[-1], v_cache[-1], kv_indptr, kv_indices, kv_lens.to(q.device))
    _err = (o.float() - _ref.float()).abs().max().item()
    assert o.shape == _ref.shape and not o.isnan().any(), (o.shape, _ref.shape)
    assert _err < 5e-3, f"max |o - reference| = {_err}"
    print(f"checked against the fp32 reference: max |o - ref| = {_err:.2e}")
"""


def runnable_blocks(text: str) -> list[str]:
    """The code of each runnable Python block of a markdown page."""
    return _BLOCK.findall(text)


BLOCKS = [
    pytest.param(code, id=f"{page.relative_to(ROOT).as_posix()}#{i}")
    for page in PAGES
    for i, code in enumerate(runnable_blocks(page.read_text(encoding="utf-8")), 1)
]


def test_the_readme_has_a_runnable_block():
    assert any(p.id.startswith("README.md#") for p in BLOCKS)
    # the marker sits right above the fence; a block without it is not run
    assert runnable_blocks("<!-- runnable -->\n```python\nx = 1\n```\n\n```python\ny = 2\n```\n") == ["x = 1\n"]


@pytest.mark.slow
@pytest.mark.parametrize("code", BLOCKS)
def test_runnable_block_runs_on_the_cpu(code, tmp_path):
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    env.pop("KVSPLIT_DATABASE_URL", None)
    r = subprocess.run(
        [sys.executable, "-"], input=code + _CHECK, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600
    )
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
