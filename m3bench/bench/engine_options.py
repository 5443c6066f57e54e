"""An EngineConfig as `m3bench serve` flags (the sweep's --serve mode starts that command).

    serve_args(EngineConfig(model=Path("ckpt"), load_format=LoadFormat.DUMMY))   # ["--model", "ckpt", ...]

The flag names are those of m3bench/cli/engine_flags.py; tests/cli/test_engine_flags.py parses this
list back through the CLI and checks that the same EngineConfig comes out.
"""

from __future__ import annotations

from m3bench.runtime.engine_config import EngineConfig


def serve_args(cfg: EngineConfig) -> list[str]:
    """`m3bench serve` arguments that rebuild `cfg` (what is None, or left to auto, is left out)."""
    d = cfg.to_dict()
    args = ["--model", str(cfg.model), "--load-format", d["load_format"], "--device", cfg.device,
            "--dtype", d["dtype"], "--kv-cache-dtype", d["kv_cache_dtype"], "--tokens-per-block",
            str(cfg.tokens_per_block), "--max-batch-size", str(cfg.max_batch_size), "--max-num-tokens",
            str(cfg.max_num_tokens), "--gpu-memory-utilization", str(cfg.gpu_memory_utilization), "--seed",
            str(cfg.seed), "--attention-backend", d["attention_backend"], "--tp", str(cfg.tensor_parallel_size),
            "--prefix-caching" if cfg.enable_prefix_caching else "--no-prefix-caching"]
    for flag, value in (("--num-kv-blocks", cfg.num_kv_blocks), ("--synthetic-acceptance", cfg.synthetic_acceptance)):
        if value is not None:
            args += [flag, str(value)]
    if cfg.draft is not None:
        args += ["--draft", str(cfg.draft), "--draft-len", str(cfg.draft_len), "--draft-kv", d["draft_kv"]]
    for name, value in (("cuda-graphs", cfg.cuda_graphs), ("async-scheduling", cfg.async_scheduling)):
        if value is not None:
            args += [f"--{name}" if value else f"--no-{name}"]
    return args
