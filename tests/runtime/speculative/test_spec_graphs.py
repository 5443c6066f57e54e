"""The static-buffer logic of the speculative CUDA graphs (speculative/graphs.py), on the CPU: nothing is
captured there, the captured functions run on the static buffers (padding rows, scratch pages, the
copied block tables, pre-drawn chain noise). Outputs must equal the eager path's token for token, for
both draft-KV layouts, K = 1 and 3, batch 1 and 5 (padded to 8), greedy and seeded sampling, and
synthetic acceptance; the replay counters show the static path ran. (CUDA: test_spec_graphs_gpu.py.)"""

from __future__ import annotations

import pytest
import m3bench.runtime.engine_builder as engine_builder
import m3bench.runtime.engine_config as engine_config
from engine_spec_helpers import LLM, OracleDraft, SamplingParams, llm_args, random_draft, random_prompts, small_model
from m3bench.runtime.errors import InputError

N_NEW = 10


@pytest.fixture(scope="module")
def model():
    return small_model(0)


@pytest.fixture
def cpu_graphs(monkeypatch):
    """LLM(cuda_graphs=True) on the CPU (the CUDA-device and graph-safe backend checks are what is lifted)."""
    monkeypatch.setattr(engine_config, "check_modes", lambda cfg: None)
    monkeypatch.setattr(engine_builder, "check_graphs", lambda *a: None)


def _run(model, prompts, draft, layout, k, graphs, params, **over):
    llm = LLM(model, speculative_model=draft, draft_len=k, draft_kv=layout, cuda_graphs=graphs,
              **llm_args(**over))
    outs = [o.token_ids for o in llm.generate(prompts, params)]
    return outs, llm


def _replays(llm) -> dict[str, int]:
    return llm.engine.spec.graphs.replays


def _oracle(model, prompts, wrong_every=3):
    ref = LLM(model, **llm_args()).generate(prompts, SamplingParams(max_tokens=N_NEW + 8, ignore_eos=True))
    return OracleDraft(model, [p + o.token_ids for p, o in zip(prompts, ref)], wrong_every=wrong_every)


@pytest.mark.parametrize("layout", ["separate", "shared"])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("batch", [1, 5])
def test_greedy_static_equals_eager(model, cpu_graphs, layout, k, batch):
    prompts = random_prompts(batch, [37, 9, 50, 21, 33], seed=batch)
    draft = _oracle(model, prompts)
    params = SamplingParams(max_tokens=N_NEW, ignore_eos=True)
    eager, e_llm = _run(model, prompts, draft, layout, k, False, params)
    static, s_llm = _run(model, prompts, draft, layout, k, True, params)
    assert static == eager
    assert s_llm.spec_stats().accepted == e_llm.spec_stats().accepted > 0
    assert _replays(s_llm)["verify"] > 0
    assert (_replays(s_llm)["chain"] > 0) == (k > 1)
    assert e_llm.engine.spec.graphs is None


def test_greedy_verification_comes_from_the_graph(model, cpu_graphs, monkeypatch):
    """Replayed steps take the verify graph's own greedy result: verify_greedy runs eagerly only on the
    steps that were not replayed (and the tokens are those of the eager run, as above)."""
    import m3bench.runtime.speculative.runner as runner_module

    calls = {"eager": 0, "verify": 0}
    eager_fn = runner_module.verify_greedy

    def counting(*a):
        calls["eager"] += 1
        return eager_fn(*a)

    monkeypatch.setattr(runner_module, "verify_greedy", counting)
    prompts = random_prompts(3, [37, 9, 50], seed=7)
    llm = LLM(model, speculative_model=_oracle(model, prompts), draft_len=3, draft_kv="shared", cuda_graphs=True,
              **llm_args(max_num_tokens=40))
    verify = llm.engine.spec.verify

    def counted(*a):
        calls["verify"] += 1
        return verify(*a)

    llm.engine.spec.verify = counted
    llm.generate(prompts, SamplingParams(max_tokens=N_NEW, ignore_eos=True))
    replays = _replays(llm)["verify"]
    assert replays > 0 and calls["eager"] > 0  # (chunked prefills: some verify steps ran eagerly)
    assert calls["eager"] + replays == calls["verify"]


@pytest.mark.parametrize("layout", ["separate", "shared"])
@pytest.mark.parametrize("batch", [1, 5])
def test_seeded_sampling_static_equals_eager(model, cpu_graphs, layout, batch):
    prompts = random_prompts(batch, [30, 12, 44, 25, 18], seed=10 + batch)
    params = [SamplingParams(max_tokens=N_NEW, temperature=0.9, seed=i, ignore_eos=True) for i in range(batch)]
    if batch > 1:
        params[1] = SamplingParams(max_tokens=N_NEW, ignore_eos=True)  # a greedy row inside a sampled chain
        params[3] = SamplingParams(max_tokens=N_NEW, temperature=0.7, ignore_eos=True)  # unseeded: the
        params[4] = SamplingParams(max_tokens=N_NEW, temperature=1.1, ignore_eos=True)  # shared generator
    eager, _ = _run(model, prompts, random_draft(model), layout, 3, False, params)
    static, s_llm = _run(model, prompts, random_draft(model), layout, 3, True, params)
    assert static == eager
    assert _replays(s_llm)["verify"] > 0 and _replays(s_llm)["chain"] > 0


def test_synthetic_acceptance_static_equals_eager(model, cpu_graphs):
    prompts = random_prompts(5, [30, 12, 44, 25, 18], seed=3)
    params = SamplingParams(max_tokens=N_NEW, ignore_eos=True)
    runs = []
    for graphs in (False, True):
        llm = LLM(model, speculative_model=random_draft(model), draft_len=3, draft_kv="shared", cuda_graphs=graphs,
                  synthetic_acceptance_length=2.5, **llm_args())
        runs.append(([o.token_ids for o in llm.generate(prompts, params)], llm.spec_stats().accepted))
    assert runs[0] == runs[1]
    assert _replays(llm)["verify"] > 0


def test_scratch_pages_stay_unowned(model, cpu_graphs):
    """The verify graph's scratch page (the target pool's last) and the separate draft pool's last page."""
    prompts = random_prompts(5, [30, 12, 44, 25, 18], seed=4)
    llm = LLM(model, speculative_model=random_draft(model), draft_len=3, draft_kv="separate", cuda_graphs=True,
              **llm_args())
    spec = llm.engine.spec
    assert spec.graphs.scratch_page == llm.engine.scheduler.bm.num_blocks
    assert spec.graphs.draft_scratch_page == spec.layout.store.num_pages - 1
    assert spec.graphs.draft_scratch_page not in spec.layout.free
    llm.generate(prompts, SamplingParams(max_tokens=N_NEW, ignore_eos=True))
    assert spec.graphs.draft_scratch_page not in spec.layout.free
    assert len(spec.layout.free) == spec.layout.store.num_pages - 1  # every request's pages came back


def test_cuda_graphs_still_need_a_cuda_device(model):
    with pytest.raises(InputError, match="CUDA"):
        LLM(model, speculative_model=random_draft(model), cuda_graphs=True, **llm_args())


def test_mixed_prefill_steps_run_eagerly(model, cpu_graphs):
    """Chunked prefills (a 32-token budget) share steps with verify rows: those steps run eagerly, the
    pure-decode ones replay, and the tokens are the eager run's."""
    prompts = random_prompts(3, [30, 12, 44], seed=5)
    params = SamplingParams(max_tokens=N_NEW, ignore_eos=True)
    draft = _oracle(model, prompts)
    eager, _ = _run(model, prompts, draft, "shared", 3, False, params, max_num_tokens=32)
    static, s_llm = _run(model, prompts, draft, "shared", 3, True, params, max_num_tokens=32)
    assert static == eager
    assert _replays(s_llm)["verify"] > 0


def test_every_pure_decode_step_replays(model, cpu_graphs):
    """One request, prefilled in one step: each of its verify steps replays the verify graph."""
    llm = LLM(model, speculative_model=random_draft(model), draft_len=3, draft_kv="separate", cuda_graphs=True,
              **llm_args())
    llm.generate(random_prompts(1, [40], seed=8), SamplingParams(max_tokens=N_NEW, ignore_eos=True))
    s, r = llm.spec_stats(), _replays(llm)
    assert r["verify"] == s.verify_steps > 0
    assert r["chain"] >= r["verify"] - 1
