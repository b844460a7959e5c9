"""Pydantic schemas of the HTTP API (OpenAPI documentation and admin-route bodies).

``POST /v1/plan`` does not run its body through these models (it is parsed by
:mod:`kvsplit.service.validation` with orjson + NumPy for speed) but the
schemas here describe exactly what that parser accepts and what the route
returns, and they are what ``/v1/openapi.json`` publishes.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from ..kernels.limits import DTYPE_ALIASES, DTYPES, KV_DTYPE_SHORT, KV_DTYPES
from ..kernels.plan import MAX_BATCH

DTYPE_VALUES = (*sorted(DTYPES), *DTYPE_ALIASES)
"""The values of q's ``dtype`` the HTTP API takes: torch's names and their aliases (bf16, fp16/f16, fp32/f32)."""
KV_DTYPE_VALUES = (*sorted(KV_DTYPES), *(KV_DTYPE_SHORT[k] for k in sorted(KV_DTYPE_SHORT)), *DTYPE_VALUES)
"""The values of ``kv_dtype`` the HTTP API takes (the request field and the list filters: one tuple, so that the
OpenAPI document lists them in one order whichever schema pydantic builds first)."""

__all__ = [
    "DeviceIn",
    "PlanRequest",
    "PlanResponse",
    "KernelConfigOut",
    "MadeFor",
    "BucketMatch",
    "PolicyUsed",
    "PolicyTableDoc",
    "PolicyEntryOut",
    "PolicyDetail",
    "BucketOut",
    "BucketList",
    "RunOut",
    "RunList",
    "MeasurementOut",
    "MeasurementList",
    "Health",
    "ErrorDetail",
    "ValidationErrorOut",
    "ImportResult",
    "PolicyStatusOut",
    "make_plan_request_model",
]

_GPU = Field(min_length=1, max_length=200, pattern=r"\S", description="GPU name or alias, e.g. 'NVIDIA H200'")


class DeviceIn(BaseModel):
    """Numbers of a GPU the service does not know (see kvsplit.kernels.device.DeviceSpec)."""

    model_config = ConfigDict(extra="forbid")
    name: Optional[str] = Field(
        None, min_length=1, max_length=200, pattern=r"\S", description="defaults to the request's gpu"
    )
    num_sms: int = Field(ge=1, le=65536)
    hbm_bandwidth_gbps: float = Field(gt=0, le=1e6, description="GB/s")
    l2_bytes: int = Field(ge=0, le=2**40)
    smem_per_sm_bytes: int = Field(ge=1, le=2**24)
    smem_per_block_bytes: int = Field(ge=1, le=2**24)
    regs_per_sm: int = Field(65536, ge=1, le=2**24)
    max_threads_per_sm: int = Field(2048, ge=32, le=65536)
    compute_capability: list[int] = Field(
        [9, 0],
        min_length=2,
        max_length=2,
        json_schema_extra={"items": {"type": "integer", "minimum": 0, "maximum": 100}},
    )


def make_plan_request_model(max_kv_len: int) -> type[BaseModel]:
    """The PlanRequest schema with the configured kv_len limit."""

    class PlanRequest(BaseModel):
        """A decode batch to plan. num_qo_heads must be a multiple of num_kv_heads."""

        model_config = ConfigDict(extra="forbid", title="PlanRequest")
        gpu: str = _GPU
        num_qo_heads: int = Field(ge=1, le=65536)
        num_kv_heads: int = Field(ge=1, le=1024)
        head_dim: Literal[64, 128, 256]
        dtype: Literal[DTYPE_VALUES] = Field(  # type: ignore[valid-type]
            description="q's dtype (and the KV cache's, unless kv_dtype says otherwise): torch's name or an alias "
            "(bf16, fp16/f16, fp32/f32)"
        )
        page_size: int = Field(ge=1, le=256)
        kv_dtype: Optional[Literal[KV_DTYPE_VALUES]] = Field(  # type: ignore[valid-type]
            None,
            description="the KV cache's dtype: null or dtype's own name (the same as dtype), or float8_e4m3fn "
            "(alias fp8) with a 16-bit dtype; another KV dtype is another bucket family",
        )
        q_len: int = Field(
            1,
            ge=1,
            le=8,
            description="query tokens per request (1 for decode, k + 1 for a verify step of k draft tokens); "
            "num_qo_heads / num_kv_heads * q_len <= 64; another q_len is another bucket family",
        )
        kv_lens: list[int] = Field(
            min_length=1,
            max_length=MAX_BATCH,
            json_schema_extra={"items": {"type": "integer", "minimum": 0, "maximum": max_kv_len}},
            description=f"tokens in each request's KV cache, 0..{max_kv_len}",
        )
        device: Optional[DeviceIn] = None

    return PlanRequest


PlanRequest = make_plan_request_model(1 << 24)


class KernelConfigOut(BaseModel):
    """The kernel config of a plan (kvsplit.kernels.limits.KernelConfig): BLOCK_N tokens per tile, warps and
    pipeline stages per CTA, launch schedule, and the prefetch / heads-per-tile / look-ahead knobs.
    """

    block_n: int
    num_warps: int
    num_stages: int
    schedule: Literal["grid", "persistent"]
    num_programs: int
    prefetch: bool = False
    heads_per_tile: int = 1
    next_item: bool = False


class MadeFor(BaseModel):
    """What a plan was made for: H_kv, head_dim, page size (tokens), q's dtype and GPU name; the KV cache's dtype and
    q_len only where not the defaults (a cache of q's dtype, one query token per request)."""

    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: str
    gpu: str
    kv_dtype: Optional[str] = Field(None, description="float8_e4m3fn for an fp8 KV cache; absent: q's dtype")
    q_len: Optional[int] = Field(None, description="query tokens per request of a verify step (2-8); absent: 1")


class BucketMatch(BaseModel):
    """The request's bucket key and the published bucket whose policy planned it (null on fallback)."""

    key: str = Field(description="bucket key of the request's batch")
    matched: Optional[str] = Field(description="bucket key of the policy used (null on fallback)")
    distance: Optional[float] = Field(description="distance to the matched bucket (null on fallback)")


class PolicyUsed(BaseModel):
    """The policy that planned the batch: its store id and version (null for the fallback), name, parameters and
    where it comes from (tuned on a GPU, simulated, or the fallback rule).
    """

    id: Optional[int]
    version: Optional[int]
    name: str
    params: dict[str, Any]
    source: Literal["tuned", "simulated", "fallback"]


class PlanResponse(BaseModel):
    """Plan.to_dict() at the top level, plus ``bucket`` and the ``policy`` used.

    Plan.to_dict() has ``policy`` as the policy name; here ``policy`` is the
    object ``{id, version, name, params, source}`` whose ``name`` is that
    string (and ``params`` equals the top-level ``params``).
    kvsplit.service.client.plan_from_response() rebuilds the Plan.
    """

    kv_lens: list[int]
    num_splits: list[int]
    work_request: list[int]
    work_kv_start: list[int]
    work_kv_end: list[int]
    cta_indptr: list[int]
    config: KernelConfigOut
    params: dict[str, Any]
    made_for: MadeFor
    bucket: BucketMatch
    policy: PolicyUsed


class PolicyEntryOut(BaseModel):
    """One published policy of the table: its bucket (key and shape), policy name and parameters, and the backend
    it was tuned on.
    """

    model_config = ConfigDict(extra="allow")
    id: int
    version: int
    bucket: str
    gpu: str
    num_kv_heads: int
    head_dim: int
    dtype: str
    page_size: int
    kv_dtype: str = Field(description="the KV cache's dtype of the bucket's family (dtype's, or float8_e4m3fn)")
    q_len: int = Field(description="query tokens per request of the bucket's family (1: decode; 2-8: verify steps)")
    name: str
    params: dict[str, Any]
    backend: Literal["gpu", "sim"]
    source: Literal["tuned", "simulated"]


class Fallback(BaseModel):
    """The policy served where no published bucket is near: its name and parameters."""

    name: str
    params: dict[str, Any]


class PolicyTableDoc(BaseModel):
    """Everything a client needs to plan in-process (kvsplit.kernels.policy_table)."""

    format: Literal["kvsplit.policy_table/2"]
    version: int
    distance_limit: float
    fallback: Fallback
    count: int
    data: list[PolicyEntryOut]


class PolicyDetail(BaseModel):
    """One stored policy of any status (draft, published, retired) with its bucket key and parameters."""

    model_config = ConfigDict(extra="allow")
    id: int
    version: int
    status: Literal["draft", "published", "retired"]
    bucket: str
    name: str
    params: dict[str, Any]
    backend: Literal["gpu", "sim"]


class PolicyStatusOut(BaseModel):
    """A policy's status after a publish or retire, and the table version it produced."""

    id: int
    status: Literal["draft", "published", "retired"]
    policies_version: int


class ImportResult(BaseModel):
    """What an import stored: the number of policies imported and the table version after it."""

    model_config = ConfigDict(extra="allow")
    imported: int
    policies_version: int


class BucketOut(BaseModel):
    """One bucket of the store: its key and shape, where its batches came from (``source``), and its published
    policy's id (null if none).
    """

    model_config = ConfigDict(extra="allow")
    id: int
    key: str
    gpu: str
    num_kv_heads: int
    head_dim: int
    dtype: str
    page_size: int
    kv_dtype: str = Field(description="the KV cache's dtype of the bucket's family (dtype's, or float8_e4m3fn)")
    q_len: int = Field(description="query tokens per request of the bucket's family")
    source: str
    published_policy_id: Optional[int]


class BucketList(BaseModel):
    """Buckets of the store (``count`` and ``data``)."""

    count: int
    data: list[BucketOut]


class RunOut(BaseModel):
    """One tuning run: its bucket, Optuna study, backend, status, trials asked and finished, and best value
    (geomean kernel time in seconds over the training batches; null before the first finished trial).
    """

    model_config = ConfigDict(extra="allow")
    id: int
    bucket: str
    study_name: str
    backend: str
    status: str
    n_trials: int
    n_finished: int
    best_value: Optional[float]


class RunList(BaseModel):
    """Tuning runs (``count`` and ``data``)."""

    count: int
    data: list[RunOut]


class MeasurementOut(BaseModel):
    """One stored kernel timing: bucket, policy, role (train or heldout), batch size and tokens, time and HBM floor
    in seconds, their ratio, and the backend (gpu or sim).
    """

    model_config = ConfigDict(extra="allow")
    id: int
    bucket: str
    policy_name: str
    role: str
    batch_size: int
    total_tokens: int
    time_s: float
    floor_s: Optional[float]
    ratio: Optional[float]
    backend: str


class MeasurementList(BaseModel):
    """Stored measurements (``count`` and ``data``)."""

    count: int
    data: list[MeasurementOut]


class Health(BaseModel):
    """Liveness: ``degraded`` when the last reload of the policy table failed (the previous table is still
    served), with the table version and its number of policies.
    """

    status: Literal["ok", "degraded"]
    policies_version: Optional[int]
    policies_loaded: int
    last_reload_error: Optional[str]


class ErrorDetail(BaseModel):
    """An error answer: one message naming the argument or the resource at fault."""

    detail: str


class ValidationErrorItem(BaseModel):
    """One refused field of a 422 answer: pydantic's error type, its location, message and (bounded) input."""

    type: str
    loc: list[Any]
    msg: str
    input: Any = None
    ctx: Optional[dict[str, Any]] = None


class ValidationErrorOut(BaseModel):
    """A 422 answer: one FastAPI-shaped item per invalid field (``loc`` names it)."""

    detail: list[ValidationErrorItem]
