"""kvsplit as the decode attention of transformers' continuous batching (kvsplit.kernels.integrations.transformers).

A tiny randomly initialised Qwen3 model built from a local config (no download): 2 layers, 8 query heads over 2 KV
heads (GQA group 4), head_dim 64, fp32. ``generate_batch`` on 12 prompts of different lengths, 12 new tokens each,
greedy, must give the same tokens as transformers' own paged ``sdpa`` implementation (``paged|sdpa``, which
transformers 5.x names ``sdpa``). ``max_batch_tokens`` 64 makes
the engine chunk the longer prompts, so steps mix decode rows (kvsplit) with prefill rows (transformers' sdpa); rows of
2-8 tokens (the 5-token prompt, short last chunks) run through kvsplit's q_len > 1 path, causal within the new
tokens, as a speculative verify step would.
The decode kernel runs under the Triton interpreter on the CPU (TRITON_INTERPRET=1, tests/conftest.py).
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvsplit.kernels.integrations import transformers as ktf  # noqa: E402

ktf.import_transformers()  # this checkout's kernels/ folder is on sys.path here and shadows transformers' `kernels`

from transformers import AttentionInterface, GenerationConfig, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from kvsplit.kernels.policy_table import PolicyTable  # noqa: E402

NEW_TOKENS = 12
PROMPTS = [[(7 * i + 3 * j) % 500 + 1 for j in range(5 + 9 * i)] for i in range(12)]  # 5 .. 104 tokens


def _model(num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2):
    cfg = Qwen3Config(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(torch.float32).eval()
    model.set_attn_implementation(ktf.attention_key())  # sdpa on 5.2x (paged| prefix deprecated), paged|sdpa on 5.17
    return model


def _generate(model, prompts=PROMPTS, new_tokens=NEW_TOKENS):
    gc = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = ktf.continuous_batching_config(page_size=16, num_blocks=64, max_batch_tokens=64, max_requests_per_batch=16)
    out = model.generate_batch(prompts, generation_config=gc, continuous_batching_config=cb, warmup=False)
    return {k: list(v.generated_tokens) for k, v in out.items()}


@pytest.mark.slow
def test_generate_batch_same_tokens_as_paged_sdpa():
    model = _model()
    ref = _generate(model)  # transformers' own paged sdpa
    assert len(ref) == len(PROMPTS) and all(len(t) == NEW_TOKENS for t in ref.values())
    own = {k: AttentionInterface()[k] for k in ("sdpa", "paged|sdpa") if k in AttentionInterface()}
    # fixed 2 splits for every batch: the split-KV path with its LSE merge, and few programs for the interpreter
    handle = ktf.install(table=PolicyTable([], fallback_name="fixed", fallback_params={"num_splits": 2}))
    try:
        assert AttentionInterface()[handle.attn_key] == handle.attention
        got = _generate(model)
    finally:
        handle.uninstall()
    assert {k: AttentionInterface()[k] for k in own} == own and ktf.installed() is None
    assert got == ref
    s = handle.stats
    # every generated token after a request's first came from a kvsplit decode row, in both layers
    assert s["decode_rows"] >= 2 * len(PROMPTS) * (NEW_TOKENS - 1)
    assert s["decode_layers"] == 2 * s["plans"]  # both layers run each plan of a step
    assert s["steps"] <= s["plans"]  # one DecodeWrapper.plan per step and token count, not per layer
    # the 5-token prompt (and short prefill chunks) ran through a DecodeWrapper(q_len=n), causal within its tokens
    assert s["verify_rows"] > 0 and {w.q_len for w in handle.wrappers.values()} > {1}
    assert s["sdpa_layers"] > 0  # prefill rows, some in steps mixed with decode rows
    # decode-only steps (both layers) wrote the new keys/values without reading the cache back
    assert 0 < s["reads_skipped"] < s["decode_layers"] and s["reads_skipped"] % 2 == 0


@pytest.mark.slow
def test_short_rows_run_where_a_work_tile_holds_them():
    """GQA group 16 (16 query heads over 1 KV head): a work tile holds 64 query rows, so a 3-token prompt (48 rows)
    runs through DecodeWrapper(q_len=3) and a 6-token prompt (96 rows) through transformers' sdpa; the tokens
    equal transformers' own."""
    model = _model(num_hidden_layers=1, num_attention_heads=16, num_key_value_heads=1)
    prompts = [[11, 12, 13], [21, 22, 23, 24, 25, 26], list(range(1, 40))]
    ref = _generate(model, prompts, new_tokens=4)
    handle = ktf.install(table=PolicyTable([], fallback_name="fixed", fallback_params={"num_splits": 2}))
    try:
        got = _generate(model, prompts, new_tokens=4)
    finally:
        handle.uninstall()
    assert got == ref
    assert sorted(w.q_len for w in handle.wrappers.values()) == [1, 3]
    assert handle.stats["verify_rows"] == 3  # the 3-token prompt's rows, one layer


def test_install_bad_argument_and_plain_generate_untouched():
    with pytest.raises(ValueError, match="max_batch_size"):
        ktf.install(max_batch_size=0)
    with pytest.raises(ValueError, match="decoder"):
        ktf.install(decoder="flashinfer")
    with pytest.raises(ValueError, match="page_size"):
        ktf.continuous_batching_config(page_size=512)
    assert ktf.installed() is None
    model = _model()
    model.set_attn_implementation("sdpa")  # a plain forward (5.17 refuses paged|sdpa outside continuous batching)
    ids = torch.tensor([PROMPTS[3]])
    ref = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    handle = ktf.install()
    try:  # a plain generate() (not continuous batching) still runs transformers' own sdpa
        got = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    finally:
        handle.uninstall()
    assert torch.equal(got, ref)
    assert handle.stats["decode_layers"] == 0
