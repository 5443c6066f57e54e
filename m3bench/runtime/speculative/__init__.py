"""One-model Eagle3 speculative decoding pieces: draft config and model, verification, statistics,
synthetic acceptance; the engine loop that drives them: `runner.py` (device work of one step),
`spec_engine.py` (the step), `draft_kv.py` (SEPARATE / SHARED draft-KV layouts), `setup.py` (wiring,
look-ahead, prefix-caching policy). `LLM(..., speculative_model=DIR, draft_len=K, draft_kv=...)`."""
