#!/usr/bin/env bash
# The H200 run of issue 13 item 8: train the tiny skilled M3, measure it, distil its Eagle3 draft, measure AL.
#   OUT=/tmp/skill bash benchmarks/tiny_skill_gpu.sh [TRAIN_BUDGET_S]
# Writes $OUT/skill.tgz (ckpt/, eagle3/, train_report.json, the accuracy and accept summaries) and $OUT/log.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
budget=${1:-270}
work=/tmp/skill; rm -rf $work; mkdir -p $work
stage() { echo "=== $1 $(date +%T)"; }
stage train
python benchmarks/train_tiny_skill.py --dest $work --device cuda --steps 30000 --batch-size 128 --lr 3e-3 \
    --time-budget-s "$budget" | tail -25
m3="python -m m3bench"
stage accuracy
for task in gsm8k mmlu; do
  timeout 120 $m3 accuracy --model $work/ckpt --model-id m3bench/tiny-m3 --data-dir $work/data --task $task \
      --num-fewshot 0 --limit 400 --no-reference --device cuda --dtype float32 --no-progress --out $work/acc-$task \
      2>&1 | tail -8
done
stage distill
python - <<'PY'
import json
from m3bench.evals.protocols.gsm8k_chat import user_turn
rows = [json.loads(l) for l in open("/tmp/skill/data/gsm8k/train.jsonl")][:1536]
open("/tmp/skill/turns.jsonl", "w").write("".join(json.dumps({"turn": user_turn(r["question"])}) + "\n" for r in rows))
PY
timeout 200 $m3 checkpoint distill-draft $work/ckpt $work/eagle3 --prompts-file $work/turns.jsonl --field turn \
    --num-prompts 1536 --new-tokens 96 --steps 3000 --batch-size 64 --device cuda 2>&1 | tail -4
stage accept
timeout 100 $m3 accept --model $work/ckpt --draft $work/eagle3 --data-dir $work/data --limit 64 --max-tokens 256 \
    --no-reference --device cuda --dtype float32 --no-progress --out $work/accept 2>&1 | tail -12
stage pack
cd $work && find acc-* accept -name '*.json*' > files.txt; tar czf $OUT/skill.tgz ckpt eagle3 train_report.json \
    $(cat files.txt) && ls -la $OUT
