"""Async load generator: streams requests to a target behind a concurrency cap and records raw facts.

    result = asyncio.run(run_benchmark(OpenAITarget("http://127.0.0.1:8000"), warmup, prompts, concurrency=4))
    compute_metrics(result.records, result.duration_s)

Targets: `EngineTarget` (the bundled engine in-process through AsyncLLM, no HTTP), `OpenAITarget`
(`m3bench serve` or any OpenAI-compatible server, `/v1/completions` with stream and usage), and
`NullTarget` (answers instantly: a run against it measures the client's own per-chunk cost).
Requests go out in order; with a finite `request_rate` the gaps are gamma distributed
(burstiness 1 = Poisson, vLLM's convention), otherwise all at once behind the cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Protocol, Sequence

import numpy as np

from m3bench.bench.records import RequestRecord
from m3bench.bench.workload import WorkloadPrompt
from m3bench.runtime.errors import InputError

HTTP_TIMEOUT_S = 6 * 3600
ERROR_BODY_CHARS = 300


@dataclass(frozen=True)
class Chunk:
    """One streamed piece: the tokens it carries (0 if the target does not say), its text, usage if sent."""

    num_tokens: int = 0
    text: str = ""
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    parse_s: float = 0.0  # time the client spent decoding this chunk (HTTP + JSON), part of its overhead

    @property
    def carries_output(self) -> bool:
        return self.num_tokens > 0 or bool(self.text)


class Target(Protocol):
    def stream(self, prompt: WorkloadPrompt) -> AsyncIterator[Chunk]: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class LoadResult:
    records: tuple[RequestRecord, ...]
    duration_s: float  # wall time from the first send to the last response

    @property
    def client_us_per_chunk(self) -> float | None:
        """Mean time the client itself spent per received chunk (parse + bookkeeping), microseconds."""
        chunks = sum(len(r.chunk_times_s) for r in self.records)
        return None if chunks == 0 else 1e6 * sum(r.client_busy_s for r in self.records) / chunks


async def run_request(target: Target, prompt: WorkloadPrompt) -> RequestRecord:
    """Send one prompt and record when each chunk carrying output arrived; errors become the record's error."""
    times: list[float] = []
    tokens: list[int] = []
    usage: dict[str, int | None] = {"prompt": None, "output": None}
    busy_s = 0.0
    send_s = time.perf_counter()
    try:
        async for chunk in target.stream(prompt):
            now = time.perf_counter()
            if chunk.carries_output:
                times.append(now)
                tokens.append(chunk.num_tokens)
            usage["prompt"] = chunk.prompt_tokens if chunk.prompt_tokens is not None else usage["prompt"]
            usage["output"] = chunk.output_tokens if chunk.output_tokens is not None else usage["output"]
            busy_s += chunk.parse_s + (time.perf_counter() - now)
        error = None
    except Exception as e:  # a failed request is a fact to record, not a crash of the benchmark
        error = f"{type(e).__name__}: {e}"[:ERROR_BODY_CHARS]
    output = usage["output"] if usage["output"] is not None else sum(tokens)
    prompt_tokens = usage["prompt"] if usage["prompt"] is not None else prompt.prompt_len
    return RequestRecord(send_s, tuple(times), tuple(tokens), prompt_tokens, output, error, busy_s)


def arrival_gaps_s(num: int, request_rate: float, burstiness: float, seed: int) -> list[float]:
    """Gaps before each request: 0 at infinite rate, else gamma(shape=b, scale=1/(rate b)) (b=1: Poisson)."""
    if request_rate <= 0 or burstiness <= 0:
        raise InputError(f"request rate and burstiness must be > 0, got {request_rate}, {burstiness}")
    if math.isinf(request_rate):
        return [0.0] * num
    rng = np.random.default_rng(seed)
    return [float(g) for g in rng.gamma(burstiness, 1.0 / (request_rate * burstiness), size=num)]


async def run_load(
    target: Target,
    prompts: Sequence[WorkloadPrompt],
    concurrency: int,
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    seed: int = 0,
    arrivals_s: Sequence[float] | None = None,
) -> LoadResult:
    """Send every prompt (paced by the arrival process, or at `arrivals_s`: offsets from the start, e.g. a
    trace's timestamps) with at most `concurrency` in flight (a request due while the cap is full waits)."""
    if concurrency < 1:
        raise InputError(f"concurrency must be >= 1, got {concurrency}")
    if arrivals_s is None:
        arrivals_s = np.cumsum(arrival_gaps_s(len(prompts), request_rate, burstiness, seed)).tolist()
    if len(arrivals_s) != len(prompts):
        raise InputError(f"{len(arrivals_s)} arrival times for {len(prompts)} prompts")
    cap = asyncio.Semaphore(concurrency)

    async def one(prompt: WorkloadPrompt) -> RequestRecord:
        async with cap:
            return await run_request(target, prompt)

    start_s = time.perf_counter()
    tasks = []
    for due_s, prompt in zip(arrivals_s, prompts):
        wait_s = start_s + due_s - time.perf_counter()
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        tasks.append(asyncio.create_task(one(prompt)))
    records = await asyncio.gather(*tasks)
    return LoadResult(tuple(records), time.perf_counter() - start_s)


async def run_benchmark(
    target: Target,
    warmup: Sequence[WorkloadPrompt],
    prompts: Sequence[WorkloadPrompt],
    concurrency: int,
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    seed: int = 0,
) -> LoadResult:
    """Uncounted warm-up requests (same cap, all at once), then the measured run."""
    if warmup:
        await run_load(target, warmup, concurrency)
    return await run_load(target, prompts, concurrency, request_rate, burstiness, seed)


# ---- targets -------------------------------------------------------------------------------------


class NullTarget:
    """Answers every prompt at once, one token per chunk, yielding to the event loop between chunks.

    Whatever latency a run against it shows is the client's own (asyncio scheduling + bookkeeping).
    """

    async def stream(self, prompt: WorkloadPrompt) -> AsyncIterator[Chunk]:
        for _ in range(prompt.output_len):
            await asyncio.sleep(0)
            yield Chunk(num_tokens=1, text="x")
        yield Chunk(prompt_tokens=prompt.prompt_len, output_tokens=prompt.output_len)

    async def close(self) -> None:
        return None


async def measure_client_overhead(concurrency: int, output_len: int = 64, num: int | None = None) -> LoadResult:
    """A run against NullTarget: its ITL is the floor the client adds to every measured gap."""
    n = num or 4 * concurrency
    prompts = [WorkloadPrompt((0,), "", output_len)] * n
    return await run_load(NullTarget(), prompts, concurrency)


class EngineTarget:
    """The bundled engine in-process: AsyncLLM's stream of deltas, no HTTP."""

    def __init__(self, engine: Any, temperature: float = 0.0) -> None:
        self.engine = engine
        self.temperature = temperature
        self.step_clock = engine.llm.clock  # the engine's own step timing (runtime/step_timing.py)

    async def stream(self, prompt: WorkloadPrompt) -> AsyncIterator[Chunk]:
        from m3bench.runtime import SamplingParams

        params = SamplingParams(max_tokens=prompt.output_len, temperature=self.temperature, ignore_eos=True,
                                detokenize=False)  # dummy weights sample ids the tokenizer may not know
        output = 0
        async for delta in self.engine.generate(list(prompt.token_ids), params):
            n = len(delta.token_ids)
            output += n
            if n:
                yield Chunk(num_tokens=n, text=delta.text)
        yield Chunk(prompt_tokens=prompt.prompt_len, output_tokens=output)

    async def max_model_len(self) -> int | None:
        """The engine's context length (prompt + output)."""
        return getattr(getattr(self.engine, "llm", None), "max_model_len", None)

    async def close(self) -> None:
        return None


class OpenAITarget:
    """`/v1/completions` of an OpenAI-compatible server, streamed, with usage in the last chunk.

    Prompts go as token ids (exact lengths) unless `send_text`; `token_ids_ext` asks for the
    `return_token_ids` extension (m3bench serve, recent vLLM) so each chunk's token count is known.
    """

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 send_text: bool = False, token_ids_ext: bool = False, temperature: float = 0.0) -> None:
        self.base_url = _api_base(base_url)
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.send_text, self.token_ids_ext, self.temperature = send_text, token_ids_ext, temperature
        self._session = None
        self.step_clock = None  # a server's engine steps are not seen from here

    async def _client(self):
        import aiohttp

        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
            self._session = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0))
        if self.model is None:
            self.model = await self._first_model()
        return self._session

    async def _first_model(self) -> str:
        async with self._session.get(f"{self.base_url}/models", headers=self.headers) as resp:
            body = await resp.text()
            if resp.status != 200:
                raise InputError(f"{self.base_url}/models answered {resp.status}: {body[:ERROR_BODY_CHARS]}")
            return json.loads(body)["data"][0]["id"]

    async def max_model_len(self) -> int | None:
        """`max_model_len` of the served model in /v1/models (vLLM, m3bench serve); None when not said."""
        async with self._reached():
            session = await self._client()
            async with session.get(f"{self.base_url}/models", headers=self.headers) as resp:
                doc = await resp.json(content_type=None) if resp.status == 200 else {}
        models = doc.get("data") or []
        mine = [m for m in models if m.get("id") == self.model] or models[:1]
        value = mine[0].get("max_model_len") if mine else None
        return int(value) if isinstance(value, int) and value > 0 else None

    async def accepts_token_ids(self, token_ids: Sequence[int]) -> bool:
        """Whether /v1/completions takes a list of token ids as `prompt` (one 1-token request)."""
        async with self._reached():
            session = await self._client()
            body = {"model": self.model, "prompt": list(token_ids), "max_tokens": 1, "temperature": 0.0}
            async with session.post(f"{self.base_url}/completions", json=body, headers=self.headers) as resp:
                await resp.read()
                return resp.status == 200

    @contextlib.asynccontextmanager
    async def _reached(self):
        """A server that cannot be reached (or answers garbage) is bad input: one line, exit 2."""
        import aiohttp

        try:
            yield
        except (aiohttp.ClientError, json.JSONDecodeError, OSError) as e:
            raise InputError(f"cannot query {self.base_url}: {type(e).__name__}: {e}"[:ERROR_BODY_CHARS]) from None

    def _payload(self, prompt: WorkloadPrompt) -> dict:
        body = {
            "model": self.model,
            "prompt": prompt.text if self.send_text else list(prompt.token_ids),
            "max_tokens": prompt.output_len,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        if self.token_ids_ext:
            body["return_token_ids"] = True
        return body

    async def stream(self, prompt: WorkloadPrompt) -> AsyncIterator[Chunk]:
        session = await self._client()
        async with session.post(f"{self.base_url}/completions", json=self._payload(prompt), headers=self.headers) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:ERROR_BODY_CHARS]}")
            async for raw in resp.content:
                t0 = time.perf_counter()
                chunk = parse_sse_line(raw)
                if chunk is None:
                    continue
                yield Chunk(chunk.num_tokens, chunk.text, chunk.prompt_tokens, chunk.output_tokens,
                            time.perf_counter() - t0)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _api_base(base_url: str) -> str:
    """http://host:port or http://host:port/v1 -> http://host:port/v1."""
    base = base_url.rstrip("/")
    return base if base.endswith("/v1") else f"{base}/v1"


def parse_sse_line(raw: bytes) -> Chunk | None:
    """One `data: {...}` line of a completions stream as a Chunk; None for blank, comment or [DONE]."""
    line = raw.decode("utf-8").strip()
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return None
    obj = json.loads(data)
    if "error" in obj:
        raise RuntimeError(f"server error in stream: {str(obj['error'])[:ERROR_BODY_CHARS]}")
    usage = obj.get("usage") or {}
    choices = obj.get("choices") or []
    text = "".join(c.get("text") or "" for c in choices)
    num = sum(len(c.get("token_ids") or []) for c in choices)
    return Chunk(num, text, usage.get("prompt_tokens"), usage.get("completion_tokens"))
