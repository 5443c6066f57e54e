"""AsyncLLM: the engine's step loop on its own thread, each request's deltas on an asyncio queue.

    engine = AsyncLLM(llm)                      # starts the engine thread
    async for delta in engine.generate(prompt_ids, SamplingParams(max_tokens=8)):
        delta.token_ids, delta.text, delta.finished
    engine.stats()                              # running / waiting requests, KV pages, spec counters
    engine.shutdown()

Only the engine thread touches the LLM: adds, aborts and stats requests are commands it drains
between steps. A consumer that stops iterating (a client that went away) aborts its request,
which frees its KV pages.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

_STOP = object()
IDLE_POLL_S = 0.002  # a step with nothing to do waits this long for a command instead of spinning


class EngineDead(RuntimeError):
    """The engine thread hit an error in a step; every request in flight fails with it."""


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_pages_total: int
    kv_pages_free: int  # free plus evictable (cached but unused) pages
    prompt_tokens_total: int
    generation_tokens_total: int
    requests_finished_total: int
    requests_aborted_total: int  # consumers that left before their request finished
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_pos: tuple[int, ...] = ()
    prefix_queried_tokens: int = 0  # prompt tokens looked up in the prefix cache at admission
    prefix_hit_tokens: int = 0  # of those, served from the cache
    page_tokens: int = 0  # tokens per KV page (the prefix cache's granularity)
    prefix_caching: bool = False

    @property
    def kv_pages_in_use(self) -> int:
        return self.kv_pages_total - self.kv_pages_free


@dataclass(frozen=True)
class StreamDelta:
    """What one request gained in one engine step, as its consumer sees it."""

    request_id: int
    token_ids: tuple[int, ...]
    text: str
    token_times_s: tuple[float, ...]  # host time.time() at which each new token was known
    finished: bool
    finish_reason: str | None
    logprobs: tuple[float, ...] = ()  # one per new token, when the request asked for logprobs
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()  # per new token: (id, logprob) best first
    prompt_logprobs: tuple[float, ...] = ()  # with SamplingParams.prompt_logprobs: prompt tokens 1.. (one delta)
    prompt_top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    prompt_len: int
    seq: Any = None  # the engine's Sequence of this request (its logprobs are read from it)


class AsyncLLM:
    """Thread-safe asyncio front of one LLM (see the module docstring)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[int, _Stream] = {}
        self._counts = {"prompt": 0, "generation": 0, "finished": 0, "aborted": 0}
        self._dead: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="m3bench-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._dead is None and self._thread.is_alive()

    @property
    def tokenizer(self) -> Any:
        return self.llm.tokenizer

    @property
    def config(self) -> Any:
        return self.llm.config

    # ---- called from any thread ----------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], params: Any) -> AsyncIterator[StreamDelta]:
        """The request's deltas as the engine produces them; leaving early aborts it."""
        q: asyncio.Queue = asyncio.Queue()
        rid = await self._add_request(list(prompt_ids), params, _Stream(asyncio.get_running_loop(), q, len(prompt_ids)))
        finished = False
        try:
            while not finished:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                finished = bool(item.finished)
                yield item
        finally:
            if not finished:
                self.abort(rid)

    async def _add_request(self, prompt_ids: list[int], params: Any, stream: _Stream) -> int:
        fut = self._submit(self._add, prompt_ids, params, stream)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:  # cancelled while the engine was adding it: abort once it is in
            fut.add_done_callback(lambda f: None if f.cancelled() or f.exception() else self.abort(f.result()))
            raise

    def abort(self, request_id: int) -> None:
        self._commands.put((self._abort, (request_id,), None))

    async def stats(self) -> EngineStats:
        return await self._call(self._stats)

    def stats_sync(self, timeout_s: float = 30.0) -> EngineStats:
        return self._submit(self._stats).result(timeout=timeout_s)

    def shutdown(self) -> None:
        self._commands.put(_STOP)
        self._thread.join(timeout=30)

    def _submit(self, fn: Callable, *args: Any) -> concurrent.futures.Future:
        if self._dead is not None:
            raise EngineDead(f"engine stopped: {self._dead}")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put((fn, args, fut))
        return fut

    async def _call(self, fn: Callable, *args: Any) -> Any:
        return await asyncio.wrap_future(self._submit(fn, *args))

    # ---- engine thread -------------------------------------------------------------------------

    def _loop(self) -> None:
        wait_s: float | None = None
        while True:
            if not self._drain(block=not self._streams, wait_s=wait_s):
                return
            wait_s = None
            if self._streams:
                try:
                    deltas = self.llm.step()
                except BaseException as e:  # noqa: BLE001 - every waiter must hear of it
                    self._fail_all(e)
                    return
                self._dispatch(deltas)
                if not deltas and not self.llm.has_unfinished():
                    wait_s = IDLE_POLL_S  # nothing to do this step: wait a moment for a command, do not spin

    def _drain(self, block: bool, wait_s: float | None = None) -> bool:
        """Run queued commands (waiting for the first when idle, or up to wait_s); False once asked to stop."""
        while True:
            try:
                cmd = self._commands.get(block=block or wait_s is not None, timeout=None if block else wait_s)
            except queue.Empty:
                return True
            block, wait_s = False, None
            if cmd is _STOP:
                self._fail_all(EngineDead("engine shut down"))
                return False
            self._run(*cmd)

    @staticmethod
    def _run(fn: Callable, args: tuple, fut: concurrent.futures.Future | None) -> None:
        if fut is not None and not fut.set_running_or_notify_cancel():
            return  # the caller gave up before the engine got to it
        try:
            result = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            if fut is not None:
                fut.set_exception(e)
            return
        if fut is not None:
            fut.set_result(result)

    def _add(self, prompt_ids: list[int], params: Any, stream: _Stream) -> int:
        rid = self.llm.add_request(prompt_ids, params)
        stream.seq = _sequence_of(self.llm, rid)
        self._streams[rid] = stream
        self._counts["prompt"] += len(prompt_ids)
        return rid

    def _abort(self, rid: int) -> None:
        if self._streams.pop(rid, None) is not None:
            self._counts["aborted"] += 1
            self.llm.abort(rid)

    def _dispatch(self, deltas: list[Any]) -> None:
        for delta in deltas:
            stream = self._streams.get(delta.request_id)
            if stream is None:
                continue
            out = _enrich(delta, stream.seq)
            self._counts["generation"] += len(out.token_ids)
            if out.finished:
                self._counts["finished"] += 1
                del self._streams[delta.request_id]
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, out)

    def _fail_all(self, error: BaseException) -> None:
        self._dead = error
        for stream in self._streams.values():
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, EngineDead(f"engine stopped: {error}"))
        self._streams.clear()

    def _stats(self) -> EngineStats:
        return engine_stats(self.llm, self._counts)


def _sequence_of(llm: Any, rid: int) -> Any:
    """The Sequence behind a just-added request (RequestDelta carries no logprobs; the Sequence does)."""
    return llm.engine.scheduler.find(rid)


def _enrich(delta: Any, seq: Any) -> StreamDelta:
    """The engine's delta plus the logprobs of its new tokens (appended to the Sequence as they are sampled)."""
    n = len(delta.token_ids)
    want = n > 0 and seq is not None and seq.params.logprobs is not None
    lps = tuple(seq.logprobs[len(seq.output_ids) - n: len(seq.output_ids)]) if want else ()
    tops = tuple(tuple(t) for t in seq.top_logprobs[len(seq.output_ids) - n: len(seq.output_ids)]) if want else ()
    return StreamDelta(delta.request_id, tuple(delta.token_ids), delta.text,
                       tuple(delta.token_times_s), delta.finished, delta.finish_reason, lps, tops,
                       tuple(getattr(delta, "prompt_logprobs", ())), tuple(getattr(delta, "prompt_top_logprobs", ())))


def engine_stats(llm: Any, counts: dict[str, int]) -> EngineStats:
    """A snapshot of the engine's queues, KV pool and speculation counters (engine thread only)."""
    s = llm.stats()
    drafts, proposed, accepted, per_pos = _spec_totals(llm)
    return EngineStats(
        num_running=s.num_running,
        num_waiting=s.num_waiting,
        kv_pages_total=s.kv_pages_total,
        kv_pages_free=s.kv_pages_free,
        prompt_tokens_total=counts["prompt"],
        generation_tokens_total=counts["generation"],
        requests_finished_total=counts["finished"],
        requests_aborted_total=counts["aborted"],
        spec_drafts=drafts,
        spec_draft_tokens=proposed,
        spec_accepted_tokens=accepted,
        spec_accepted_per_pos=per_pos,
        prefix_queried_tokens=s.prefix_queried_tokens,
        prefix_hit_tokens=s.prefix_hit_tokens,
        page_tokens=llm.engine.scheduler.bm.P,
        prefix_caching=llm.engine.scheduler.bm.caching,
    )


def _spec_totals(llm: Any) -> tuple[int, int, int, tuple[int, ...]]:
    """Running totals (drafts, draft tokens, accepted, accepted per position) of `llm.spec_stats()`;
    zeros before the first draft and without speculation."""
    from m3bench.runtime.speculative.stats import EmptySampleError

    spec_stats = getattr(llm, "spec_stats", None)
    try:
        s = spec_stats() if spec_stats is not None else None
    except EmptySampleError:
        s = None
    if s is None:
        return 0, 0, 0, ()
    return s.drafts, s.proposed, s.accepted, tuple(s.accepted_per_position)
