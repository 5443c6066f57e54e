"""The pieces wired the way the engine should wire them: greedy speculative decoding with the tiny
MiniMax-M3 target and a random Eagle3 draft emits exactly the target's own greedy tokens.

The loop here is a test fixture, not the engine; it pins the contract (positions, feature shift,
KV rollback by lengths) the engine's speculative step follows:
- target KV holds positions [0, L); token ids[L] is emitted but not yet in the KV;
- draft "extend": tokens ids[L_prev + 1 .. L] at positions [L_prev, L) with the target features
  captured at those positions (draft position p pairs token p + 1 with the target's feature at p);
- draft chain step i = 1..K-1: token d_i at position L - 1 + i with the previous step's feature;
- verify: [ids[L], d_1..d_K] at positions [L, L + K]; a accepted -> L += a + 1 (rollback: the
  stale K/V beyond the new length are simply overwritten later, in both caches).
"""

from __future__ import annotations

import torch

from m3bench.runtime.attention.metadata import build_attn_metadata
from m3bench.runtime.config import ModelConfig
from m3bench.runtime.kv_cache import KVCache, KVDtype
from m3bench.runtime.model import CaptureSpec, M3ForCausalLM
from m3bench.runtime.speculative.attention import DraftKV
from m3bench.runtime.speculative.config import default_capture_layers
from m3bench.runtime.speculative.draft import Eagle3Draft
from m3bench.runtime.speculative.stats import AcceptanceRecord, compute_spec_stats
from m3bench.runtime.speculative.tiny_draft import tiny_draft_config
from m3bench.runtime.speculative.verify import verify_greedy

F64 = torch.float64
P_TARGET, P_DRAFT, K = 16, 32, 3
TINY_M3 = dict(
    model_type="minimax_m3", architectures=["MiniMaxM3SparseForCausalLM"], hidden_size=32, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, rotary_dim=4, rope_theta=10000.0, vocab_size=64,
    rms_norm_eps=1e-6, hidden_act="swigluoai", dense_intermediate_size=48, num_local_experts=4,
    num_experts_per_tok=2, intermediate_size=16, shared_intermediate_size=16, routed_scaling_factor=2.0,
    moe_layer_freq=[0, 1, 1, 1], max_position_embeddings=4096,
    sparse_attention_config=dict(sparse_attention_freq=[0, 1, 1, 1], sparse_num_index_heads=2, sparse_index_dim=8,
                                 sparse_block_size=16, sparse_topk_blocks=2, sparse_init_block=0,
                                 sparse_local_block=1),
)


class Fixture:
    def __init__(self, seed: int = 0):
        self.cfg = ModelConfig.from_dict(TINY_M3)
        self.target = M3ForCausalLM(self.cfg, F64)
        self.target.init_dummy(seed)
        dcfg = tiny_draft_config(self.cfg)
        self.draft = Eagle3Draft(dcfg, F64)
        self.draft.init_dummy(seed + 1)
        self.draft.bind_target(self.target.embed_tokens, self.target.lm_head_weight())
        self.layers = default_capture_layers(self.cfg.num_layers)

    def caches(self, batch: int):
        kv = KVCache(self.cfg, 4 * batch, P_TARGET, KVDtype.AUTO, F64)
        dc = self.draft.cfg
        return kv, DraftKV(2 * batch, P_DRAFT, dc.num_kv_heads, dc.head_dim, KVDtype.AUTO, F64)

    def target_step(self, kv, chunks: list[list[int]], starts: list[int]):
        """Per request: logits [q, V] and captured features [q, 3, H] of its chunk."""
        meta = build_attn_metadata([len(c) for c in chunks], [s + len(c) for s, c in zip(starts, chunks)],
                                   [list(range(4 * b, 4 * b + 4)) for b in range(len(chunks))], P_TARGET)
        ids = torch.tensor([t for c in chunks for t in c])
        buf = torch.zeros(len(ids), len(self.layers), self.cfg.hidden_size, dtype=F64)
        hidden = self.target(ids, meta.positions, meta, kv, CaptureSpec(self.layers, buf))
        logits = self.target.compute_logits(hidden)
        return _split(logits, chunks), _split(buf, chunks)

    def draft_step(self, dkv, chunks: list[list[int]], starts: list[int], feats: torch.Tensor):
        """Draft over flattened chunks; per request the next draft token, logits and feature of its last row."""
        meta = build_attn_metadata([len(c) for c in chunks], [s + len(c) for s, c in zip(starts, chunks)],
                                   [[2 * b, 2 * b + 1] for b in range(len(chunks))], P_DRAFT)
        out = self.draft(torch.tensor([t for c in chunks for t in c]), meta.positions, feats, meta, dkv)
        last = meta.query_start_loc[1:].long() - 1
        logits = self.draft.compute_logits(out.hidden[last])
        return self.draft.to_target_ids(logits.argmax(-1)).tolist(), logits, out.feature[last]


def _split(x: torch.Tensor, chunks: list[list[int]]) -> list[torch.Tensor]:
    return list(x.split([len(c) for c in chunks]))


def greedy_reference(fx: Fixture, prompts: list[list[int]], n_new: int) -> list[list[int]]:
    kv, _ = fx.caches(len(prompts))
    ids = [list(p) for p in prompts]
    logits, _ = fx.target_step(kv, ids, [0] * len(ids))
    for _ in range(n_new):
        for seq, lg in zip(ids, logits):
            seq.append(int(lg[-1].argmax()))
        logits, _ = fx.target_step(kv, [[s[-1]] for s in ids], [len(s) - 1 for s in ids])
    return ids


def speculative(fx: Fixture, prompts: list[list[int]], n_new: int, oracle: list[list[int]] | None = None):
    """Greedy speculative decoding. With `oracle` (the target's greedy continuation), step i proposes
    m = i mod (K + 1) right tokens then wrong ones, so every acceptance count 0..K occurs."""
    kv, dkv = fx.caches(len(prompts))
    ids = [list(p) for p in prompts]
    logits, caps = fx.target_step(kv, ids, [0] * len(ids))
    for seq, lg in zip(ids, logits):
        seq.append(int(lg[-1].argmax()))
    lens = [len(p) for p in prompts]  # target KV valid length L per request
    ext = ([s[1:] for s in ids], [0] * len(ids), torch.cat(caps))  # draft extend: tokens, start, raw features
    records, log, step = [AcceptanceRecord() for _ in prompts], [], 0
    while min(len(s) - len(p) for s, p in zip(ids, prompts)) < n_new:
        drafts, first = _propose(fx, dkv, ext, lens)
        log += [(list(s[:L + 1]), first[b]) for b, (s, L) in enumerate(zip(ids, lens))]
        if oracle is not None:
            drafts = [_planted(oracle[b], L, step % (K + 1)) for b, L in enumerate(lens)]
        chunks = [[s[L]] + d for s, L, d in zip(ids, lens, drafts)]
        logits, caps = fx.target_step(kv, chunks, lens)
        res = verify_greedy(torch.stack(logits), torch.tensor(drafts), torch.full((len(ids),), K))
        starts, ext_tokens, ext_feats = list(lens), [], []
        for b, (seq, rec) in enumerate(zip(ids, records)):
            a = int(res.num_accepted[b])
            rec.add(proposed=K, accepted=a)
            seq.extend(res.output_tokens[b, :a + 1].tolist())
            ext_tokens.append(seq[lens[b] + 1:lens[b] + a + 2])
            ext_feats.append(caps[b][:a + 1])
            lens[b] += a + 1  # rollback by length: positions beyond are stale and get overwritten
        ext = (ext_tokens, starts, torch.cat(ext_feats))
        step += 1
    return [s[:len(p) + n_new] for s, p in zip(ids, prompts)], records, log


def _planted(seq: list[int], L: int, m: int) -> list[int]:
    """Drafts for positions L+1..L+K: the right tokens for the first m, then wrong ones."""
    return [seq[L + j] if j <= m else (seq[L + j] + 1) % 64 for j in range(1, K + 1)]


def _propose(fx: Fixture, dkv, ext, lens: list[int]):
    """Extend the draft with the newly verified tokens, then chain K - 1 steps; also the first logits."""
    tokens, starts, raw = ext
    d, first, feat = fx.draft_step(dkv, tokens, starts, fx.draft.combine_features(raw))
    drafts = [[t] for t in d]
    for i in range(1, K):
        d, _, feat = fx.draft_step(dkv, [[x[-1]] for x in drafts], [L - 1 + i for L in lens], feat)
        drafts = [x + [t] for x, t in zip(drafts, d)]
    return drafts, first


def fresh_first_logits(fx: Fixture, prefix: list[int]) -> torch.Tensor:
    """The draft's first-position logits recomputed from scratch (no cache reuse, no rollback)."""
    kv, dkv = fx.caches(1)
    _, caps = fx.target_step(kv, [prefix[:-1]], [0])
    _, logits, _ = fx.draft_step(dkv, [prefix[1:]], [0], fx.draft.combine_features(caps[0]))
    return logits[0]


def test_greedy_speculative_equals_target_greedy():
    fx = Fixture(0)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (21, 9)]
    n_new = 20  # prompt 21 + 20 > 2 MSA blocks of 16: sparse selection is active in the verify chunks
    want = greedy_reference(fx, prompts, n_new)
    got, records, _ = speculative(fx, prompts, n_new)
    assert got == want
    stats = compute_spec_stats(records, max_draft_len=K)
    assert stats.drafts == stats.verify_steps > 0 and 1.0 <= stats.acceptance_length <= 1 + K


def test_planted_acceptance_rolls_both_caches_back():
    """Every acceptance count 0..K occurs; outputs stay the target's, and the draft's cached state
    after each rollback equals a from-scratch recompute of the same prefix."""
    fx = Fixture(2)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (13, 6)]
    n_new = 24
    oracle = greedy_reference(fx, prompts, n_new + 2 * K)
    got, records, log = speculative(fx, prompts, n_new, oracle=oracle)
    assert got == [o[:len(p) + n_new] for o, p in zip(oracle, prompts)]
    s = compute_spec_stats(records, max_draft_len=K)
    assert all(h > 0 for h in s.histogram)
    for prefix, first in log[::3]:
        assert float((first - fresh_first_logits(fx, prefix)).abs().max()) < 1e-9
