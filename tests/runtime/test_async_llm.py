"""AsyncLLM: the engine thread's deltas reach asyncio consumers; leaving early aborts and frees pages."""

import asyncio

import pytest

from m3bench.runtime.errors import InputError


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from m3bench.runtime import LLM
    from m3bench.runtime.tiny import write_tiny_checkpoint

    ckpt = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), seed=2)
    return LLM(str(ckpt), num_kv_blocks=16, max_batch_size=8)


@pytest.fixture()
def engine(llm):
    from m3bench.runtime.async_llm import AsyncLLM

    e = AsyncLLM(llm)
    yield e
    e.shutdown()


def _params(n, **kw):
    from m3bench.runtime import SamplingParams

    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


async def _collect(engine, ids, params):
    return [d async for d in engine.generate(ids, params)]


def test_streams_equal_batch_generate(llm, engine):
    prompts = [[5, 6, 7, 8, 9], [100, 200, 300], [42] * 20]
    ref = llm.generate(prompts, _params(6, logprobs=1))

    async def main():
        return await asyncio.gather(*(_collect(engine, p, _params(6, logprobs=1)) for p in prompts))

    for out, deltas in zip(ref, asyncio.run(main())):
        assert [t for d in deltas for t in d.token_ids] == out.token_ids
        assert "".join(d.text for d in deltas) == out.text
        assert [lp for d in deltas for lp in d.logprobs] == pytest.approx(out.logprobs, abs=1e-5)
        assert deltas[-1].finished and deltas[-1].finish_reason == "length"
        assert all(len(d.token_times_s) == len(d.token_ids) for d in deltas)


def test_leaving_early_and_cancelling_abort(engine):
    total = engine.stats_sync().kv_pages_total

    async def leave_early():
        gen = engine.generate(list(range(1, 300)), _params(200))
        async for _ in gen:
            break
        await gen.aclose()

    async def cancelled():
        task = asyncio.ensure_future(_collect(engine, list(range(1, 300)), _params(200)))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def main():
        await leave_early()
        await cancelled()
        for _ in range(100):
            s = await engine.stats()
            if s.kv_pages_free == total and s.num_running == s.num_waiting == 0:
                return s
            await asyncio.sleep(0.02)
        return s

    s = asyncio.run(main())
    assert s.kv_pages_free == total and s.num_running == 0 and s.requests_aborted_total == 2


def test_bad_request_raises_and_engine_lives_on(engine, llm):
    async def main():
        with pytest.raises(InputError):
            await _collect(engine, [1] * (llm.max_model_len + 1), _params(2))
        return await _collect(engine, [1, 2, 3], _params(2))

    assert sum(len(d.token_ids) for d in asyncio.run(main())) == 2


def test_step_failure_reaches_every_waiter(llm):
    from m3bench.runtime.async_llm import AsyncLLM, EngineDead

    class Broken:
        """The real LLM whose step raises, as a device error would."""

        def __getattr__(self, name):
            return getattr(llm, name)

        def step(self):
            raise RuntimeError("device lost")

    engine = AsyncLLM(Broken())

    async def main():
        with pytest.raises(EngineDead, match="device lost"):
            await _collect(engine, [1, 2, 3], _params(2))
        with pytest.raises(EngineDead):
            await _collect(engine, [1, 2, 3], _params(2))

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
        for rid in list(llm.engine.scheduler.running) + list(llm.engine.scheduler.waiting):
            llm.abort(rid.request_id)
