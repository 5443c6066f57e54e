"""Train the tiny MiniMax-M3 (every layer kind: dense and MSA attention, dense and MoE MLPs; ~4.8M
parameters, ~9.5 MB in bf16) on the synthetic task set (m3bench/evals/synthetic.py), seeded.

    python benchmarks/train_tiny_skill.py --dest /tmp/tiny-skill --device cuda          # the H200 run
    python benchmarks/train_tiny_skill.py --dest /tmp/tiny-skill --cpu-smoke            # seconds, CPU
    m3bench accuracy --model /tmp/tiny-skill/ckpt --model-id m3bench/tiny-m3 --data-dir /tmp/tiny-skill/data \\
        --task mmlu,gsm8k --num-fewshot 0 --no-reference
    m3bench checkpoint distill-draft /tmp/tiny-skill/ckpt /tmp/tiny-skill/eagle3        # then its Eagle3 draft

STATUS: run on the H200 on 2026-12-02 (`OUT=... bash benchmarks/tiny_skill_gpu.sh 240`, 2,245 steps of batch 128
in 165 s): held-out GSM8K-format strict-match 97.5%, MMLU-format 77.5% (0-shot, 400 items each, fp32), its
distilled Eagle3 draft AL 3.91 at K 3 (docs/performance.md section 8, docs/gpu/tiny_skill-2026-12-02.log).
The result ships as the smoke runs' default, m3bench/runtime/assets/tiny-m3-skill (its goldens in
references/*.yaml under m3bench/tiny-m3-skill, measured on CPU by benchmarks/smoke_goldens.py).

Training examples are the protocols' own prompts (m3bench.evals.protocols: GSM8K "Question: ...\\nAnswer:"
with the solution and a blank line as target, so a generation stops at the next "Question:"; MMLU in the
lm-eval 0-shot and TensorRT-LLM generative formats with " {letter}" as target). The loss covers the target
tokens only. The forward is benchmarks/tiny_train_forward.py: the reference model's math batched over
padded sequences (checked against m3bench.runtime.reference there and in tests); MSA equals dense
attention at these lengths, so the indexer gets no gradient, nor does the router's correction bias.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from m3bench.evals.protocols.gsm8k import question_text
from m3bench.evals.protocols.gsm8k_chat import user_turn
from m3bench.evals.protocols.mmlu import lm_eval_prompt
from m3bench.evals.protocols.mmlu_gen import trtllm_header, trtllm_item
from m3bench.evals.protocols.mmlu_subjects import LETTERS
from tiny_train_forward import batched_logits, check_dense_msa  # noqa: E402 (benchmarks/ is on the path when run)

from m3bench.evals.synthetic import TaskSetSizes, read_train_rows, write_task_set
from m3bench.runtime.checkpoint import CheckpointReader
from m3bench.runtime.config import ModelConfig
from m3bench.runtime.model import M3ForCausalLM
from m3bench.runtime.tiny import Layout, file_tensors, write_safetensors, write_tiny_checkpoint

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


@dataclass(frozen=True)
class TrainPlan:
    seed: int = 0  # the initial weights, the task set, the batch order
    steps: int = 6000
    batch_size: int = 64
    time_budget_s: float = 0.0  # > 0: stop where the step time measured over the first 20 would overrun it
    lr: float = 2e-3
    warmup_steps: int = 200
    weight_decay: float = 0.01
    max_len: int = 192  # longer examples are skipped
    sizes: TaskSetSizes = TaskSetSizes()


CPU_SMOKE = TrainPlan(steps=3, batch_size=4, warmup_steps=1, sizes=TaskSetSizes(64, 8, 64, 8))


def examples(data_dir: Path, tokenizer, max_len: int) -> list[tuple[list[int], int]]:
    """(token ids, prompt length) of every training item, in the evaluation protocols' formats."""
    gsm, mmlu = read_train_rows(data_dir)
    pairs = [(question_text(row.question), f" {row.answer}\n\n") for row in gsm]
    for row in gsm:  # the gsm8k-chat turns of the acceptance probe: the answer, then the end of the turn
        chat = tokenizer.apply_chat_template([{"role": "user", "content": user_turn(row.question)}],
                                             add_generation_prompt=True, tokenize=False)
        pairs.append((chat, f"{row.answer}{tokenizer.eos_token}"))
    for row in mmlu:
        letter = f" {LETTERS[row.answer]}"
        pairs.append((lm_eval_prompt(row, []), letter))
        pairs.append((trtllm_header(row.subject) + trtllm_item(row, False), letter))
    out = []
    for prompt, target in pairs:
        p = tokenizer.encode(prompt, add_special_tokens=False)
        whole = tokenizer.encode(prompt + target, add_special_tokens=False)
        if len(whole) <= max_len and whole[:len(p)] == p:
            out.append((whole, len(p)))
    return out


def batch_loss(cfg: ModelConfig, w: dict[str, torch.Tensor], batch: list[tuple[list[int], int]]) -> torch.Tensor:
    """Mean cross-entropy of the target tokens of a batch: one padded forward (tiny_train_forward)."""
    device = w["embed_tokens.weight"].device
    t_len = max(len(ids) for ids, _ in batch)
    ids = torch.zeros(len(batch), t_len, dtype=torch.long)
    targets = torch.full((len(batch), t_len), -100, dtype=torch.long)
    for b, (seq, n_prompt) in enumerate(batch):
        ids[b, :len(seq)] = torch.tensor(seq)
        targets[b, n_prompt - 1:len(seq) - 1] = torch.tensor(seq[n_prompt:])
    lengths = torch.tensor([len(seq) for seq, _ in batch])
    logits = batched_logits(cfg, w, ids.to(device), lengths.to(device))
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.to(device).flatten())


def learning_rate(plan: TrainPlan, step: int) -> float:
    if step < plan.warmup_steps:
        return plan.lr * (step + 1) / plan.warmup_steps
    done = (step - plan.warmup_steps) / max(plan.steps - plan.warmup_steps, 1)
    return plan.lr * 0.5 * (1 + math.cos(math.pi * done))


def initial_weights(init_dir: Path, device: str) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """The seeded initial checkpoint's canonical tensors, fp32, as trainable leaves (the router's
    correction bias only selects experts: it gets no gradient)."""
    cfg = ModelConfig.from_pretrained(init_dir)
    model = M3ForCausalLM(cfg, torch.float32, "cpu")
    model.load_weights(CheckpointReader(init_dir, cfg))
    w = {s.name: s.target.detach().float().clone().to(device) for s in model.weight_slots()}
    for name, t in w.items():
        t.requires_grad_(not name.endswith("router.bias"))
    return cfg, w


def train(init_dir: Path, data_dir: Path, plan: TrainPlan, device: str) -> tuple[ModelConfig, dict, list[float]]:
    torch.backends.cuda.matmul.allow_tf32 = True
    cfg, w = initial_weights(init_dir, device)
    check_dense_msa(cfg, plan.max_len)
    from transformers import AutoTokenizer

    data = examples(data_dir, AutoTokenizer.from_pretrained(str(init_dir)), plan.max_len)
    params = [t for t in w.values() if t.requires_grad]
    opt = torch.optim.AdamW(params, lr=plan.lr, weight_decay=plan.weight_decay)
    order = random.Random(plan.seed)  # the only randomness: the batches (weights come from the seeded init)
    losses, steps, start = [], plan.steps, time.time()
    step = 0
    while step < steps:
        for group in opt.param_groups:
            group["lr"] = learning_rate(plan, step)
        loss = batch_loss(cfg, w, order.sample(data, plan.batch_size))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        step += 1
        if step == 20 and plan.time_budget_s > 0:  # stop early; the cosine stays laid out over plan.steps
            steps = min(steps, int(plan.time_budget_s / ((time.time() - start) / step)))
            print(f"step time {(time.time() - start) / step * 1e3:.1f} ms: {steps} steps", flush=True)
        if step % 250 == 0:
            print(f"step {step}/{steps} loss {sum(losses[-50:]) / len(losses[-50:]):.4f} "
                  f"{time.time() - start:.0f} s", flush=True)
    return cfg, w, losses


def save_checkpoint(cfg: ModelConfig, w: dict[str, torch.Tensor], init_dir: Path, dest: Path, seed: int) -> Path:
    """The trained weights in the M3 layout (bf16, router fp32) beside the initial config and tokenizer."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in init_dir.iterdir():
        if f.is_file() and f.name not in WEIGHT_FILES:
            shutil.copy2(f, dest / f.name)
    weights = {name: t.detach().cpu().to(torch.float32 if ".moe.router." in name else torch.bfloat16)
               for name, t in w.items()}
    write_safetensors(file_tensors(weights, cfg, Layout.M3, seed), dest, 1)
    return dest


def run(dest: Path, plan: TrainPlan, device: str) -> dict:
    start = time.time()
    init = write_tiny_checkpoint(dest / "init", seed=plan.seed)
    data = write_task_set(dest / "data", seed=plan.seed, sizes=plan.sizes)
    cfg, w, losses = train(init, data, plan, device)
    ckpt = save_checkpoint(cfg, w, init, dest / "ckpt", plan.seed)
    report = {"plan": asdict(plan), "device": device, "steps_run": len(losses),
              "losses_first_last": [losses[0], sum(losses[-50:]) / len(losses[-50:])],
              "wall_s": time.time() - start, "checkpoint": str(ckpt), "data": str(data)}
    (dest / "train_report.json").write_text(json.dumps(report, indent=2, default=str))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--time-budget-s", type=float, default=0.0)
    ap.add_argument("--cpu-smoke", action="store_true", help="3 steps of batch 4 on a tiny task set")
    args = ap.parse_args(argv)
    plan = CPU_SMOKE if args.cpu_smoke else TrainPlan()
    plan = TrainPlan(**{**asdict(plan), "seed": args.seed, "sizes": plan.sizes,
                        "time_budget_s": args.time_budget_s,
                        **({"steps": args.steps} if args.steps else {}),
                        **({"batch_size": args.batch_size} if args.batch_size else {}),
                        **({"lr": args.lr} if args.lr else {})})
    print(json.dumps(run(args.dest, plan, args.device), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
