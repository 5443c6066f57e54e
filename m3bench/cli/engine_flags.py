"""Help texts of the engine flags that `m3bench serve` and `m3bench sweep` share (one wording each)."""

CUDA_GRAPHS_HELP = "Capture CUDA graphs of the decode step (with --draft: of the verify and draft steps)."
ASYNC_HELP = ("Overlap scheduling: schedule step N+1 while step N runs on the device (same outputs). "
              "Default: on for CUDA without --draft or --tp > 1.")
WEIGHTS_DTYPE_HELP = ("auto: quantized checkpoints run as stored (MXFP8 layers, NVFP4 routed experts); "
                      "bfloat16: dequantize to the model dtype on load.")
