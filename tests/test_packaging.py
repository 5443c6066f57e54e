"""The wheel carries what runs need besides code: the reference YAMLs and the tiny distilled Eagle3 draft."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "results", "docs", "tests",
                                     "benchmarks", "__pycache__", ".*_cache")


def test_wheel_ships_references_and_the_tiny_draft(tmp_path):
    """Built from a copy of the sources: setuptools leaves build/ and *.egg-info where it builds."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=NOT_SOURCES)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(src)], check=True, capture_output=True, timeout=300)
    wheel = next(tmp_path.glob("m3bench-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for ref in ("mmlu.yaml", "gsm8k.yaml", "acceptance_length.yaml"):
        assert f"m3bench/references/{ref}" in names
    for asset in ("config.json", "model.safetensors", "README.md"):
        assert f"m3bench/runtime/speculative/assets/tiny-eagle3/{asset}" in names
