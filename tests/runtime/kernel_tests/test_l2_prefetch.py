"""L2 prefetch (kernels/l2_prefetch.py) off the GPU: the byte span it asks for covers a tensor's storage from its
first 16-byte boundary in whole 16-byte units, the grid covers the span, and on the CPU it is a no-op; the model
wires o_proj and the next layer's qkv + index projection (the GPU runs it: tests/runtime/test_lanes_gpu.py, and the
decode steps with it bit-identical to those without, tests/benchmarks/test_decode_pdl_gpu.py)."""

import torch

from m3bench.runtime.kernels import l2_prefetch as l2


def test_the_span_is_the_storage_in_whole_16_byte_units():
    w = torch.randn(10, 7)  # 280 bytes
    for t in (w, w[3:], w.t()):
        raw, nbytes = l2.prefetch_span(t)
        assert raw.dtype == torch.uint8 and raw.data_ptr() % 16 == 0 and nbytes % 16 == 0
        assert raw.data_ptr() >= w.data_ptr() and raw.data_ptr() + nbytes <= w.data_ptr() + 280
        assert w.data_ptr() + 280 - (raw.data_ptr() + nbytes) < 16 + 16


def test_the_grid_covers_the_span():
    per = l2.CHUNK_BYTES * l2.LANES
    assert [l2.prefetch_grid(n) for n in (16, per, per + 16, 23_592_960)] == [1, 1, 2, -(-23_592_960 // per)]


def test_on_the_cpu_it_does_nothing():
    w = torch.randn(64, 64)
    before = w.clone()
    assert not l2.l2_prefetch_supported(w)
    l2.l2_prefetch(w, None)
    assert torch.equal(w, before)


def test_the_model_prefetches_o_proj_and_the_next_layers_qkv():
    from m3bench.runtime.model import M3ForCausalLM
    from tests.runtime.tiny_m3 import tiny_m3_cfg

    model = M3ForCausalLM(tiny_m3_cfg())
    model.set_l2_prefetch(True)
    layers = model.layers
    for i, layer in enumerate(layers[:-1]):
        assert layer.attn.l2_ahead and layer.ahead[0] is layers[i + 1]
    assert layers[-1].ahead == () and layers[-1].attn.l2_ahead
    assert len(list(model.modules())) == len(list(M3ForCausalLM(tiny_m3_cfg()).modules()))  # no module twice
    model.set_l2_prefetch(False)
    assert all(layer.ahead == () and not layer.attn.l2_ahead for layer in layers)
