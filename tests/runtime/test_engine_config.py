"""EngineConfig: strict parsing, the one resolve() of every "auto", and its enums mirroring the runtime's."""

from __future__ import annotations

from pathlib import Path

import pytest

from m3bench.runtime.engine_config import (
    AttentionBackend,
    DeviceFacts,
    DraftKV,
    DType,
    EngineConfig,
    KVCacheDtype,
    LoadFormat,
    resolve,
    supported_page_size,
)
from m3bench.runtime.errors import InputError

NO_CUDA, TWO_GPUS = DeviceFacts(0), DeviceFacts(2)


def test_enums_mirror_the_runtime_enums():
    from m3bench.runtime.attention.select import AttentionChoice
    from m3bench.runtime.kv_cache import KVDtype
    from m3bench.runtime.speculative.config import DraftKVLayout

    for mine, theirs in ((KVCacheDtype, KVDtype), (DraftKV, DraftKVLayout), (AttentionBackend, AttentionChoice)):
        assert [m.value for m in mine] == [m.value for m in theirs]


def test_strings_parse_into_enums_and_paths():
    cfg = EngineConfig("ckpt", dtype="bf16", kv_cache_dtype="fp8", load_format="dummy", draft="d", draft_kv="shared")
    assert cfg.model == Path("ckpt") and cfg.draft == Path("d")
    assert (cfg.dtype, cfg.kv_cache_dtype, cfg.load_format, cfg.draft_kv) == (
        DType.BFLOAT16, KVCacheDtype.FP8, LoadFormat.DUMMY, DraftKV.SHARED)
    assert EngineConfig.from_dict(cfg.to_dict()) == cfg  # to_dict is JSON-ready and round-trips


@pytest.mark.parametrize("changes, needle", [
    ({"device": "tpu"}, "unknown device 'tpu'"),
    ({"device": "cuda:x"}, "unknown device"),
    ({"dtype": "float7"}, "unknown dtype 'float7'"),
    ({"kv_cache_dtype": "int3"}, "unknown kv_cache_dtype"),
    ({"tokens_per_block": 7}, "not a supported page size"),
    ({"tokens_per_block": 0}, "tokens_per_block must be >= 1"),
    ({"seed": 99999999999999999999999}, "seed must be in"),
    ({"seed": -1}, "seed must be in"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"num_kv_blocks": 0}, "num_kv_blocks"),
    ({"draft_len": 16}, "draft_len must be <= 15"),
    ({"synthetic_acceptance": 2.0}, "needs --draft"),
    ({"attention_dp": True}, "attention_dp needs tensor_parallel_size > 1"),
])
def test_bad_values_are_input_errors(changes, needle):
    with pytest.raises(InputError, match=needle):
        EngineConfig("ckpt", **changes)


def test_unknown_keys_are_refused():
    with pytest.raises(InputError, match=r"unknown engine settings \['devcie'\]"):
        EngineConfig.from_dict({"model": "x", "devcie": "cpu"})


def test_page_sizes():
    assert [p for p in range(1, 200) if supported_page_size(p)] == [1, 2, 4, 8, 16, 32, 64, 128, 192]


def test_resolve_on_a_cpu_machine():
    cfg = resolve(EngineConfig("ckpt"), NO_CUDA)
    assert (cfg.device, cfg.dtype, cfg.cuda_graphs, cfg.async_scheduling) == ("cpu", DType.FLOAT32, False, False)
    assert cfg.is_resolved and resolve(cfg, NO_CUDA) == cfg
    for device in ("cuda", "cuda:1"):
        with pytest.raises(InputError, match="CUDA is not available"):
            resolve(EngineConfig("ckpt", device=device), NO_CUDA)
    with pytest.raises(InputError, match="cuda_graphs needs a CUDA device"):
        resolve(EngineConfig("ckpt", cuda_graphs=True), NO_CUDA)


def test_resolve_on_a_cuda_machine():
    cfg = resolve(EngineConfig("ckpt"), TWO_GPUS)
    assert (cfg.device, cfg.dtype, cfg.cuda_graphs, cfg.async_scheduling) == ("cuda", DType.BFLOAT16, True, True)
    spec = resolve(EngineConfig("ckpt", draft="d"), TWO_GPUS)  # speculation: graphs on, overlap only when asked
    assert (spec.cuda_graphs, spec.async_scheduling) == (True, False)
    tp = resolve(EngineConfig("ckpt", tensor_parallel_size=2), TWO_GPUS)  # TP: neither yet
    assert (tp.cuda_graphs, tp.async_scheduling) == (False, False)
    off = resolve(EngineConfig("ckpt", cuda_graphs=False, async_scheduling=False, dtype="float16"), TWO_GPUS)
    assert (off.cuda_graphs, off.async_scheduling, off.dtype) == (False, False, DType.FLOAT16)
    assert resolve(EngineConfig("ckpt", attention_backend="torch"), TWO_GPUS).cuda_graphs is False
    with pytest.raises(InputError, match="needs 100 CUDA devices"):
        resolve(EngineConfig("ckpt", device="cuda:99"), TWO_GPUS)
    with pytest.raises(InputError, match="needs 3 CUDA devices"):
        resolve(EngineConfig("ckpt", device="cuda:1", tensor_parallel_size=2), TWO_GPUS)
    assert resolve(EngineConfig("ckpt", draft="d", async_scheduling=False), TWO_GPUS).async_scheduling is False
    assert resolve(EngineConfig("ckpt", tensor_parallel_size=2, async_scheduling=True), TWO_GPUS).async_scheduling
