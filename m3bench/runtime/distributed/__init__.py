"""Tensor / expert parallelism across processes: one model over N ranks, one engine on rank 0.

Rank 0 (the process that built the `LLM`) owns the scheduler, block manager, prefix cache and
sampler. Its runners build each step's inputs as at TP 1 and hand them to their link (the Driver):
the target forward's token ids, positions, slot mapping, block tables and logits rows; the draft's
extend rows and page tables; each chain step's draft tokens. Every rank then runs the same step
functions (runtime/rank_step.py, speculative/draft_step.py) on its shards in lock-step. The other ranks
keep no scheduler state: their KV pools have rank 0's pages, and every write goes to the slot rank 0
chose. Sampling happens on rank 0 only (the logits are all-gathered there anyway), so seeds,
generators and stop rules live in one place.

    llm = LLM("ckpt", tensor_parallel_size=2)        # spawns rank 1, gloo on CPU / NCCL on GPU
    torchrun --nproc-per-node 4 script.py             # or: every rank runs LLM(...); ranks > 0 serve

Files: `protocol.py` (the messages), `groups.py` (process groups, devices), `launcher.py` (spawning,
watching and stopping workers), `worker.py` (ranks > 0), `driver.py` (rank 0).
"""
