"""`m3bench --help` and `--version` must start fast: no torch, no transformers."""

import subprocess
import sys

import m3bench

PROBE = (
    "import sys, runpy; sys.argv = ['m3bench', '{arg}'];\n"
    "try:\n    runpy.run_module('m3bench', run_name='__main__')\nexcept SystemExit:\n    pass\n"
    "heavy = [m for m in ('torch', 'transformers', 'triton', 'pandas') if m in sys.modules]\n"
    "print('HEAVY=' + ','.join(heavy))\n"
)


def _run(arg: str) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE.format(arg=arg)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_help_imports_no_torch():
    out = _run("--help")
    assert "Usage" in out
    assert out.strip().endswith("HEAVY=")


def test_version_imports_no_torch():
    out = _run("--version")
    assert f"m3bench {m3bench.__version__}" in out
    assert out.strip().endswith("HEAVY=")


def test_python_dash_m_runs():
    out = subprocess.run([sys.executable, "-m", "m3bench", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and m3bench.__version__ in out.stdout
