"""decode_step.py with the one-token GEMVs' resident-program counts from the environment (GU, DN)."""
import os
import runpy
import sys

sys.path[:0] = [".", "benchmarks"]
from m3bench.runtime.kernels import moe_gemv as mg  # noqa: E402

mg.GATE_UP_PER_SM = int(os.environ.get("GU", mg.GATE_UP_PER_SM))
mg.DOWN_PER_SM = int(os.environ.get("DN", mg.DOWN_PER_SM))
from m3bench.runtime.kernels.moe import gemv_tiles  # noqa: E402
t = gemv_tiles(3072, 6144)
print(f"GEMV per SM gate|up {mg.GATE_UP_PER_SM} down {mg.DOWN_PER_SM}: split_k {t.split_k} split_down {t.split_down}",
      flush=True)
sys.argv = ["benchmarks/decode_step.py"] + sys.argv[1:]
runpy.run_path("benchmarks/decode_step.py", run_name="__main__")
