"""Distil an Eagle3 draft from its target: the target's greedy continuations teach the draft to predict them.

    cfg = tiny_draft_config(target.cfg)
    weights = distill_draft(target, cfg, prompts, DistillConfig(steps=200))     # canonical name -> tensor

For the tiny checkpoints (a random target accepts nothing from a random draft, so a golden acceptance
figure would gate nothing); not a recipe for real drafts. The training forward (`draft_forward`) is the
inference draft of `draft.py` written over whole sequences, with "training-time test" unrolling: step 0 at
position p reads token x[p+1] and the target's features at p (the extend); step k >= 1 reads x[p+1+k] and
step k-1's output feature (the chain), attends step 0's keys at positions <= p and its own chain's keys at
p+1..p+k, as the runtime's chain does, and predicts x[p+2+k]. tests check it equals the inference draft.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F

from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.config import NormKind
from m3bench.runtime.kv_cache import KVCache, KVDtype
from m3bench.runtime.layers.norm import rms_norm
from m3bench.runtime.layers.rotary import RotaryEmbedding, apply_rope
from m3bench.runtime.model import CaptureSpec
from m3bench.runtime.speculative.config import EagleConfig
from m3bench.runtime.speculative.tiny_draft import random_draft_tensors

L = "layers.0."


@dataclass(frozen=True)
class DistillConfig:
    steps: int = 200  # optimizer steps
    batch_size: int = 8  # sequences per step
    unroll: int = 3  # draft steps trained per position (the draft_len it is meant for)
    lr: float = 3e-3
    seed: int = 0


IGNORE = -100  # label of prompt and padding positions


@dataclass(frozen=True)
class Features:
    """Training sequences, right-padded, on the model's device: ids [N, T] (pads 0), labels [N, T] (the
    target's own tokens; IGNORE over prompts and pads), the capture-layer residuals [N, T, n, Ht] fp32 and,
    optionally, the target's logits [N, T, V] bf16 (row j predicts token j + 1) for soft labels."""

    ids: torch.Tensor
    labels: torch.Tensor
    feats: torch.Tensor
    teacher: torch.Tensor | None = None


@torch.no_grad()
def capture_features(model, sequences: list[list[int]], layers: tuple[int, ...], prompt_lens: list[int],
                     teacher: bool = False) -> Features:
    """One prefill per sequence with the residuals at the input of `layers` captured."""
    n_max, dev = max(len(s) for s in sequences), model.device
    page = model.cfg.msa.block_size if model.cfg.msa is not None else 16  # the Triton MSA kernels' page
    pages = -(-n_max // page)
    ids = torch.zeros(len(sequences), n_max, dtype=torch.int64, device=dev)
    labels = torch.full((len(sequences), n_max), IGNORE, dtype=torch.int64, device=dev)
    feats = torch.zeros(len(sequences), n_max, len(layers), model.cfg.hidden_size, dtype=torch.float32, device=dev)
    logits = (torch.zeros(len(sequences), n_max, model.cfg.vocab_size, dtype=torch.bfloat16, device=dev)
              if teacher else None)
    kv = KVCache(model.cfg, pages, page, KVDtype.AUTO, model.dtype, dev, model.tp)
    buf = torch.zeros(n_max, len(layers), model.cfg.hidden_size, dtype=model.dtype, device=dev)
    for i, seq in enumerate(sequences):
        n = len(seq)
        meta = build_attn_metadata([n], [n], [list(range(pages))], page, dev)
        row = torch.tensor(seq, dtype=torch.int64, device=dev)
        hidden = model(row, meta.positions, meta, kv, CaptureSpec(layers, buf))
        ids[i, :n] = labels[i, :n] = row
        labels[i, :prompt_lens[i]] = IGNORE
        feats[i, :n] = buf[:n].float()
        if logits is not None:
            logits[i, :n] = model.compute_logits(hidden).to(torch.bfloat16)
    return Features(ids, labels, feats, logits)


def _norm(x: torch.Tensor, w: torch.Tensor, cfg: EagleConfig) -> torch.Tensor:
    return rms_norm(x, w, cfg.rms_norm_eps, NormKind.PLAIN)


def _heads(x: torch.Tensor, d: int) -> torch.Tensor:
    return x.unflatten(-1, (-1, d))  # [..., heads * d] -> [..., heads, d]


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, P, heads, d], cos/sin [B, P, d / 2]."""
    return apply_rope(x.flatten(0, 1), cos.flatten(0, 1), sin.flatten(0, 1)).view_as(x)


def draft_forward(w: Mapping[str, torch.Tensor], cfg: EagleConfig, embed: torch.Tensor, lm_head: torch.Tensor,
                  ids: torch.Tensor, feats: torch.Tensor, unroll: int) -> list[torch.Tensor]:
    """ids [B, T], feats [B, T, n, Ht] -> per step k < unroll the logits [B, T-2-k, V] at positions p + k
    (p = 0 .. T-3-k), predicting ids[:, p+2+k]. Differentiable in `w`."""
    b, t = ids.shape
    rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, None, ids.device)
    x = feats
    if cfg.fc_norm:
        x = torch.stack([_norm(x[:, :, i], w[f"fc_norm.{i}.weight"], cfg) for i in range(x.shape[2])], dim=2)
    feature = x.flatten(2) @ w["fc.weight"].T  # [B, T, H]
    keys0 = vals0 = None
    chain_k: list[torch.Tensor] = []
    chain_v: list[torch.Tensor] = []
    logits = []
    for k in range(unroll):
        n = t - 2 - k  # query indices p = 0 .. n-1
        if n <= 0:
            break
        tok = ids[:, 1 + k:1 + k + n]
        pos = torch.arange(k, k + n, device=ids.device).expand(b, n)
        cos, sin = rope.cos_sin(pos.flatten())
        cos, sin = cos.view(b, n, -1), sin.view(b, n, -1)
        h = torch.cat((_norm(embed[tok], w[f"{L}input_layernorm.weight"], cfg),
                       _norm(feature[:, :n], w[f"{L}hidden_norm.weight"], cfg)), dim=-1)
        q = _rope(_heads(h @ w[f"{L}self_attn.q_proj.weight"].T, cfg.head_dim), cos, sin)
        kk = _rope(_heads(h @ w[f"{L}self_attn.k_proj.weight"].T, cfg.head_dim), cos, sin)
        vv = _heads(h @ w[f"{L}self_attn.v_proj.weight"].T, cfg.head_dim)
        if k == 0:
            keys0, vals0 = kk, vv
        else:
            chain_k, chain_v = [c[:, :n] for c in chain_k] + [kk], [c[:, :n] for c in chain_v] + [vv]
        o = _attend(q, keys0, vals0, chain_k if k else [], chain_v if k else [], cfg)
        r = feature[:, :n] + o.flatten(2) @ w[f"{L}self_attn.o_proj.weight"].T
        m = _norm(r, w[f"{L}post_attention_layernorm.weight"], cfg)
        s = r + (F.silu(m @ w[f"{L}mlp.gate_proj.weight"].T) * (m @ w[f"{L}mlp.up_proj.weight"].T)) \
            @ w[f"{L}mlp.down_proj.weight"].T
        hidden = _norm(s, w["norm.weight"], cfg)
        logits.append(hidden @ lm_head.T)
        feature = hidden if cfg.norm_output else s  # query p of step k+1 reads this row p
    return logits


def _attend(q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, ck: list[torch.Tensor], cv: list[torch.Tensor],
            cfg: EagleConfig) -> torch.Tensor:
    """q [B, n, Hq, d]: query p sees k0 rows 0..p (causal) and row p of each chain step's keys."""
    b, n, hq, d = q.shape
    group = hq // cfg.num_kv_heads
    rep = (lambda x: x.repeat_interleave(group, dim=2))
    s0 = torch.einsum("bphd,bjhd->bhpj", q, rep(k0)) * d ** -0.5  # [B, Hq, n, T0]
    causal = torch.arange(k0.shape[1], device=q.device)[None, :] <= torch.arange(n, device=q.device)[:, None]
    s0 = s0.masked_fill(~causal, float("-inf"))
    sc = [torch.einsum("bphd,bphd->bhp", q, rep(c))[..., None] * d ** -0.5 for c in ck]  # [B, Hq, n, 1] each
    p = torch.softmax(torch.cat([s0, *sc], dim=-1), dim=-1)
    out = torch.einsum("bhpj,bjhd->bphd", p[..., :k0.shape[1]], rep(v0))
    for i, c in enumerate(cv):
        out = out + p[..., k0.shape[1] + i].permute(0, 2, 1)[..., None] * rep(c)
    return out


def distill_draft(data: Features, cfg: EagleConfig, embed: torch.Tensor, lm_head: torch.Tensor,
                  opts: DistillConfig = DistillConfig()) -> dict[str, torch.Tensor]:
    """Train the draft's own tensors (fp32, from `random_draft_tensors(cfg, seed)`) on `data`; the target's
    embedding and lm_head stay frozen and are not returned (the draft shares them)."""
    dev = data.ids.device
    init = random_draft_tensors(cfg, opts.seed, torch.float32, with_lm_head=False)
    w = {k: v.to(dev).requires_grad_(True) for k, v in init.items()}
    optim = torch.optim.AdamW(list(w.values()), lr=opts.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, max(1, opts.steps))
    g = torch.Generator().manual_seed(opts.seed)
    embed, lm_head = embed.float(), lm_head.float()
    for _ in range(opts.steps):
        pick = torch.randint(0, data.ids.shape[0], (min(opts.batch_size, data.ids.shape[0]),), generator=g).to(dev)
        steps = draft_forward(w, cfg, embed, lm_head, data.ids[pick], data.feats[pick], opts.unroll)
        loss = sum(step_loss(lg, data, pick, k) for k, lg in enumerate(steps)) / len(steps)
        optim.zero_grad()
        loss.backward()
        optim.step()
        sched.step()
    return {k: v.detach().cpu() for k, v in w.items()}


def step_loss(logits: torch.Tensor, data: Features, pick: torch.Tensor, k: int) -> torch.Tensor:
    """Cross-entropy of unrolled step k's logits [B, n, V] against the target's token (or its distribution)
    at each labelled position."""
    n = logits.shape[1]
    labels = data.labels[pick, 2 + k:2 + k + n]
    keep = labels != IGNORE
    if data.teacher is None:
        return F.cross_entropy(logits[keep], labels[keep])
    target = torch.softmax(data.teacher[pick, 1 + k:1 + k + n][keep].float(), dim=-1)
    return -(target * torch.log_softmax(logits[keep], dim=-1)).sum(-1).mean()


@torch.no_grad()
def draft_accuracy(w: Mapping[str, torch.Tensor], cfg: EagleConfig, embed: torch.Tensor, lm_head: torch.Tensor,
                   data: Features, unroll: int) -> list[float]:
    """Per unrolled step, the share of positions whose argmax equals the target's token (teacher-forced)."""
    dev = data.ids.device
    w = {k: v.to(dev) for k, v in w.items()}
    steps = draft_forward(w, cfg, embed.float(), lm_head.float(), data.ids, data.feats, unroll)
    out = []
    for k, lg in enumerate(steps):
        want = data.labels[:, 2 + k:2 + k + lg.shape[1]]
        out.append((lg.argmax(-1) == want)[want != IGNORE].float().mean().item())
    return out


# ---- a distilled draft for a tiny checkpoint ------------------------------------------------------


@dataclass(frozen=True)
class TinyDistill:
    """How `distill_tiny_draft` builds its data: chat prompts from the tiny corpus, greedy continuations."""

    num_prompts: int = 1024
    new_tokens: int = 96
    soft_labels: bool = True
    train: DistillConfig = DistillConfig(steps=2000, batch_size=64)


def chat_prompts(llm, n: int, seed: int, texts: Sequence[str] | None = None) -> list[list[int]]:
    """n chat prompts (the target's template) whose user turns are drawn from `texts` (default: lines of
    the tiny training corpus); without replacement while texts last."""
    import random

    from m3bench.runtime.tiny import training_corpus

    pool, rnd = list(texts or training_corpus()), random.Random(seed)
    picks = rnd.sample(pool, n) if n <= len(pool) else [rnd.choice(pool) for _ in range(n)]
    return [llm.apply_chat_template([{"role": "user", "content": t}]) for t in picks]


def distill_tiny_draft(target_dir, dest, plan: TinyDistill = TinyDistill(), device: str = "cpu",
                       texts: Sequence[str] | None = None) -> dict:
    """Distil and write (bf16) an Eagle3 draft for the checkpoint at `target_dir` on its continuations of
    chat prompts made from `texts`; returns the teacher-forced accuracy per unrolled step on that data."""
    from m3bench.runtime.engine_config import DType, EngineConfig
    from m3bench.runtime.llm import LLM, SamplingParams
    from m3bench.runtime.speculative.tiny_draft import tiny_draft_config, write_draft_dir

    llm = LLM.from_config(EngineConfig(Path(target_dir), device=device, dtype=DType.FLOAT32, max_batch_size=256,
                                       num_kv_blocks=256 * 4, cuda_graphs=False, async_scheduling=False))
    cfg = tiny_draft_config(llm.config)
    prompts = chat_prompts(llm, plan.num_prompts, plan.train.seed, texts)
    outs = llm.generate(prompts, SamplingParams(max_tokens=plan.new_tokens, ignore_eos=True))
    data = capture_features(llm.model, [p + o.token_ids for p, o in zip(prompts, outs)], cfg.aux_layer_ids,
                            [len(p) for p in prompts], teacher=plan.soft_labels)
    embed, head = llm.model.embed_tokens, llm.model.lm_head_weight()
    w = distill_draft(data, cfg, embed, head, plan.train)
    write_draft_dir(dest, cfg, w, torch.bfloat16)
    return {"train_accuracy": draft_accuracy(w, cfg, embed, head, data, plan.train.unroll),
            "sequences": len(prompts), "labelled_positions": int((data.labels != IGNORE).sum())}
