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

from m3bench.cli import validate
from m3bench.cli.engine_flags import ENGINE, EngineFlags, engine_flags
from m3bench.cli.errors import M3BenchError, user_errors


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


@user_errors
@engine_flags
def serve(
    model: Path = typer.Option(..., "--model", help="Checkpoint directory (config.json, tokenizer, safetensors)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (loopback unless told otherwise)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="M3BENCH_API_KEY",
                                          help="Require `Authorization: Bearer KEY` on every route but /health."),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name",
                                                    help="Model id clients send (default: the directory name)."),
    seed: int = typer.Option(0, "--seed", help="Engine seed (sampler, dummy weights)."),
    log_level: str = typer.Option("warning", "--log-level"),
    engine: EngineFlags = ENGINE,
) -> None:
    """Serve a checkpoint over an OpenAI-compatible API (completions, chat, models, health, metrics)."""
    log_level = validate.log_level(log_level)
    cfg = engine.config(model, seed=seed)
    if not model.is_dir():
        raise M3BenchError(f"--model {model} is not a directory")
    from m3bench.bench.server import ServerConfig, create_app, uvicorn_server
    from m3bench.runtime.async_llm import AsyncLLM
    from m3bench.runtime.llm import LLM

    validate.bind_address(host, port)  # before the model loads: a bad --host / busy --port is exit 2 at once
    llm = LLM.from_config(cfg)
    async_engine = AsyncLLM(llm)
    server = ServerConfig(served_model_name or model.resolve().name, llm.max_model_len, api_key or None)
    print(f"m3bench serve: {server.model_name} on http://{host}:{port} (max_model_len {server.max_model_len})",
          file=sys.stderr)
    try:
        uvicorn_server(create_app(async_engine, server), host, port, log_level).run()
    finally:
        async_engine.shutdown()
