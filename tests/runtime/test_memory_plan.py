"""The memory plan against figures computed by hand from shared/docs/minimax-m3.md section 1."""

import dataclasses
import json
from pathlib import Path

import pytest

from m3bench.runtime.config import ModelConfig
from m3bench.runtime.errors import InputError
from m3bench.runtime.memory_plan import (
    GIB, DraftShape, PlanSettings, WeightFormat, check_fits, parameter_count, plan_memory, preset_config,
    weight_format_for,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "minimax-m3"
H, V, L, I_DENSE, E, I, S = 6144, 200064, 60, 12288, 128, 3072, 3072
DENSE, SPARSE = 3, 57
MLP = 3 * H * I  # one expert (w1, w3, w2)


@pytest.fixture(scope="module")
def m3() -> ModelConfig:
    return ModelConfig.from_pretrained(FIXTURES / "vl-bf16.json")


def test_preset_is_the_published_config(m3):
    assert preset_config("minimax-m3") == m3
    with pytest.raises(InputError, match="unknown preset"):
        preset_config("gpt-5")


def test_parameter_count_of_the_real_config(m3):
    p = parameter_count(m3)
    assert p["embeddings"] == p["lm_head"] == 200064 * 6144 == 1_229_193_216
    assert p["attention"] == L * (2 * H * 64 * 128 + 2 * H * 4 * 128) == 6_417_285_120
    assert p["index"] == SPARSE * (4 * 128 + 128) * H == 224_133_120
    assert p["dense_mlp"] == DENSE * 3 * H * I_DENSE == 679_477_248
    assert p["routed_experts"] == SPARSE * E * MLP == 413_122_166_784
    assert p["shared_expert"] == SPARSE * 3 * H * S == 3_227_516_928
    norms = H + L * (2 * H + 2 * 128) + SPARSE * 2 * 128
    assert p["routers_norms"] == norms + SPARSE * E * (H + 1)
    assert sum(p.values()) == 426_174_572_928  # the "~428B total" of the model card (no MTP, no vision)


# Per rank at TP8/EP8, in parameters: q/o by 8 heads, one (duplicated) KV head and index head, the index
# key head replicated, 16 of the 128 experts, 1/8 of the dense and shared intermediates and of the vocabulary.
ATTN_TP8 = L * (2 * H * 8 * 128 + 2 * H * 128)  # 849,346,560
INDEX_TP8 = SPARSE * 2 * 128 * H  # 89,653,248
LINEAR_TP8 = ATTN_TP8 + INDEX_TP8 + DENSE * 3 * H * I_DENSE // 8 + SPARSE * 3 * H * S // 8
EXPERTS_TP8 = SPARSE * 16 * MLP  # 51,640,270,848
VOCAB_TP8 = 2 * V * H // 8 * 2  # embeddings + lm_head, bf16
NORMS_ROUTERS = 773_376 * 2 + SPARSE * E * (H + 1) * 4  # norms bf16, routers + bias fp32


@pytest.mark.parametrize("fmt, expected", [
    (WeightFormat.BF16, (LINEAR_TP8 + EXPERTS_TP8) * 2 + VOCAB_TP8 + NORMS_ROUTERS),  # 106,930,768,896
    (WeightFormat.MXFP8, (LINEAR_TP8 + EXPERTS_TP8) * 33 // 32 + VOCAB_TP8 + NORMS_ROUTERS),
    (WeightFormat.NVFP4_EXPERTS, LINEAR_TP8 * 33 // 32 + EXPERTS_TP8 * 9 // 16 + VOCAB_TP8 + NORMS_ROUTERS),
    (WeightFormat.NVFP4_EXPERTS_E4M3, LINEAR_TP8 * 33 // 32 + EXPERTS_TP8 * 17 // 16 + VOCAB_TP8 + NORMS_ROUTERS),
])
def test_bytes_per_rank_at_tp8(m3, fmt, expected):
    plan = plan_memory(m3, PlanSettings(tp=8, weights=fmt))
    assert plan.weight_bytes == expected
    assert plan.parts["routed_experts"] == {WeightFormat.BF16: EXPERTS_TP8 * 2, WeightFormat.MXFP8:
                                            EXPERTS_TP8 * 33 // 32, WeightFormat.NVFP4_EXPERTS_E4M3:
                                            EXPERTS_TP8 * 17 // 16}.get(fmt, EXPERTS_TP8 * 9 // 16)


def test_bf16_tp8_is_the_issue_figure(m3):
    """The issue's '~107 GB of weights on a TP8 rank' in bf16 and '~54 GB' in MXFP8 (bytes, not GiB)."""
    assert round(plan_memory(m3, PlanSettings(tp=8)).weight_bytes / 1e9) == 107
    assert 53 < plan_memory(m3, PlanSettings(tp=8, weights=WeightFormat.MXFP8)).weight_bytes / 1e9 < 56


@pytest.mark.parametrize("kv, per_token, index", [
    ("bf16", L * 2 * 128 * 2, SPARSE * 128 * 2),  # one local KV head of 128, K and V, 2 bytes
    ("fp8", L * 2 * 128, SPARSE * 128),
    ("nvfp4", L * 2 * (64 + 8), SPARSE * (64 + 8)),  # 64 data bytes + 8 e4m3 scales per 128 elements
    ("hybrid", SPARSE * 2 * 72 + DENSE * 2 * 128, SPARSE * 72),
])
def test_kv_bytes_per_token_at_tp8(m3, kv, per_token, index):
    plan = plan_memory(m3, PlanSettings(tp=8, kv_cache_dtype=kv))
    assert (plan.kv_bytes_per_token, plan.index_k_bytes_per_token) == (per_token, index)
    assert plan.page_bytes == (per_token + index) * 128


def test_ep_does_not_change_bytes(m3):
    """EP 8 (16 whole experts a rank) or EP 1 (every expert split 8 ways): 1/8 of the expert bytes."""
    assert plan_memory(m3, PlanSettings(tp=8, ep=1)).parts == plan_memory(m3, PlanSettings(tp=8, ep=8)).parts


def test_kv_at_tp1_holds_all_four_heads(m3):
    plan = plan_memory(m3, PlanSettings(tp=1, kv_cache_dtype="bf16"))
    assert plan.kv_bytes_per_token == L * 2 * 4 * 128 * 2


def test_tokens_and_sequences_that_fit(m3):
    s = PlanSettings(tp=8, weights=WeightFormat.MXFP8, kv_cache_dtype="fp8", max_model_len=131072, max_num_seqs=64)
    plan = plan_memory(m3, s)
    room = int(141 * GIB * 0.9) - plan.weight_bytes - plan.workspace_bytes - GIB
    assert plan.kv_pages == room // plan.page_bytes and plan.kv_tokens == plan.kv_pages * 128
    assert plan.sequences == min(plan.kv_pages // 1024, 64) and plan.fits
    d = plan.to_dict()
    assert json.loads(json.dumps(d)) == d and d["fits"] and d["kv_tokens"] == plan.kv_tokens


def test_does_not_fit_names_the_shortfall(m3):
    plan = plan_memory(m3, PlanSettings(tp=1))  # 426B parameters in bf16 on one GPU
    assert not plan.fits
    assert plan.shortfall_bytes == plan.needed_bytes - int(141 * GIB * 0.9)
    assert f"does not fit by {plan.shortfall_bytes / GIB:.2f} GiB" in plan.message()
    with pytest.raises(InputError, match="does not fit by"):
        check_fits(m3, PlanSettings(tp=1))
    assert check_fits(m3, PlanSettings(tp=8)).fits


def test_one_long_sequence_decides(m3):
    """Weights fit but one sequence of max_model_len does not: not a fit (a smaller length is)."""
    s = PlanSettings(tp=8, gpu_memory_gib=120, kv_cache_dtype="bf16", max_model_len=1 << 20)
    assert not plan_memory(m3, s).fits
    assert plan_memory(m3, dataclasses.replace(s, max_model_len=8192)).fits


def test_eagle3_draft_bytes(m3):
    base = plan_memory(m3, PlanSettings(tp=8))
    plan = plan_memory(m3, PlanSettings(tp=8, draft=DraftShape()))
    attn = 2 * H * (8 * 128 + 2 * 8 * 128) + H * 8 * 128  # q, k, v take 2H inputs; o
    params = 3 * H * H + attn + 3 * H * 18432 // 8 + V * H // 8 + 6 * H
    assert plan.parts["eagle3_draft"] == params * 2
    assert plan.kv_bytes_per_token - base.kv_bytes_per_token == 2 * 8 * 128 * 2


def test_weight_format_auto_reads_the_checkpoint():
    assert weight_format_for(ModelConfig.from_pretrained(FIXTURES / "vl-mxfp8.json")) is WeightFormat.MXFP8
    assert weight_format_for(ModelConfig.from_pretrained(FIXTURES / "vl-nvfp4.json")) is WeightFormat.NVFP4_EXPERTS
    assert weight_format_for(ModelConfig.from_pretrained(FIXTURES / "vl-bf16.json")) is WeightFormat.BF16


def test_nvfp4_codes_held_as_e4m3_are_planned_so(monkeypatch):
    """M3BENCH_NV_CODES=e4m3: the NVFP4 release's experts take a byte a weight, and the plan counts it; a bad
    value is a one-line input error."""
    from m3bench.runtime import nv_codes

    nvfp4 = ModelConfig.from_pretrained(FIXTURES / "vl-nvfp4.json")
    monkeypatch.setattr(nv_codes, "NV_CODES", {})
    monkeypatch.setenv(nv_codes.NV_CODES_ENV, "e4m3")
    assert weight_format_for(nvfp4) is WeightFormat.NVFP4_EXPERTS_E4M3
    assert weight_format_for(ModelConfig.from_pretrained(FIXTURES / "vl-mxfp8.json")) is WeightFormat.MXFP8
    monkeypatch.setattr(nv_codes, "NV_CODES", {})
    monkeypatch.setenv(nv_codes.NV_CODES_ENV, "nibbles")
    with pytest.raises(InputError, match="M3BENCH_NV_CODES='nibbles': expected one of"):
        weight_format_for(nvfp4)


@pytest.mark.parametrize("settings, message", [
    (PlanSettings(tp=3), "split over (TP|EP) 3"),
    (PlanSettings(tp=6, ep=2), "num_attention_heads 64 does not split over TP 6"),
    (PlanSettings(tp=8, ep=3), "must divide"),
    (PlanSettings(kv_cache_dtype="int4"), "unknown kv_cache_dtype"),
    (PlanSettings(gpu_memory_utilization=1.5), "utilization"),
])
def test_bad_settings(m3, settings, message):
    with pytest.raises(InputError, match=message):
        plan_memory(m3, settings)


def test_attention_dp_keeps_all_but_the_routed_experts_whole(m3):
    """Attention DP over 8 ranks: experts as at TP8/EP8, attention, dense, embeddings and KV heads as at TP 1."""
    tp8, tp1 = plan_memory(m3, PlanSettings(tp=8)), plan_memory(m3, PlanSettings(tp=1))
    dp = plan_memory(m3, PlanSettings(tp=8, attention_dp=True))
    assert dp.parts["routed_experts"] == tp8.parts["routed_experts"] < tp1.parts["routed_experts"]
    for part in ("attention", "embeddings", "dense_mlp", "shared_expert", "lm_head"):
        assert dp.parts[part] == tp1.parts[part] > tp8.parts[part]
    assert dp.kv_bytes_per_token == tp1.kv_bytes_per_token > tp8.kv_bytes_per_token
    assert "attention DP 8/EP8" in dp.message()
    from m3bench.runtime.engine_config import DeviceFacts, EngineConfig, resolve
    from m3bench.runtime.fit_check import engine_settings

    engine = resolve(EngineConfig(device="cpu", tensor_parallel_size=8, attention_dp=True), DeviceFacts(0))
    assert engine_settings(m3, engine).attention_dp  # what LLM.from_config checks an attention-DP engine against
