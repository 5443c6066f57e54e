"""An OpenAI-compatible HTTP server over AsyncLLM (FastAPI + uvicorn).

    app = create_app(AsyncLLM(llm), ServerConfig(model_name="tiny", max_model_len=4096, api_key=None))

Routes: POST /v1/completions, POST /v1/chat/completions (the checkpoint's chat template),
GET /v1/models, GET /health (never needs the key), GET /metrics (Prometheus text, `m3bench:` names).
Extensions to the OpenAI schema (as vLLM spells them): `ignore_eos`, `top_k`, `min_tokens`,
`return_token_ids` (each choice carries the ids of its new tokens), `chat_template_kwargs`.
Completions with `echo` and `logprobs` score the echoed prompt as vLLM does (first token's logprob null;
`max_tokens=0` scores the prompt only), which lm-eval's loglikelihood over the API needs.
Every error is a 4xx/5xx JSON `{"error": {"message", "type", "param", "code"}}` (server_errors.py; a 500
never carries the exception text); a client that disconnects aborts its request, which frees its KV pages.
Bounds: MAX_PROMPTS per request, MAX_STOP strings of MAX_STOP_CHARS, 64-bit seeds, JSON depth.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, AsyncIterator, Literal, Union

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from m3bench.bench.server_errors import ApiError, error_body, install_error_handlers, internal_error_body, parse_json_body
from m3bench.runtime.async_llm import EngineDead
from m3bench.runtime.errors import InputError

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_LOGPROBS = 20
DISCONNECT_POLL_S = 0.25
MAX_PROMPTS = 256  # prompts in one completions request
MAX_STOP = 16  # stop strings (OpenAI allows 4)
MAX_STOP_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
MAX_INT32 = 2**31 - 1  # token counts, top_k

Count = Annotated[int, Field(ge=0, le=MAX_INT32)]
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
TokenId = Annotated[int, Field(ge=0, le=MAX_INT32)]
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]  # what torch.Generator.manual_seed takes


@dataclass(frozen=True)
class ServerConfig:
    model_name: str
    max_model_len: int
    api_key: str | None = None


# ---- request schemas (unknown fields are an error, not silently dropped) --------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # "yes" is not a bool, "5" not an int


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Strict):
    model: str
    max_tokens: Count | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: Count = 0
    min_tokens: Count = 0
    stop: Union[StopString, Annotated[list[StopString], Field(max_length=MAX_STOP)], None] = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    seed: Seed | None = None
    n: Literal[1] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    user: str | None = None  # accepted for compatibility, not used
    presence_penalty: Literal[0, 0.0] = 0.0
    frequency_penalty: Literal[0, 0.0] = 0.0


class CompletionRequest(_Sampling):
    prompt: Union[str, list[TokenId], Annotated[list[str], Field(max_length=MAX_PROMPTS)],
                  Annotated[list[list[TokenId]], Field(max_length=MAX_PROMPTS)]]
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    max_tokens: Count | None = 16  # OpenAI's default for completions


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")  # image_url, ...: parts other than text are dropped
    type: str = "text"
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_calls, ... are passed to the template
    role: str
    content: Union[str, list[ContentPart], None] = None


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Count | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:  # as OpenAI and vLLM refuse it
            raise ValueError("top_logprobs needs logprobs: true")
        return self


# ---- the app ----------------------------------------------------------------------------------


def create_app(engine: Any, cfg: ServerConfig):
    """The FastAPI app serving `engine` (an AsyncLLM)."""
    app = FastAPI(title="m3bench serve", docs_url=None, redoc_url=None, openapi_url=None)
    state = _State(engine, cfg)

    async def require_key(request: Request) -> None:
        if not _authorized(request, cfg.api_key):
            raise ApiError(401, "missing or wrong API key", "AuthenticationError")

    api = APIRouter(dependencies=[Depends(require_key)])

    install_error_handlers(app)

    @app.get("/health")
    async def health():
        if not state.engine.alive:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        return {"status": "ok"}

    @api.get("/v1/models")
    async def models():
        card = {"id": cfg.model_name, "object": "model", "created": state.created, "owned_by": "m3bench",
                "max_model_len": cfg.max_model_len}
        return {"object": "list", "data": [card]}

    @api.get("/metrics")
    async def metrics():
        return PlainTextResponse(prometheus_text(await engine.stats(), state), media_type="text/plain; version=0.0.4")

    @api.post("/v1/completions")
    async def completions(request: Request):
        req = await _parse(request, CompletionRequest, cfg)
        job = state.completion_job(req)
        if req.stream:
            return StreamingResponse(job.sse(), media_type="text/event-stream")
        return JSONResponse(await _unless_disconnected(request, job.full()))

    @api.post("/v1/chat/completions")
    async def chat(request: Request):
        req = await _parse(request, ChatRequest, cfg)
        job = state.chat_job(req)
        if req.stream:
            return StreamingResponse(job.sse(), media_type="text/event-stream")
        return JSONResponse(await _unless_disconnected(request, job.full()))

    app.include_router(api)
    return app


def _authorized(request: Any, api_key: str | None) -> bool:
    if not api_key:
        return True
    sent = request.headers.get("authorization", "").encode("utf-8", "surrogateescape")
    return hmac.compare_digest(sent, f"Bearer {api_key}".encode())  # constant time: no timing oracle on the key


async def _parse(request: Any, schema: type[BaseModel], cfg: ServerConfig) -> Any:
    """Body -> schema, or a 4xx: too large (413), not JSON / not the schema (400), unknown model (404)."""
    body = parse_json_body(await _read_body(request))
    try:
        req = schema.model_validate(body)
    except ValidationError as e:
        raise ApiError(400, _validation_message(e), param=_first_param(e)) from e
    if req.model != cfg.model_name:
        raise ApiError(404, f"The model `{req.model}` does not exist (serving `{cfg.model_name}`).", "NotFoundError")
    return req


async def _read_body(request: Any) -> bytes:
    """The body, refused (413) as soon as it is known to pass MAX_BODY_BYTES, declared or streamed."""
    too_big = ApiError(413, f"request body over {MAX_BODY_BYTES} bytes", "RequestTooLarge")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_big
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > MAX_BODY_BYTES:
            raise too_big
        parts.append(part)
    return b"".join(parts)


def _validation_message(e: ValidationError) -> str:
    parts = [f"{'.'.join(str(x) for x in err['loc']) or 'body'}: {err['msg']}" for err in e.errors()[:5]]
    return "invalid request: " + "; ".join(parts)


def _first_param(e: ValidationError) -> str | None:
    errors = e.errors()
    return str(errors[0]["loc"][0]) if errors and errors[0]["loc"] else None


async def _unless_disconnected(request: Any, work: Any) -> Any:
    """Await `work`, cancelling it (so its requests abort) if the client goes away first."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            raise ApiError(499, "client disconnected", "ClientClosedRequest")


# ---- turning requests into engine work ----------------------------------------------------------


@dataclass
class _Counters:
    requests: int = 0
    failed: int = 0


class _State:
    def __init__(self, engine: Any, cfg: ServerConfig) -> None:
        import copy

        if engine.tokenizer is None:
            raise InputError("m3bench serve needs the checkpoint's tokenizer (tokenizer.json) in the model directory")
        self.engine, self.cfg = engine, cfg
        self.tokenizer = copy.deepcopy(engine.tokenizer)  # the engine thread owns the original
        self.vocab_size = engine.config.vocab_size
        self.created = int(time.time())
        self.counters = _Counters()

    def completion_job(self, req: CompletionRequest) -> "_Job":
        prompts = self._prompt_ids(req.prompt)
        if req.stream and len(prompts) != 1:
            raise ApiError(400, "stream supports a single prompt")
        if req.stream and req.echo and req.logprobs is not None:
            raise ApiError(400, "echo with logprobs (prompt logprobs) is not supported with stream")
        job = _Job(self, req, prompts, chat=False)
        job.echo_texts = [p if isinstance(p, str) else self.tokenizer.decode(ids)
                          for p, ids in zip(_prompt_items(req.prompt), prompts)]
        return job

    def chat_job(self, req: ChatRequest) -> "_Job":
        messages = [_plain_message(m) for m in req.messages]
        kwargs = dict(req.chat_template_kwargs or {})
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=req.add_generation_prompt, **kwargs)
        except Exception as e:  # template errors (unknown role, bad kwarg) are the caller's
            raise ApiError(400, f"chat template failed: {e}") from e
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return _Job(self, req, [ids], chat=True)

    def _prompt_ids(self, prompt: Any) -> list[list[int]]:
        items = _prompt_items(prompt)
        out = [self.tokenizer.encode(p, add_special_tokens=True) if isinstance(p, str) else list(p) for p in items]
        for ids in out:
            if not ids:
                raise ApiError(400, "empty prompt")
            if min(ids) < 0 or max(ids) >= self.vocab_size:
                raise ApiError(400, f"prompt token ids must be in [0, {self.vocab_size})")
        return out

    def sampling_params(self, req: Any, prompt_len: int) -> Any:
        """SamplingParams of one prompt; the prompt plus max_tokens must fit the context (else 400)."""
        from m3bench.runtime import SamplingParams

        limit = self.cfg.max_model_len
        asked = getattr(req, "max_completion_tokens", None)
        asked = req.max_tokens if asked is None else asked
        if prompt_len >= limit or (asked is not None and prompt_len + asked > limit):
            raise ApiError(400, f"This model's maximum context length is {limit} tokens; the request has "
                                f"{prompt_len} prompt tokens and asks for {asked} more.")
        try:
            return SamplingParams(
                max_tokens=limit - prompt_len if asked is None else asked, temperature=req.temperature,
                top_k=req.top_k, top_p=req.top_p, seed=req.seed, stop=_stops(req.stop),
                stop_token_ids=tuple(req.stop_token_ids or ()), ignore_eos=req.ignore_eos,
                logprobs=_logprobs_asked(req), min_tokens=req.min_tokens, prompt_logprobs=_prompt_logprobs_asked(req))
        except InputError as e:
            raise ApiError(400, str(e)) from e


def _prompt_items(prompt: Any) -> list:
    """A completions `prompt` as a list of prompts (each a string or a list of token ids)."""
    return prompt if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else [prompt]


def _plain_message(m: ChatMessage) -> dict:
    """A message for the template: list-of-parts content joined into its text parts."""
    out = m.model_dump(exclude_none=True)
    if isinstance(m.content, list):
        out["content"] = "".join(p.text or "" for p in m.content if p.type == "text")
    return out


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    return () if stop is None else (stop,) if isinstance(stop, str) else tuple(stop)


def _prompt_logprobs_asked(req: Any) -> int | None:
    """Completions with echo and logprobs score the echoed prompt too (vLLM's prompt_logprobs)."""
    return req.logprobs if isinstance(req, CompletionRequest) and req.echo else None


def _logprobs_asked(req: Any) -> int | None:
    if isinstance(req, ChatRequest):
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs


class _Job:
    """One HTTP request: its prompts, their sampling params, and the two ways of answering."""

    def __init__(self, state: _State, req: Any, prompts: list[list[int]], chat: bool) -> None:
        self.state, self.req, self.prompts, self.chat = state, req, prompts, chat
        self.echo_texts: list[str] = []  # completions with echo: the prompts as text
        self.params = [state.sampling_params(req, len(p)) for p in prompts]
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        state.counters.requests += 1

    def _envelope(self, choices: list[dict], usage: dict | None, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        body = {"id": self.id, "object": kind, "created": self.created, "model": self.state.cfg.model_name,
                "choices": choices}
        if usage is not None or not chunk:
            body["usage"] = usage
        return body

    async def _collect(self, index: int) -> dict:
        """Run one prompt to the end; its choice plus token counts."""
        ids: list[int] = []
        text, lps, tops, reason, p_lps, p_tops = [], [], [], None, [], []
        async for d in self.state.engine.generate(self.prompts[index], self.params[index]):
            ids += d.token_ids
            text.append(d.text)
            lps += d.logprobs
            tops += d.top_logprobs
            p_lps += d.prompt_logprobs
            p_tops += d.prompt_top_logprobs
            reason = d.finish_reason if d.finished else reason
        return {"ids": ids, "text": "".join(text), "lps": lps, "tops": tops, "reason": reason,
                "prompt_lps": p_lps, "prompt_tops": p_tops}

    async def full(self) -> dict:
        try:
            results = await asyncio.gather(*(self._collect(i) for i in range(len(self.prompts))))
        except InputError as e:
            self.state.counters.failed += 1
            raise ApiError(400, str(e)) from e
        except EngineDead as e:
            self.state.counters.failed += 1
            raise ApiError(503, str(e), "ServiceUnavailableError") from e
        choices = [self._choice(i, r) for i, r in enumerate(results)]
        return self._envelope(choices, self._usage(sum(len(r["ids"]) for r in results)), chunk=False)

    def _choice(self, index: int, r: dict) -> dict:
        if self.chat:
            choice = {"index": index, "message": {"role": "assistant", "content": r["text"]},
                      "logprobs": self._chat_logprobs(r["ids"], r["lps"], r["tops"]), "finish_reason": r["reason"]}
        else:
            prefix = self.echo_texts[index] if self.req.echo else ""
            choice = {"index": index, "text": prefix + r["text"], "finish_reason": r["reason"],
                      "logprobs": self._completion_logprobs(r["ids"], r["lps"], r["tops"], len(prefix))}
            if self.req.echo and choice["logprobs"] is not None:
                choice["logprobs"] = _join_blocks(self._echo_logprobs(index, r), choice["logprobs"])
        if self.req.return_token_ids:
            choice["token_ids"] = r["ids"]
        return choice

    def _usage(self, completion_tokens: int) -> dict:
        prompt = sum(len(p) for p in self.prompts)
        return {"prompt_tokens": prompt, "completion_tokens": completion_tokens, "total_tokens": prompt + completion_tokens}

    # ---- logprobs in the two OpenAI formats ----

    def _piece(self, token_id: int) -> str:
        return self.state.tokenizer.decode([token_id])

    def _completion_logprobs(self, ids: list[int], lps: list[float], tops: list, offset: int = 0) -> dict | None:
        """The legacy completions format: tokens, token_logprobs, top_logprobs (dicts), text_offset."""
        if self.req.logprobs is None:
            return None
        pieces = [self._piece(t) for t in ids]
        offsets = [offset + sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
        top = [{self._piece(t): lp for t, lp in row} for row in tops] if self.req.logprobs else [None] * len(ids)
        return {"tokens": pieces, "token_logprobs": list(lps), "top_logprobs": top, "text_offset": offsets}

    def _echo_logprobs(self, index: int, r: dict) -> dict:
        """The echoed prompt's block: the first token's logprob is null; alternatives hold the token itself."""
        ids = self.prompts[index]
        if len(r["prompt_lps"]) != len(ids) - 1:
            raise ApiError(500, f"engine returned {len(r['prompt_lps'])} prompt logprobs for {len(ids)} tokens",
                           "InternalServerError")
        top: list[dict | None] = [None]
        for t, lp, row in zip(ids[1:], r["prompt_lps"], r["prompt_tops"]):
            alts = {self._piece(a): alp for a, alp in row}
            alts.setdefault(self._piece(t), lp)
            top.append(alts)
        return {"tokens": [self._piece(t) for t in ids], "token_logprobs": [None, *r["prompt_lps"]],
                "top_logprobs": top, "text_offset": self._prompt_offsets(ids)}

    def _prompt_offsets(self, ids: list[int]) -> list[int]:
        """Where each prompt token's text starts in the prompt as decoded (special tokens add no text)."""
        from m3bench.runtime.sequence import Detokenizer

        detok, offsets, at = Detokenizer(self.state.tokenizer, []), [], 0
        for t in ids:
            offsets.append(at)
            at += len(detok.add(t))
        return offsets

    def _chat_logprobs(self, ids: list[int], lps: list[float], tops: list) -> dict | None:
        if not self.req.logprobs:
            return None
        content = []
        for t, lp, row in zip(ids, lps, tops):
            piece = self._piece(t)
            alts = [{"token": self._piece(a), "logprob": alp, "bytes": list(self._piece(a).encode())} for a, alp in row]
            content.append({"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": alts})
        return {"content": content}

    # ---- streaming ----

    async def sse(self) -> AsyncIterator[str]:
        """Server-sent events: one chunk per engine step with new text, usage on the last one, [DONE]."""
        sent, offset = 0, 0
        try:
            if self.chat:
                yield _sse(self._envelope([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}], None, chunk=True))
            elif self.req.echo:
                prompt_text = self.echo_texts[0]
                yield _sse(self._envelope([{"index": 0, "text": prompt_text, "logprobs": None, "finish_reason": None}],
                                          None, chunk=True))
            async for d in self.state.engine.generate(self.prompts[0], self.params[0]):
                sent += len(d.token_ids)
                usage = self._usage(sent) if d.finished else None
                if not d.token_ids and not d.text and not d.finished:
                    continue
                yield _sse(self._envelope([self._stream_choice(d, offset)], usage, chunk=True))
                offset += len(d.text)
            if self.req.stream_options and self.req.stream_options.include_usage:
                yield _sse(self._envelope([], self._usage(sent), chunk=True))
        except InputError as e:
            self.state.counters.failed += 1
            yield _sse(error_body(400, str(e)))
        except Exception as e:  # headers are gone: the error travels in the stream (its text only in the log)
            self.state.counters.failed += 1
            yield _sse(internal_error_body(e))
        yield "data: [DONE]\n\n"

    def _stream_choice(self, d: Any, offset: int) -> dict:
        ids, lps, tops = list(d.token_ids), list(d.logprobs), list(d.top_logprobs)
        if self.chat:
            choice = {"index": 0, "delta": {"content": d.text}, "logprobs": self._chat_logprobs(ids, lps, tops),
                      "finish_reason": d.finish_reason}
        else:
            choice = {"index": 0, "text": d.text, "finish_reason": d.finish_reason,
                      "logprobs": self._completion_logprobs(ids, lps, tops, offset)}
        if self.req.return_token_ids:
            choice["token_ids"] = ids
        return choice


def _join_blocks(first: dict, second: dict) -> dict:
    return {k: list(first[k]) + list(second[k]) for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


# ---- /metrics -------------------------------------------------------------------------------------

PREFIX = "m3bench:"


def prometheus_text(stats: Any, state: _State) -> str:
    """Prometheus exposition text of the engine's gauges and counters (vLLM's names, `m3bench:` prefix)."""
    rows = [
        ("gauge", "num_requests_running", "Requests in the running batch", stats.num_running),
        ("gauge", "num_requests_waiting", "Requests waiting to be scheduled", stats.num_waiting),
        ("gauge", "kv_cache_pages_in_use", "KV pages held by requests", stats.kv_pages_in_use),
        ("gauge", "kv_cache_pages_total", "KV pages in the pool", stats.kv_pages_total),
        ("gauge", "kv_cache_usage_perc", "Fraction of KV pages in use", stats.kv_pages_in_use / max(stats.kv_pages_total, 1)),
        ("counter", "requests_total", "HTTP generation requests received", state.counters.requests),
        ("counter", "request_failure_total", "HTTP generation requests that failed", state.counters.failed),
        ("counter", "request_success_total", "Engine requests finished", stats.requests_finished_total),
        ("counter", "request_abort_total", "Requests aborted (client gone)", stats.requests_aborted_total),
        ("counter", "prompt_tokens_total", "Prompt tokens admitted", stats.prompt_tokens_total),
        ("counter", "generation_tokens_total", "Tokens generated", stats.generation_tokens_total),
        ("counter", "prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache",
         stats.prefix_queried_tokens),
        ("counter", "prefix_cache_hits_total", "Prompt tokens served by the prefix cache", stats.prefix_hit_tokens),
        ("counter", "spec_decode_num_drafts_total", "Verify steps with a draft", stats.spec_drafts),
        ("counter", "spec_decode_num_draft_tokens_total", "Draft tokens proposed", stats.spec_draft_tokens),
        ("counter", "spec_decode_num_accepted_tokens_total", "Draft tokens accepted", stats.spec_accepted_tokens),
    ]
    lines = []
    for kind, name, help_text, value in rows:
        lines += [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} {kind}", f"{PREFIX}{name} {value}"]
    info = f"{PREFIX}cache_config_info"  # vLLM's info metric: the KV page size in a label
    lines += [f"# HELP {info} KV cache configuration", f"# TYPE {info} gauge",
              f'{info}{{block_size="{stats.page_tokens}",enable_prefix_caching="{stats.prefix_caching}"}} 1']
    per_pos = f"{PREFIX}spec_decode_num_accepted_tokens_per_pos_total"
    lines += [f"# HELP {per_pos} Draft tokens accepted at each position", f"# TYPE {per_pos} counter"]
    lines += [f'{per_pos}{{position="{k}"}} {v}' for k, v in enumerate(stats.spec_accepted_per_pos)]
    return "\n".join(lines) + "\n"


# ---- running it -----------------------------------------------------------------------------------


def uvicorn_server(app: Any, host: str, port: int, log_level: str = "warning") -> Any:
    """A uvicorn.Server for `app` (call .run(), or run it on a thread and set .should_exit)."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=5)
    return uvicorn.Server(config)
