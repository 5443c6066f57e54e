"""Shared fixtures: a tiny random MiniMax-M3 checkpoint, and the real checkpoints when fetched.

Real checkpoints come from `../shared/tools/fetch-model NAME DIR`; tests that need one skip
when it is absent. Looked up in $M3BENCH_SMOLLM2_DIR / $M3BENCH_QWEN05_DIR, then
~/.cache/m3bench/models/<name>.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

MODELS_DIR = Path.home() / ".cache" / "m3bench" / "models"


def real_checkpoint(env: str, name: str) -> Path:
    """The fetched checkpoint's directory, or skip the test."""
    path = Path(os.environ[env]) if os.environ.get(env) else MODELS_DIR / name
    if not (path / "config.json").exists():
        pytest.skip(f"{name} not fetched (set {env} or run ../shared/tools/fetch-model {name} {path})")
    return path


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Path:
    """A tiny random MiniMax-M3 checkpoint (M3 bf16 names, one safetensors file), seed 0."""
    from m3bench.runtime.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny_m3"), seed=0)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    return real_checkpoint("M3BENCH_SMOLLM2_DIR", "smollm2-135m-instruct")


@pytest.fixture(scope="session")
def qwen05_dir() -> Path:
    return real_checkpoint("M3BENCH_QWEN05_DIR", "qwen2.5-coder-0.5b")
