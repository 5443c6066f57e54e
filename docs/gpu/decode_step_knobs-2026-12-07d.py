"""decode_step.py with skinny split knobs from the environment (MSS: MIN_SPLIT_STEPS, PERSM: dot PER_SM)."""
import os
import runpy
import sys

sys.path[:0] = [".", "benchmarks"]
from m3bench.runtime.kernels import skinny as sk  # noqa: E402
from m3bench.runtime.kernels.mx_linear import MxKernel  # noqa: E402

sk.MIN_SPLIT_STEPS = int(os.environ.get("MSS", sk.MIN_SPLIT_STEPS))
sk.PER_SM[MxKernel.DOT] = float(os.environ.get("PERSM", sk.PER_SM[MxKernel.DOT]))
for name, (n, k, g) in {"qkv": (1920, 6144, False), "o": (6144, 1024, False), "sh_gu": (384, 6144, True),
                        "sh_dn": (6144, 384, False), "dense_gu": (1536, 6144, True), "dense_dn": (6144, 1536, False)}.items():
    print(name, sk.skinny_tiles(1, n, k, gated=g), flush=True)
sys.argv = ["benchmarks/decode_step.py"] + sys.argv[1:]
runpy.run_path("benchmarks/decode_step.py", run_name="__main__")
