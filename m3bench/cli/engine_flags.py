"""Help texts of the engine flags that `m3bench serve` and `m3bench sweep` share (one wording each)."""

CUDA_GRAPHS_HELP = "Capture CUDA graphs of the decode step (with --draft: of the verify and draft steps)."
ASYNC_HELP = ("Overlap scheduling: schedule step N+1 while step N runs on the device (same outputs). "
              "Default: on for CUDA without --draft or --tp > 1.")
MAX_MODEL_LEN_HELP = ("Context (prompt + output) a request may reach, up to the model's max_position_embeddings "
                      "and the KV pool (default: the most both allow).")
