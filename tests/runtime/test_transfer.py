"""runtime/transfer: host -> device copies that keep the values (and, on CUDA, do not wait for the stream)."""

import pytest
import torch

from m3bench.runtime.transfer import upload, upload_list


def test_cpu_upload_keeps_values_and_dtype():
    g = torch.Generator().manual_seed(0)
    host = torch.randint(-1000, 1000, (7, 3), generator=g)
    assert torch.equal(upload(host, "cpu"), host)
    vals = torch.rand(11, generator=g).tolist()
    out = upload_list(vals, torch.float32, torch.device("cpu"))
    assert out.dtype == torch.float32 and torch.equal(out, torch.tensor(vals, dtype=torch.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_upload_does_not_wait_for_the_queue_and_survives_reuse():
    """Queued behind 50 ms of device sleep, 200 uploads return at once; their values are right after the
    sleep even though each host tensor was dropped (the pinned blocks are kept until the copies ran)."""
    expected = [torch.arange(i, i + 64) for i in range(200)]
    torch.cuda.synchronize()
    torch.cuda._sleep(100_000_000)
    outs = [upload(e.clone(), "cuda") for e in expected]
    assert not torch.cuda.current_stream().query()  # still asleep: nothing waited
    torch.cuda.synchronize()
    assert all(torch.equal(o.cpu(), e) for o, e in zip(outs, expected))
