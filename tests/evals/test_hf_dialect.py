"""The hf backend refuses checkpoints transformers cannot load (the original M3 dialect) with exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from m3bench.evals.backends.hf import check_transformers_loads
from m3bench.runtime.errors import InputError

pytest.importorskip("transformers")


@pytest.mark.parametrize("model_type, message", [("minimax_m3", "original dialect"), ("no_such_arch", "has no model")])
def test_unloadable_model_types_are_input_errors(tmp_path, model_type, message):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(InputError, match=message):
        check_transformers_loads(tmp_path)


def test_loadable_model_type_passes(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    check_transformers_loads(tmp_path)  # no error


def test_cli_hf_backend_on_the_tiny_checkpoint_exits_2(tmp_path):
    env = {**os.environ, "M3BENCH_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "m3bench", "accuracy", "--backend", "hf", "--out", str(tmp_path / "o"),
                           "--no-progress"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "original dialect" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
