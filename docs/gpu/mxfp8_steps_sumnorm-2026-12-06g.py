"""One-off: the MXFP8 60-layer rank step at B1 / B16 with the MoE's sum apart and in the next add + norm."""
import sys
sys.path.insert(0, "benchmarks")
import torch
import mxfp8_gpu as m
import m3bench.runtime.layers.moe as lm

for on in (False, True):
    lm.SUM_IN_NORM = on
    rows = m.decode_step_rows(0, 60, (1, 16), 8192, torch.device("cuda"), formats=("mxfp8",))
    print(f"SUM_IN_NORM={on}")
    print(m.step_table(rows), flush=True)
