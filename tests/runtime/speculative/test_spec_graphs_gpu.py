"""CUDA graphs of the speculative decode step (speculative/graphs.py) on a CUDA device, Triton attention and
the fused MoE: graph replay equals the eager path token for token, for both draft-KV layouts, K = 1 and 3,
batch 1 and 5 (padded to 8, and shrinking as requests finish), greedy and seeded sampling, synthetic
acceptance; and the replay counters show the graphs ran. A tiny M3 with page == MSA block == 16 (prompts
past 2 blocks: top-2 selection active), fp32 so that padded vs unpadded GEMM shapes cannot flip a token."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine_spec_helpers import LLM, SamplingParams, random_prompts

from m3bench.runtime.attention.triton_backend import TritonBackend
from m3bench.runtime.config import ModelConfig
from m3bench.runtime.errors import ConfigError
from m3bench.runtime.model import M3ForCausalLM
from m3bench.runtime.speculative.draft import DraftOutput, Eagle3Draft
from m3bench.runtime.speculative.tiny_draft import tiny_draft_config
from m3bench.runtime.tiny import TinySpec, m3_text_config

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SPEC = TinySpec(vocab_size=512, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                rotary_dim=16, dense_intermediate_size=256, num_experts=4, top_k=2, intermediate_size=64,
                shared_intermediate_size=64, index_dim=32, block_size=16, topk_blocks=2,
                max_position_embeddings=1024)
N_NEW = 16


@pytest.fixture(scope="module")
def model():
    m = M3ForCausalLM(ModelConfig.from_dict(m3_text_config(SPEC, 0, SPEC.vocab_size - 1)), torch.float32, "cuda",
                      backend=TritonBackend())
    m.init_dummy(0)
    return m


class TableDraft(Eagle3Draft):
    """A graph-safe oracle: the real Eagle3 forward (draft KV, features, layouts), then logits one-hot at
    next[p, token p + 1] (a reference continuation's token p + 2, looked up on the device); every
    position p % 3 == 0 proposes a wrong token, so acceptance varies and rollbacks happen."""

    def __init__(self, model, sequences: list[list[int]]):
        super().__init__(tiny_draft_config(model.cfg), model.dtype, model.device, backend=model.backend)
        self.init_dummy(1)
        self.vocab = model.cfg.vocab_size
        self.next = torch.zeros(model.cfg.max_position_embeddings, self.vocab, dtype=torch.int64, device=model.device)
        for seq in sequences:
            t = torch.tensor(seq, device=model.device)
            self.next[torch.arange(len(seq) - 2, device=model.device), t[1:-1]] = t[2:]

    def forward(self, input_ids, positions, feature, meta, kv) -> DraftOutput:
        out = super().forward(input_ids, positions, feature, meta, kv)
        want = self.next[positions, input_ids]
        pick = torch.where(positions % 3 == 0, (want + 1) % self.vocab, want)
        hidden = torch.zeros(pick.shape[0], self.vocab, device=pick.device).scatter_(1, pick[:, None], 10.0)
        return DraftOutput(hidden=hidden, feature=out.feature)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.float()


def _oracle(model, batch: int) -> TableDraft:
    ref = LLM(model, **_args()).generate(_prompts(batch), SamplingParams(max_tokens=N_NEW + 8, ignore_eos=True))
    return TableDraft(model, [p + o.token_ids for p, o in zip(_prompts(batch), ref)])


def _draft(model, seed: int = 1) -> Eagle3Draft:
    d = Eagle3Draft(tiny_draft_config(model.cfg), model.dtype, model.device, backend=model.backend)
    d.init_dummy(seed)
    return d


def _args(**over):
    return {**dict(tokens_per_block=16, num_kv_blocks=64, max_batch_size=8, max_num_tokens=512,
                   kv_cache_dtype="bf16"), **over}


def _prompts(batch: int, seed: int = 0):
    return random_prompts(batch, [70, 9, 45, 33, 58], seed=seed, vocab=SPEC.vocab_size - 2)


def _params(batch: int, sampled: bool):
    lengths = [N_NEW, N_NEW - 5, N_NEW, N_NEW - 9, N_NEW - 2]  # the batch shrinks: padding rows change
    if not sampled:
        return [SamplingParams(max_tokens=lengths[i], ignore_eos=True) for i in range(batch)]
    out = [SamplingParams(max_tokens=lengths[i], temperature=0.9, seed=i, ignore_eos=True) for i in range(batch)]
    if batch > 1:
        out[1] = dataclasses.replace(out[1], temperature=0.0)  # a greedy row inside a sampled chain
        out[3] = dataclasses.replace(out[3], seed=None)  # unseeded rows draw from the shared generator
        out[4] = dataclasses.replace(out[4], seed=None)
    return out


def _run(model, layout, k, batch, sampled, graphs, draft):
    llm = LLM(model, speculative_model=draft, draft_len=k, draft_kv=layout, cuda_graphs=graphs, **_args())
    outs = [o.token_ids for o in llm.generate(_prompts(batch), _params(batch, sampled))]
    return outs, llm


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("layout", ["separate", "shared"])
def test_graph_replay_equals_eager(model, layout, k, batch, sampled):
    draft = _oracle(model, batch)
    eager, e_llm = _run(model, layout, k, batch, sampled, False, draft)
    graph, g_llm = _run(model, layout, k, batch, sampled, True, draft)
    assert graph == eager
    accepted = e_llm.spec_stats().accepted
    assert g_llm.spec_stats().accepted == accepted
    assert accepted > 0 or sampled  # (sampled rows leave the greedy oracle's path)
    replays = g_llm.engine.spec.graphs.replays
    assert replays["verify"] > 0
    # overlap (CUDA's default): pure-verify steps draft in the early graph, before landing (greedy or sampled)
    assert replays["early"] > 0 and replays["early"] == g_llm.engine.spec.early_steps
    assert (replays["sampled"] > 0) == sampled  # rejection sampling in its graph


def test_graph_replay_with_synthetic_acceptance(model):
    runs = []
    for graphs in (False, True):
        llm = LLM(model, speculative_model=_draft(model), draft_len=3, draft_kv="shared", cuda_graphs=graphs,
                  synthetic_acceptance_length=2.5, **_args())
        outs = [o.token_ids for o in llm.generate(_prompts(5), _params(5, False))]
        runs.append((outs, llm.spec_stats().accepted))
    assert runs[0] == runs[1]
    assert llm.engine.spec.graphs.replays["verify"] > 0


def test_replays_count_every_pure_decode_step(model):
    """Once every request decodes (one prompt, prefilled in one step), each further step replays the verify
    graph and a draft graph (the early one under overlap, CUDA's default; else the chain)."""
    llm = LLM(model, speculative_model=_draft(model), draft_len=3, draft_kv="shared", cuda_graphs=True, **_args())
    llm.generate(_prompts(1), SamplingParams(max_tokens=N_NEW, ignore_eos=True))
    s, r = llm.spec_stats(), llm.engine.spec.graphs.replays
    assert r["verify"] == s.verify_steps  # (the one request's verify steps: all pure-decode)
    assert r["chain"] + r["early"] >= r["verify"] - 1 and r["early"] > 0


def test_graphs_refuse_a_draft_on_the_torch_backend(model):
    d = Eagle3Draft(tiny_draft_config(model.cfg), model.dtype, model.device)  # TorchBackend: not graph safe
    d.init_dummy(1)
    with pytest.raises(ConfigError, match="graph-safe"):
        LLM(model, speculative_model=d, draft_len=3, cuda_graphs=True, **_args())
