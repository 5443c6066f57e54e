"""`m3bench serve`: the bundled engine behind an OpenAI-compatible HTTP API.

    m3bench serve --model ckpt --port 8000
    m3bench serve --model ckpt --load-format dummy --device cuda --api-key secret   # or M3BENCH_API_KEY
    m3bench serve --model ckpt --draft eagle3 --draft-len 3 --synthetic-acceptance 2.5   # speculative
    curl localhost:8000/v1/completions -d '{"model": "ckpt", "prompt": "Hi", "max_tokens": 8}'

Binds 127.0.0.1 unless --host says otherwise. Routes: /v1/completions, /v1/chat/completions,
/v1/models, /health, /metrics (Prometheus, `m3bench:` names).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from m3bench.cli.engine_flags import ASYNC_HELP, CUDA_GRAPHS_HELP, WEIGHTS_DTYPE_HELP
from m3bench.cli.errors import user_errors


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


@user_errors
def serve(
    model: Path = typer.Option(..., "--model", help="Checkpoint directory (config.json, tokenizer, safetensors)."),
    load_format: str = typer.Option("auto", "--load-format", help="auto: the checkpoint's weights; dummy: random."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (loopback unless told otherwise)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="M3BENCH_API_KEY",
                                          help="Require `Authorization: Bearer KEY` on every route but /health."),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name",
                                                    help="Model id clients send (default: the directory name)."),
    device: str = typer.Option("cpu", "--device"),
    dtype: str = typer.Option("auto", "--dtype", help="auto: bfloat16 on CUDA, float32 on CPU."),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", help="auto (the model dtype), bf16, fp8, nvfp4 or hybrid."),
    max_batch_size: int = typer.Option(64, "--max-batch-size", min=1),
    max_num_tokens: int = typer.Option(2048, "--max-num-tokens", min=1),
    num_kv_blocks: Optional[int] = typer.Option(None, "--num-kv-blocks", min=1),
    gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization"),
    seed: int = typer.Option(0, "--seed"),
    synthetic_acceptance: Optional[float] = typer.Option(None, "--synthetic-acceptance",
                                                         help="Force this acceptance length (needs --draft)."),
    draft: Optional[Path] = typer.Option(None, "--draft", help="Eagle3 draft directory: speculative decoding "
                                         "(with --load-format dummy only its config.json is read)."),
    draft_len: int = typer.Option(3, "--draft-len", min=1, help="Draft tokens proposed per verify step."),
    draft_kv: str = typer.Option("separate", "--draft-kv", help="Draft KV pages: separate or shared."),
    cuda_graphs: bool = typer.Option(False, "--cuda-graphs", help=CUDA_GRAPHS_HELP),
    async_scheduling: Optional[bool] = typer.Option(None, "--async-scheduling/--no-async-scheduling", help=ASYNC_HELP),
    log_level: str = typer.Option("warning", "--log-level"),
    weights_dtype: str = typer.Option("auto", "--weights-dtype", help=WEIGHTS_DTYPE_HELP),
) -> None:
    """Serve a checkpoint over an OpenAI-compatible API (completions, chat, models, health, metrics)."""
    from m3bench.bench.engine_options import EngineOptions
    from m3bench.bench.server import ServerConfig, create_app, uvicorn_server
    from m3bench.runtime.async_llm import AsyncLLM

    opts = EngineOptions(str(model), load_format, device, dtype, kv_cache_dtype, max_batch_size, max_num_tokens,
                         num_kv_blocks, gpu_memory_utilization, seed, synthetic_acceptance,
                         draft_dir=None if draft is None else str(draft), draft_len=draft_len, draft_kv=draft_kv,
                         cuda_graphs=cuda_graphs, async_scheduling=async_scheduling, weights_dtype=weights_dtype)
    llm = opts.build()
    engine = AsyncLLM(llm)
    cfg = ServerConfig(served_model_name or model.resolve().name, llm.max_model_len, api_key or None)
    print(f"m3bench serve: {cfg.model_name} on http://{host}:{port} (max_model_len {cfg.max_model_len})",
          file=sys.stderr)
    try:
        uvicorn_server(create_app(engine, cfg), host, port, log_level).run()
    finally:
        engine.shutdown()
