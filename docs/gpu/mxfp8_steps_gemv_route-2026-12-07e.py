"""One-off: the MXFP8 60-layer rank step at B1 with the routing in the experts' (GEMV) gate|up launch off and on."""
import sys
sys.path.insert(0, "benchmarks")
import torch
import mxfp8_gpu as m
import m3bench.runtime.layers.moe as lm

for on in (False, True):
    lm.ROUTE_IN_EXPERTS = on
    rows = m.decode_step_rows(0, 60, (1,), 8192, torch.device("cuda"), formats=("mxfp8",))
    print(f"ROUTE_IN_EXPERTS={on}")
    print(m.step_table(rows), flush=True)
