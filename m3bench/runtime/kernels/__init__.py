"""GPU fast-path kernels (Triton) with plain-torch references and CPU fallbacks.

Entry points (each runs Triton on CUDA tensors and the torch reference elsewhere;
`backend=KernelBackend.TRITON / TORCH` forces one):
  attention.paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                            selected_blocks=None, out=None, max_query_len=None)
  msa_index.msa_select_blocks(iq, ik_cache, block_tables, seq_lens, query_start_loc, topk,
                              init_blocks=0, out=None, max_query_len=None)   -> [T, Hi, topk] int32
  moe.fused_moe(x, w_gate, w_up, w_down, topk_ids, topk_weights, MoeActivation.SWIGLUOAI)
  kv_write.write_pages(cache, x, slot_mapping)         quantize-on-write into the paged cache
  kv_quant: quantize_fp8 / dequantize_fp8, quantize_nvfp4 / dequantize_nvfp4,
            nvfp4_global_scale, Nvfp4Pages (an NVFP4 cache), KVFormat
References with the same signatures live in reference.py (and kv_write.write_pages_ref).

Fused ops around the GEMMs (Triton only; their torch references are the layers' own paths, which
pick them when the backend selects Triton):
  norm_rope.norm_rope_write(y, Branch(...), q_w, k_w, eps, gemma, cos, sin, slots, k_cache, v_cache)
      per-head RMSNorm + partial RoPE of one attention branch + quantized KV write, one launch
  router.router_topk(logits, bias, top_k, scale)      sigmoid + bias + top-k + renormalise + scale
  add_norm.add_rms_norm_fused(residual, x, w, eps, gemma)   residual add + RMSNorm

Importing this package imports no triton: the Triton modules (`*_triton.py`) are imported
lazily by the wrappers, only when a kernel actually runs through Triton (so TRITON_INTERPRET
set before the first launch is honoured). Triton features used: those of Triton 3.0-3.6 (programmatic dependent
launch, backend.Pdl, when switched on: tl.extra.cuda.gdc_* and launch_pdl, in the H200's Triton 3.6).
"""
