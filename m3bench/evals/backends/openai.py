"""`openai` backend: any OpenAI-compatible server (vLLM, SGLang, TensorRT-LLM serve, m3bench serve).

    backend = OpenAIBackend(OpenAIConfig(base_url="http://127.0.0.1:8000", max_concurrency=64))
    backend.score([ScoreRequest("Answer:", " A")], on_done)

Scoring sends `/v1/completions` with `echo=True, logprobs=1, max_tokens=0` (1 where a server refuses 0)
and sums the echoed logprobs of the continuation's tokens, as lm-eval's `local-completions` does.
The context/continuation token boundary:
- with a local tokenizer (`tokenizer=DIR`): lm-eval's split (trailing context spaces move to the
  continuation, context_ids = tok(context), continuation = tok(context + continuation)[len(context_ids):]),
  and the prompt is sent as token ids, so the server scores exactly those tokens;
- without one: the server's echoed `text_offset`s; the first continuation token is the one holding
  the first character of the continuation (after the same trailing-space move).
Raw prompts go to `/v1/completions`, chat requests to `/v1/chat/completions` (the server applies the
chat template). Requests run concurrently behind a semaphore, with per-request timeouts and
exponential backoff on connection errors, 429, 5xx and malformed responses. An item that still fails
is collected; once every other item is done, `BackendRequestError` names each failed item.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

import httpx

from m3bench.evals.backends.base import (
    GenCallback,
    GenRequest,
    GenResult,
    ScoreCallback,
    ScoreRequest,
    ScoreResult,
)
from m3bench.evals.backends.hf import split_pair  # lm-eval's split (no heavy imports at its top)
from m3bench.runtime.errors import InputError

API_KEY_ENVS = ("M3BENCH_API_KEY", "OPENAI_API_KEY")  # first set one wins, after an explicit key
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
FINISH_STOP = frozenset({"stop", "eos", "eos_token", "stop_sequence", "end_turn"})


class BackendRequestError(InputError):
    """Requests that still failed after every retry; `failures` maps item index -> reason."""

    def __init__(self, failures: dict[int, str], total: int):
        self.failures = dict(sorted(failures.items()))
        shown = "; ".join(f"item {i}: {msg}" for i, msg in list(self.failures.items())[:3])
        more = f" (and {len(failures) - 3} more)" if len(failures) > 3 else ""
        super().__init__(f"{len(failures)} of {total} requests failed: {shown}{more}")


class MalformedResponse(Exception):
    """The server answered 2xx with a body that is not the expected JSON (retried)."""


class _RetryableStatus(Exception):
    pass


@dataclass(frozen=True)
class OpenAIConfig:
    base_url: str
    model: str | None = None  # None: the first id of GET /v1/models
    api_key: str | None = None  # None: $M3BENCH_API_KEY, then $OPENAI_API_KEY
    tokenizer: Path | None = None  # local tokenizer dir: exact lm-eval token split, chat templates, tokenize
    max_concurrency: int = 32
    timeout_s: float = 600.0  # per request (connect, read, write, pool)
    max_retries: int = 4  # retries after the first attempt
    backoff_base_s: float = 0.5  # wait base * 2**attempt, capped at backoff_max_s
    backoff_max_s: float = 16.0

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise InputError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        if self.max_concurrency < 1 or self.max_retries < 0 or self.timeout_s <= 0:
            raise InputError("max_concurrency >= 1, max_retries >= 0 and timeout_s > 0 are required")


def resolve_api_key(explicit: str | None) -> str | None:
    """The explicit key, else the first of $M3BENCH_API_KEY / $OPENAI_API_KEY that is set."""
    if explicit:
        return explicit
    return next((os.environ[k] for k in API_KEY_ENVS if os.environ.get(k)), None)


def api_root(base_url: str) -> str:
    """`http://h:p`, `http://h:p/` and `http://h:p/v1` all name the same API root `http://h:p/v1`."""
    root = base_url.rstrip("/")
    return root if root.endswith("/v1") else root + "/v1"


# ----------------------------------------------------------------------------- response parsing


def split_trailing_spaces(context: str, continuation: str) -> tuple[str, str]:
    """lm-eval's rule: trailing whitespace of the context belongs to the continuation."""
    n = len(context) - len(context.rstrip())
    return (context[:-n], context[-n:] + continuation) if n else (context, continuation)


def _logprobs_block(body: Any) -> dict[str, Any]:
    try:
        block = body["choices"][0]["logprobs"]
        if not isinstance(block["token_logprobs"], list) or not isinstance(block["top_logprobs"], list):
            raise TypeError("token_logprobs / top_logprobs are not lists")
        return block
    except (KeyError, IndexError, TypeError) as e:
        raise MalformedResponse(f"no choices[0].logprobs with token_logprobs and top_logprobs ({e!r})") from None


def continuation_start_from_offsets(offsets: Sequence[int], boundary_char: int, end_char: int) -> int:
    """Index of the token holding char `boundary_char` (the continuation's first); tokens end at `end_char`."""
    ends = list(offsets[1:]) + [end_char]
    return next((i for i, end in enumerate(ends) if end > boundary_char), len(offsets))


def score_from_logprobs(block: dict[str, Any], start: int, stop: int) -> ScoreResult:
    """Sum of token_logprobs[start:stop]; greedy when each is the max of its top_logprobs."""
    if not 0 < start < stop <= len(block["token_logprobs"]):
        raise MalformedResponse(f"continuation tokens [{start}:{stop}) outside the echoed prompt")
    total, greedy = 0.0, True
    for lp, top in zip(block["token_logprobs"][start:stop], block["top_logprobs"][start:stop]):
        if not isinstance(lp, (int, float)) or not isinstance(top, dict) or not top:
            raise MalformedResponse("a continuation token has no logprob or no top_logprobs")
        total += float(lp)
        greedy = greedy and float(lp) >= max(float(v) for v in top.values())
    return ScoreResult(logprob=total, is_greedy=greedy)


def score_from_text_offsets(body: Any, prompt: str, boundary_char: int) -> ScoreResult:
    """Score of the prompt's tokens from `boundary_char` on; generated tokens (offset >= len) ignored."""
    block = _logprobs_block(body)
    offsets = block.get("text_offset")
    if not isinstance(offsets, list) or len(offsets) != len(block["token_logprobs"]):
        raise MalformedResponse("echoed logprobs carry no text_offset per token (pass a local tokenizer)")
    n_prompt = sum(1 for o in offsets if o < len(prompt))
    start = continuation_start_from_offsets(offsets[:n_prompt], boundary_char, len(prompt))
    return score_from_logprobs(block, start, n_prompt)


def score_from_token_count(body: Any, n_context: int, n_prompt: int) -> ScoreResult:
    """Score of echoed tokens [n_context, n_prompt): the prompt was sent as token ids."""
    block = _logprobs_block(body)
    if len(block["token_logprobs"]) < n_prompt:
        raise MalformedResponse(f"echoed {len(block['token_logprobs'])} tokens, sent {n_prompt}")
    return score_from_logprobs(block, n_context, n_prompt)


def _finish_reason(raw: Any) -> str:
    if raw == "length":
        return "length"
    if raw in FINISH_STOP:
        return "stop"
    raise MalformedResponse(f"unexpected finish_reason {raw!r}")


def _usage(body: dict[str, Any]) -> tuple[int | None, int | None]:
    usage = body.get("usage") or {}
    return usage.get("prompt_tokens"), usage.get("completion_tokens")


def gen_result_from_completion(body: Any) -> GenResult:
    """GenResult of a /v1/completions answer."""
    try:
        choice = body["choices"][0]
        text = choice["text"]
        if not isinstance(text, str):
            raise TypeError("text is not a string")
    except (KeyError, IndexError, TypeError) as e:
        raise MalformedResponse(f"no choices[0].text ({e!r})") from None
    n_in, n_out = _usage(body)
    return GenResult(text, _finish_reason(choice.get("finish_reason")), n_in, n_out)


def gen_result_from_chat(body: Any) -> GenResult:
    """GenResult of a /v1/chat/completions answer (content only; reasoning fields are not the answer)."""
    try:
        choice = body["choices"][0]
        content = choice["message"]["content"]
        if content is not None and not isinstance(content, str):
            raise TypeError("content is not a string")
    except (KeyError, IndexError, TypeError) as e:
        raise MalformedResponse(f"no choices[0].message.content ({e!r})") from None
    n_in, n_out = _usage(body)
    return GenResult(content or "", _finish_reason(choice.get("finish_reason")), n_in, n_out)


# ----------------------------------------------------------------------------- the backend


class OpenAIBackend:
    """Evaluation backend over an OpenAI-compatible HTTP server."""

    name = "openai"

    def __init__(self, config: OpenAIConfig):
        self.config = config
        self._root = api_root(config.base_url)
        self._headers = {"Content-Type": "application/json"}
        key = resolve_api_key(config.api_key)
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        self._tokenizer = _load_tokenizer(config.tokenizer) if config.tokenizer else None
        self.model = config.model or self._first_model()
        self._score_max_tokens = 0  # set to 1 once a server refuses max_tokens=0

    # --- Backend protocol

    def generate(self, requests: Sequence[GenRequest], on_done: GenCallback) -> None:
        for i, r in enumerate(requests):
            if (r.prompt is None) == (r.messages is None):
                raise InputError(f"request {i}: a GenRequest needs exactly one of prompt or messages")
        self._run_all([lambda c, r=r: self._generate_one(c, r) for r in requests], on_done)

    def score(self, requests: Sequence[ScoreRequest], on_done: ScoreCallback) -> None:
        if self._tokenizer is None:
            if any(not r.context.strip() for r in requests):
                raise InputError("scoring with an empty context needs a local tokenizer (--tokenizer DIR)")
            self._run_all([lambda c, r=r: self._score_text(c, r) for r in requests], on_done)
            return
        pairs = [split_pair(self._tokenizer, r.context, r.continuation) for r in requests]
        empty = [i for i, (_, cont) in enumerate(pairs) if not cont]
        if empty:
            raise InputError(f"requests {empty[:5]}: the continuation has no tokens")
        self._run_all([lambda c, p=p: self._score_ids(c, *p) for p in pairs], on_done)

    def apply_chat_template(self, messages: Sequence[dict[str, str]], **kwargs: Any) -> str:
        kwargs.setdefault("add_generation_prompt", True)
        return self._need_tokenizer("apply_chat_template").apply_chat_template(
            list(messages), tokenize=False, **kwargs
        )

    def tokenize(self, text: str) -> list[int]:
        return list(self._need_tokenizer("tokenize").encode(text, add_special_tokens=False))

    def describe(self) -> dict[str, Any]:
        c = self.config
        return {
            "backend": self.name, "base_url": self._root, "model": self.model,
            "tokenizer": str(c.tokenizer) if c.tokenizer else None,
            "scoring_split": "local tokenizer (lm-eval)" if self._tokenizer else "server text_offset",
            "score_max_tokens": self._score_max_tokens, "max_concurrency": c.max_concurrency,
            "timeout_s": c.timeout_s, "max_retries": c.max_retries,
        }

    def close(self) -> None:
        """Nothing held between calls: each generate/score opens and closes its own client."""

    # --- requests

    async def _generate_one(self, client: httpx.AsyncClient, req: GenRequest) -> GenResult:
        payload: dict[str, Any] = {
            "model": self.model, "max_tokens": req.max_tokens, "temperature": req.temperature,
        }
        if req.stop:
            payload["stop"] = list(req.stop)
        if req.seed is not None:
            payload["seed"] = req.seed
        if req.messages is not None:
            payload["messages"] = [dict(m) for m in req.messages]
            if req.chat_template_kwargs:
                payload["chat_template_kwargs"] = dict(req.chat_template_kwargs)
            return await self._call(client, "/chat/completions", payload, gen_result_from_chat)
        payload["prompt"] = req.prompt
        return await self._call(client, "/completions", payload, gen_result_from_completion)

    async def _score_text(self, client: httpx.AsyncClient, req: ScoreRequest) -> ScoreResult:
        """Text prompt; the continuation's first token is found from the echoed text offsets."""
        context, continuation = split_trailing_spaces(req.context, req.continuation)
        prompt = context + continuation
        return await self._score_call(client, prompt, lambda b: score_from_text_offsets(b, prompt, len(context)))

    async def _score_ids(self, client: httpx.AsyncClient, ctx: list[int], cont: list[int]) -> ScoreResult:
        """Token-id prompt split as lm-eval does; the continuation is the last len(cont) tokens."""
        n = len(ctx) + len(cont)
        return await self._score_call(client, ctx + cont, lambda b: score_from_token_count(b, len(ctx), n))

    async def _score_call(self, client: httpx.AsyncClient, prompt: Any, parse: Callable) -> ScoreResult:
        payload = {"model": self.model, "prompt": prompt, "echo": True, "logprobs": 1, "temperature": 0}
        if self._score_max_tokens == 0:
            try:
                return await self._call(client, "/completions", {**payload, "max_tokens": 0}, parse)
            except _ClientError as e:  # some servers refuse max_tokens=0: fall back to 1 for good
                if e.status not in (400, 422):
                    raise
                self._score_max_tokens = 1
        return await self._call(client, "/completions", {**payload, "max_tokens": 1}, parse)

    # --- HTTP with retries

    async def _call(self, client: httpx.AsyncClient, path: str, payload: dict, parse: Callable) -> Any:
        """POST with retries; `parse(body)` raising MalformedResponse counts as a failed attempt."""
        for attempt in range(self.config.max_retries + 1):
            last = attempt == self.config.max_retries
            try:
                resp = await client.post(self._root + path, json=payload)
                return parse(_json_body(resp))
            except (httpx.TransportError, MalformedResponse, _RetryableStatus) as e:
                if last:
                    raise _Failed(f"{type(e).__name__}: {e} (after {attempt + 1} attempts)") from None
                await asyncio.sleep(self._backoff_s(attempt, e))
        raise AssertionError("unreachable")

    def _backoff_s(self, attempt: int, error: Exception) -> float:
        retry_after = getattr(error, "retry_after_s", None)
        if retry_after is not None:
            return min(retry_after, self.config.backoff_max_s)
        return min(self.config.backoff_base_s * 2**attempt, self.config.backoff_max_s)

    def _run_all(self, jobs: list[Callable[[httpx.AsyncClient], Awaitable[Any]]], on_done: Callable) -> None:
        failures = asyncio.run(self._gather(jobs, on_done))
        if failures:
            raise BackendRequestError(failures, len(jobs))

    async def _gather(self, jobs: list, on_done: Callable) -> dict[int, str]:
        c = self.config
        sem = asyncio.Semaphore(c.max_concurrency)
        failures: dict[int, str] = {}
        limits = httpx.Limits(max_connections=c.max_concurrency, max_keepalive_connections=c.max_concurrency)
        async with httpx.AsyncClient(headers=self._headers, timeout=httpx.Timeout(c.timeout_s), limits=limits) as client:

            async def one(i: int, job: Callable) -> None:
                async with sem:
                    try:
                        result = await job(client)
                    except (_Failed, _ClientError) as e:
                        failures[i] = str(e)
                        return
                on_done(i, result)

            # an exception of on_done propagates; asyncio.run then cancels the requests still running
            await asyncio.gather(*(one(i, job) for i, job in enumerate(jobs)))
        return failures

    def _first_model(self) -> str:
        """The first model id the server lists (GET /v1/models), with the same retries."""

        async def fetch() -> str:
            async with httpx.AsyncClient(headers=self._headers, timeout=httpx.Timeout(self.config.timeout_s)) as client:
                for attempt in range(self.config.max_retries + 1):
                    try:
                        return _first_model_id(_json_body(await client.get(self._root + "/models")))
                    except (httpx.TransportError, MalformedResponse, _RetryableStatus) as e:
                        if attempt == self.config.max_retries:
                            raise InputError(f"cannot list models at {self._root}/models: {e}") from None
                        await asyncio.sleep(self._backoff_s(attempt, e))
            raise AssertionError("unreachable")

        try:
            return asyncio.run(fetch())
        except _ClientError as e:
            raise InputError(f"cannot list models at {self._root}/models: {e}") from None

    def _need_tokenizer(self, what: str) -> Any:
        if self._tokenizer is None:
            raise InputError(f"the openai backend needs a local tokenizer (--tokenizer DIR) for {what}")
        return self._tokenizer


class _Failed(Exception):
    """An item that failed every attempt (collected into BackendRequestError)."""


class _ClientError(Exception):
    """A 4xx answer other than 408/429: the request itself is wrong, retrying will not help."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(f"HTTP {status}: {message}")


def _json_body(resp: httpx.Response) -> Any:
    """The decoded JSON of a 2xx answer; retryable or client errors otherwise."""
    if resp.status_code in RETRY_STATUSES or resp.status_code >= 500:
        err = _RetryableStatus(f"HTTP {resp.status_code}: {resp.text[:200]}")
        err.retry_after_s = _retry_after_s(resp)  # type: ignore[attr-defined]
        raise err
    if resp.status_code >= 400:
        raise _ClientError(resp.status_code, resp.text[:300])
    try:
        return resp.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise MalformedResponse(f"body is not JSON: {resp.text[:80]!r}") from None


def _retry_after_s(resp: httpx.Response) -> float | None:
    try:
        return float(resp.headers["retry-after"])
    except (KeyError, ValueError):
        return None


def _first_model_id(body: Any) -> str:
    try:
        return str(body["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise MalformedResponse(f"GET /models returned no data[0].id: {str(body)[:80]}") from None


def _load_tokenizer(path: Path) -> Any:
    from m3bench.runtime.tokenizer import load_hf_tokenizer

    if not Path(path).is_dir():
        raise InputError(f"tokenizer directory not found: {path}")
    return load_hf_tokenizer(path)
