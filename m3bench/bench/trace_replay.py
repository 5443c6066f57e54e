"""One sweep point of a trace replay: which requests go (those longer than the context are counted and
skipped, never truncated), their prompts, when they are sent, and the point's trace figures.

    plan = plan_trace_point(spec, tokenizer, max_model_len=4096, num_warmup=2, seed=7)
    plan.prompts, plan.warmup, plan.arrivals_s
    plan.figures(engine_page_tokens=128)   # skipped count, block reuse, possible prefix hit rate

Warm-up prompts have the shapes of the window's first requests but their own tokens (another salt),
so they share no block with the measured ones. Every (point, repeat) gets its own salt too: a rerun
on the same engine must not find the previous run's pages in the prefix cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from m3bench.bench.metrics import possible_prefix_hits, prefix_hit_rate, trace_block_reuse
from m3bench.bench.trace import TraceRequest, TraceSpec, fits, trace_prompts
from m3bench.bench.workload import WorkloadPrompt
from m3bench.runtime.errors import InputError

WARMUP_SALT = 1 << 20  # added to the point's salt for its warm-up prompts


@dataclass(frozen=True)
class TracePlan:
    spec: TraceSpec
    sent: tuple[TraceRequest, ...]  # the window's requests that fit the context, in trace order
    num_skipped: int  # longer (prompt + output) than the engine's context
    max_model_len: int | None
    warmup: tuple[WorkloadPrompt, ...]
    prompts: tuple[WorkloadPrompt, ...]
    arrivals_s: tuple[float, ...] | None  # None: all at once behind the concurrency cap
    num_text_len_mismatch: int | None = None  # text prompts: how many re-encode (client tokenizer) to another length

    def figures(self, engine_page_tokens: int | None) -> dict:
        """The point's trace fields: skipped requests, block reuse, the prefix hit rate possible.

        The possible rate is counted in the engine's pages when it says their size, else in trace blocks."""
        page = engine_page_tokens or self.spec.block_tokens
        return {"trace_requests": len(self.sent) + self.num_skipped, "num_skipped_too_long": self.num_skipped,
                "max_model_len": self.max_model_len, "trace_block_tokens": self.spec.block_tokens,
                "prefix_page_tokens": page, "trace_block_reuse": trace_block_reuse(self.sent),
                "num_text_len_mismatch": self.num_text_len_mismatch,
                "prefix_hit_rate_possible": prefix_hit_rate(possible_prefix_hits(self.sent, self.spec.block_tokens,
                                                                                 page))}


def plan_trace_point(spec: TraceSpec, tokenizer: Any, max_model_len: int | None, num_warmup: int, seed: int,
                     salt: int = 0, with_text: bool = False) -> TracePlan:
    """The point's requests and prompts (see the module docstring); InputError when none fits."""
    window = spec.window()
    sent = [r for r in window if fits(r, max_model_len)]
    if not sent:
        raise InputError(f"{spec.path}: none of the {len(window)} requests in the window fits max_model_len "
                         f"{max_model_len} (try a smaller --trace-scale)")
    prompts = trace_prompts(tokenizer, sent, spec.block_tokens, seed, salt, with_text)
    warm_reqs = [sent[i % len(sent)] for i in range(num_warmup)]
    warm = trace_prompts(tokenizer, warm_reqs, spec.block_tokens, seed, salt + WARMUP_SALT, with_text)
    arrivals = spec.arrivals_s(sent)
    return TracePlan(spec, tuple(sent), len(window) - len(sent), max_model_len, tuple(warm), tuple(prompts),
                     None if arrivals is None else tuple(arrivals),
                     text_len_mismatches(tokenizer, prompts) if with_text else None)


def text_len_mismatches(tokenizer: Any, prompts: list[WorkloadPrompt]) -> int:
    """Prompts whose text, encoded again by the client's tokenizer, is not their token count (merges across
    block boundaries): the lengths a text-only server sees may differ too (its usage counts say by how much)."""
    again = tokenizer(list(p.text for p in prompts), add_special_tokens=False)["input_ids"]
    return sum(len(ids) != p.prompt_len for ids, p in zip(again, prompts))


def window_lengths(spec: TraceSpec) -> tuple[int, int]:
    """(mean input, mean output) length of the window, rounded: the point's ISL / OSL labels."""
    window = spec.window()
    return (round(sum(r.input_len for r in window) / len(window)),
            round(sum(r.output_len for r in window) / len(window)))
