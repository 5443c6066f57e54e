"""One-model Eagle3 speculative decoding pieces: draft config and model, verification, statistics,
synthetic acceptance; the propose/verify strategy of the engine's one step loop (runtime/engine.py):
`runner.py` (SpecRunner: the step's rows with drafts, verification, drafting), `draft_kv.py` (SEPARATE / SHARED draft-KV layouts), `setup.py` (wiring,
look-ahead, prefix-caching policy). `LLM(..., speculative_model=DIR, draft_len=K, draft_kv=...)`."""
