"""Measure the smoke runs' golden figures of the shipped trained tiny model (m3bench/tiny-m3-skill) on CPU.

    OMP_NUM_THREADS=1 python benchmarks/smoke_goldens.py --out /tmp/goldens

Runs `m3bench accuracy` and `m3bench accept` with no --model (the smoke defaults) and --no-reference, and
prints each figure with its golden band (two items either side for accuracy; min_al 0.95 x AL) and the
wall time of each run, to copy into references/{mmlu,gsm8k,acceptance_length}.yaml.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def run(args: list[str]) -> tuple[list[dict], float]:
    start = time.time()
    done = subprocess.run([sys.executable, "-m", "m3bench", *args, "--no-reference", "--no-progress"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    out = done.stdout.strip()
    if out.startswith("{"):  # accept: the summary JSON itself
        return [json.loads(out[:out.rindex("}") + 1])], time.time() - start
    return [json.loads(Path(p).read_text()) for p in out.split()], time.time() - start


def band(s: dict) -> str:
    step = 100.0 / s["n"]
    lo, hi = max(0.0, s["score"] - 2 * step), min(100.0, s["score"] + 2 * step)
    metrics = ", ".join(f"{k} {v['score']:.3f}" for k, v in s["metrics"].items())
    return (f"{s['task']} n={s['n']} score {s['score']:.3f} "
            f"({metrics}); threshold {lo:.3f} ceiling {hi:.3f}; cap hit {s['cap_hit']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    summaries, wall = run(["accuracy", "--out", str(args.out / "accuracy")])
    for s in summaries:
        print(band(s))
    print(f"accuracy smoke wall {wall:.1f} s")
    (acc,), wall = run(["accept", "--out", str(args.out / "accept")])
    print(f"accept n={acc['n']} AL {acc['acceptance_length']:.4f} (min_al {0.95 * acc['acceptance_length']:.3f}) "
          f"acceptance rate {acc['acceptance_rate']:.4f} accepted {acc['accepted']} / drafts {acc['drafts']}")
    print(f"accept smoke wall {wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
