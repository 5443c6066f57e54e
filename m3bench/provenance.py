"""Provenance of a measurement: what ran, on what, with which weights, data and seeds.

    provenance(device="cuda", engine={...}, model_dir=Path(ckpt), data={"test": sha}, seeds={"limit_shuffle": 0})

One record, used by every accuracy / accept summary and every sweep results.json:
software (m3bench version + git commit, python, torch, triton, transformers, lm-eval), device (name,
driver and CUDA versions; None on CPU), the full engine config, data sha256, seeds, and the weights
fingerprint. The fingerprint (`weights_fingerprint`) also enters the run keys: other weights, other run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

LIBRARIES = ("torch", "triton", "transformers", "lm_eval")
DISTRIBUTIONS = {"lm_eval": "lm-eval"}
SMALL_CHECKPOINT_BYTES = 256 * 2**20  # below this the weight files themselves are hashed
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def library_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTIONS.get(name, name))
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def software() -> dict[str, Any]:
    from m3bench import __version__

    return {"m3bench": __version__, "git_commit": git_commit(Path(__file__).parent), "python": platform.python_version(),
            **{name: library_version(name) for name in LIBRARIES}}


def git_commit(start: Path) -> str | None:
    """The checkout's HEAD (read only), or None outside a git work tree."""
    try:
        done = subprocess.run(["git", "-C", str(start), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def device_info(device: str | None) -> dict[str, Any]:
    """Name, driver and CUDA versions of the device the run used (driver and CUDA None on CPU; all None
    when the device is not known here, e.g. a remote server)."""
    if device is None:
        return {"device": None, "name": None, "driver": None, "cuda": None}
    if not device.startswith("cuda"):
        return {"device": device, "name": platform.processor() or platform.machine(), "driver": None, "cuda": None}
    import torch

    if not torch.cuda.is_available():
        return {"device": device, "name": None, "driver": None, "cuda": None}
    index = torch.device(device).index or 0
    return {"device": device, "name": torch.cuda.get_device_name(index), "count": torch.cuda.device_count(),
            "driver": nvidia_driver_version(), "cuda": torch.version.cuda}


def nvidia_driver_version() -> str | None:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines() if done.returncode == 0 else []
    return lines[0].strip() if lines else None


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def weights_fingerprint(model_dir: Path | None) -> dict[str, Any] | None:
    """sha256 of the weights: of the files for a small checkpoint, else of the shard index and the shard
    sizes (a large checkpoint without an index: of its file names and sizes). None without a directory."""
    if model_dir is None or not Path(model_dir).is_dir():
        return None
    model_dir = Path(model_dir)
    files = sorted(p for p in model_dir.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
    sizes = {p.name: p.stat().st_size for p in files}
    config = model_dir / "config.json"
    parts: dict[str, Any] = {"config": _sha256_file(config) if config.is_file() else None, "sizes": sizes}
    index = next((model_dir / n for n in INDEX_NAMES if (model_dir / n).is_file()), None)
    if sum(sizes.values()) <= SMALL_CHECKPOINT_BYTES:
        kind, parts["files"] = "files", {p.name: _sha256_file(p) for p in files}
    elif index is not None:
        kind, parts["index"] = "index", _sha256_file(index)
    else:
        kind = "sizes"
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return {"sha256": digest, "kind": kind, "num_files": len(files), "bytes": sum(sizes.values())}


def provenance(device: str | None, engine: dict[str, Any], model_dir: Path | None, data: dict[str, Any],
               seeds: dict[str, Any], weights: dict[str, Any] | None = None) -> dict[str, Any]:
    """The provenance record of one run (pass `weights` when already fingerprinted for the run key)."""
    return {"software": software(), "device": device_info(device), "engine": engine, "data": data, "seeds": seeds,
            "weights": weights if weights is not None else weights_fingerprint(model_dir)}


def sweep_provenance(cfg: Any) -> dict[str, Any]:
    """Provenance of a sweep (a bench.sweep.SweepConfig): the bundled engine's config, or the external server."""
    engine = cfg.engine
    options = engine.to_dict() if engine is not None else {"base_url": cfg.base_url, "served_model": cfg.served_model}
    path = cfg.dataset_path
    data = {"dataset": getattr(cfg.dataset, "value", cfg.dataset), "path": None if path is None else str(path),
            "sha256": _sha256_file(Path(path)) if path is not None and Path(path).is_file() else None}
    seeds = {"sweep": cfg.seed, "engine": None if engine is None else engine.seed}
    model_dir = None if engine is None or engine.model is None else Path(engine.model)
    return provenance(None if engine is None else str(engine.device), options, model_dir, data, seeds)
