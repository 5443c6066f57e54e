"""On the H200, at one TP8 rank's real shapes: the fused router epilogue, residual add + norm, norm +
RoPE + KV write (every KV format) and the NVFP4 attention / index decode against their torch
references (inputs drawn on the CPU, fresh random, never zeros; outputs poisoned first)."""

import pytest
import torch

from m3bench.runtime.config import NormKind
from m3bench.runtime.kernels import kv_quant as kq
from m3bench.runtime.kernels.add_norm import add_rms_norm_fused
from m3bench.runtime.kernels.attention import paged_attention
from m3bench.runtime.kernels.backend import NVFP4_DECODE, KernelBackend, Nvfp4Decode
from m3bench.runtime.kernels.norm_rope import Branch, norm_rope_write
from m3bench.runtime.kernels.reference import paged_attention_ref
from m3bench.runtime.kernels.router import router_topk
from m3bench.runtime.layers.moe import route
from m3bench.runtime.layers.norm import add_rms_norm
from m3bench.runtime.layers.rotary import RotaryEmbedding

from .cases import clone_pages, make_case, poisoned_pages
from .test_norm_rope_kernel import _ref, _same_cache
from .test_router_kernel import check_router_align

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _cuda(c):
    if isinstance(c, kq.Nvfp4Pages):
        return kq.Nvfp4Pages(c.data.cuda(), c.scales.cuda(), c.global_scale.cuda())
    return c.cuda()


def _cpu(c):
    if isinstance(c, kq.Nvfp4Pages):
        return kq.Nvfp4Pages(c.data.cpu(), c.scales.cpu(), c.global_scale.cpu())
    return c.cpu()


@pytest.mark.parametrize("n_tok", [1, 64])
def test_router_epilogue_at_rank_shapes(n_tok):
    g = torch.Generator().manual_seed(n_tok)
    x, w, b = torch.randn(n_tok, 6144, generator=g), torch.randn(128, 6144, generator=g) / 78, torch.randn(128, generator=g) * 0.05
    logits = torch.nn.functional.linear(x.cuda(), w.cuda())
    want_w, want_ids = route(x.cuda(), w.cuda(), b.cuda(), 4, 2.0, KernelBackend.TORCH)
    poison = (torch.full((n_tok, 4), float("nan"), device="cuda"), torch.full((n_tok, 4), -7, device="cuda"))
    got_w, got_ids = router_topk(logits, b.cuda(), 4, 2.0, out=poison)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_tok", [1, 2, 3, 4, 5, 8, 13, 16])
@pytest.mark.parametrize("n_exp,shared", [(128, True), (128, False), (16, True)])
def test_router_align_at_rank_shapes(n_tok, n_exp, shared):
    # Every token count of the aligning router (<= 16), many picks local (16 experts: all of them, gpu_sweep's
    # rank). The tile-reshaping first version lost picks here from 2 tokens on (the trace replay's crash).
    check_router_align(torch.device("cuda"), n_tok, 0, shared, n_exp, local_bias=1.0)


@pytest.mark.parametrize("n_tok", [1, 64])
def test_add_norm_at_rank_shapes(n_tok):
    g = torch.Generator().manual_seed(n_tok + 1)
    r, x = (torch.randn(n_tok, 6144, generator=g) * 4).bfloat16().cuda(), torch.randn(n_tok, 6144, generator=g).bfloat16().cuda()
    w = (torch.randn(6144, generator=g) * 0.2).bfloat16().cuda()
    want_h, want_y = add_rms_norm(r, x, w, 1e-6, NormKind.GEMMA, KernelBackend.TORCH)
    out = (torch.full_like(x, float("nan")), torch.full_like(x, float("nan")))
    h, y = add_rms_norm_fused(r, x, w, 1e-6, True, out=out)
    assert torch.equal(h, want_h)
    torch.testing.assert_close(y.float(), want_y.float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("fmt", [kq.KVFormat.PLAIN, kq.KVFormat.FP8, kq.KVFormat.NVFP4])
@pytest.mark.parametrize("index", [False, True])
def test_norm_rope_write_at_rank_shapes(fmt, index):
    """8 query heads + 1 KV head of 128 (rotary 64), or the 4 replicated index heads + the index key."""
    g = torch.Generator().manual_seed(int(index) * 10 + len(fmt.value))
    d, n_tok, pages, page = 128, 64, 80, 128
    b = Branch(0, 10 * d, 0, 4, 1, 0, d) if index else Branch(0, 8 * d, 9 * d, 8, 1, 1, d)
    y = (torch.randn(n_tok, 15 * d, generator=g) * 2).bfloat16()
    qw, kw = (torch.randn(d, generator=g) * 0.2).bfloat16(), (torch.randn(d, generator=g) * 0.2).bfloat16()
    cos, sin = RotaryEmbedding(64, 5e6, None, "cpu").cos_sin(torch.randint(0, 30000, (n_tok,), generator=g))
    slots = torch.randperm(pages * page, generator=g)[:n_tok]
    shape = (pages, page, d) if index else (pages, 1, page, d)
    k_ref, v_ref = poisoned_pages(fmt, shape, g), poisoned_pages(fmt, shape, g)
    k_got, v_got = _cuda(clone_pages(k_ref)), _cuda(clone_pages(v_ref))
    want = _ref(y, b, qw, kw, NormKind.GEMMA, cos, sin, slots, k_ref, v_ref)
    q = norm_rope_write(y.cuda(), b, qw.cuda(), kw.cuda(), 1e-6, True, cos.cuda(), sin.cuda(), slots.cuda(),
                        k_got, None if index else v_got)
    torch.testing.assert_close(q.cpu().float(), want.float(), rtol=2e-2, atol=2e-2)
    _same_cache(_cpu(k_got), k_ref, slots, torch.bfloat16, fmt)
    _same_cache(_cpu(v_got), v_ref, slots, torch.bfloat16, fmt)


@pytest.mark.parametrize("decode", list(Nvfp4Decode))
@pytest.mark.parametrize("sparse", [False, True])
def test_nvfp4_attention_at_rank_shapes(sparse, decode, monkeypatch):
    """B = 4 at 4k context, 8 query heads on 1 KV head of 128, page 128 (MSA: 16 random blocks); both
    NVFP4 decodes (PTX, Triton's fp8 conversion)."""
    monkeypatch.setitem(NVFP4_DECODE, "decode", decode)
    case = make_case(21, q_lens=[1, 1, 1, 4], seq_lens=[4096, 3000, 4100, 2500], hq=8, hkv=1, d=128, page=128,
                     fmt=kq.KVFormat.NVFP4, dtype=torch.bfloat16)
    sel = None
    if sparse:
        g = torch.Generator().manual_seed(3)
        sel = torch.stack([torch.randperm(19, generator=g)[:16] for _ in range(case.q.shape[0])])[:, None]
        sel = sel.to(torch.int32).contiguous()
    dev = lambda t: None if t is None else t.cuda()  # noqa: E731
    out = torch.full_like(case.q, float("nan")).cuda()
    paged_attention(case.q.cuda(), _cuda(case.k_cache), _cuda(case.v_cache), dev(case.block_tables),
                    dev(case.seq_lens), dev(case.query_start_loc), 0.088, selected_blocks=dev(sel), out=out,
                    max_query_len=4, backend=KernelBackend.TRITON)
    want = paged_attention_ref(case.q.double(), case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                               case.query_start_loc, 0.088, sel)
    n = case.n_tokens
    rel = float((out[:n].cpu().double() - want[:n]).norm() / want[:n].norm())
    assert rel < 2e-2, rel


@pytest.mark.parametrize("decode", list(Nvfp4Decode))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_index_selection_at_rank_shapes(dtype, decode, monkeypatch):
    """The indexer over NVFP4 index keys (decoded through the fp8 conversion), 4k context, top-16 of 32."""
    from m3bench.runtime.kernels.msa_index import msa_select_blocks
    from m3bench.runtime.kernels.reference import msa_select_blocks_ref

    monkeypatch.setitem(NVFP4_DECODE, "decode", decode)
    case = make_case(22, q_lens=[1, 1, 4], seq_lens=[4096, 3500, 2900], hq=8, hkv=1, d=128, page=128, di=128,
                     fmt=kq.KVFormat.NVFP4, dtype=dtype)
    dev = lambda t: t.cuda()  # noqa: E731
    got = msa_select_blocks(dev(case.iq), _cuda(case.ik_cache), dev(case.block_tables), dev(case.seq_lens),
                            dev(case.query_start_loc), 16, max_query_len=4, backend=KernelBackend.TRITON).cpu()
    want = msa_select_blocks_ref(case.iq.double(), case.ik_cache, case.block_tables, case.seq_lens,
                                 case.query_start_loc, 16)
    n = case.n_tokens
    if dtype == torch.float32:
        assert torch.equal(got[:n], want[:n])
    else:  # bf16 products may reorder near-ties; the local block always first
        assert torch.equal(got[:n, :, 0], want[:n, :, 0])
        same = [len(set(a.tolist()) & set(b.tolist())) / 16 for a, b in zip(got[:n, 0], want[:n, 0])]
        assert min(same) >= 0.8, same


@pytest.mark.parametrize("n_tok", [1, 4, 64])  # 1, 4: the split-K skinny path
def test_moe_with_shared_expert_at_rank_shapes(n_tok):
    # One TP8/EP8 rank: 16 local experts of 3072 (ids over 128: most picks remote), shared 3072/8 = 384.
    from m3bench.runtime.kernels.moe import SharedExpert, fused_moe, fused_moe_reference
    from m3bench.runtime.kernels.reference import MoeActivation

    g = torch.Generator().manual_seed(n_tok + 5)
    rnd = lambda *s, scale: (torch.randn(*s, generator=g) * scale).bfloat16().cuda()  # noqa: E731
    x = rnd(n_tok, 6144, scale=1.0)
    wg, wu, wd = rnd(16, 3072, 6144, scale=6144 ** -0.5), rnd(16, 3072, 6144, scale=6144 ** -0.5), rnd(16, 6144, 3072, scale=3072 ** -0.5)
    shared = SharedExpert(rnd(384, 6144, scale=6144 ** -0.5), rnd(384, 6144, scale=6144 ** -0.5), rnd(6144, 384, scale=384 ** -0.5))
    ids = torch.randint(0, 32, (n_tok, 4), generator=g).cuda()  # 16..31: other ranks' (16: the shared slot's id)
    ids[0, 0] = 3
    w = (torch.rand(n_tok, 4, generator=g) + 0.1).cuda()
    out = torch.full_like(x, float("nan"))
    fused_moe(x, wg, wu, wd, ids, w, MoeActivation.SWIGLUOAI, out=out, backend=KernelBackend.TRITON, shared=shared)
    want = fused_moe_reference(x.float(), wg, wu, wd, ids, w, MoeActivation.SWIGLUOAI, 1.702, 7.0, shared=shared)
    err = ((out.float() - want).norm() / want.norm()).item()
    assert err < 1e-2, err
