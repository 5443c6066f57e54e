"""GPU check: the fast path with the MSA top-k in the attention and the router in the experts' launch against fp32
torch (one 2600-token prompt: MSA selects; decode at batch 1: the routing in the gate|up launch)."""
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

spec = importlib.util.spec_from_file_location("e2e", "tests/runtime/kernel_tests/test_fast_path_e2e.py")
e2e = importlib.util.module_from_spec(spec)
spec.loader.exec_module(e2e)
from m3bench.runtime.attention import triton_backend  # noqa: E402
from m3bench.runtime.layers import moe  # noqa: E402

rows = []
for sel, route in ((False, False), (True, True)):
    triton_backend.SELECT_IN_ATTENTION, moe.ROUTE_IN_EXPERTS = sel, route
    with tempfile.TemporaryDirectory() as d:
        res = e2e.compare_fast_path(Path(d), e2e.REAL, [2600], "cuda", new=24)
    rows.append({"select": sel, "route": route, "max": res["max_abs_logprob_err"],
                 "p999": res["p999_abs_logprob_err"], "same_tokens": res["same_tokens"]})
    print(rows[-1], flush=True)
ok = all(r["same_tokens"] and r["p999"] < 2e-3 for r in rows)
print("CHECK", "ok" if ok else "FAILED")
Path(os.environ.get("OUT", "."), "check_sr.json").write_text(json.dumps(rows))
sys.exit(0 if ok else 1)
