"""Accuracy protocols, one module each: `mmlu`, `mmlu-gen`, `gsm8k`, `gsm8k-chat`."""

from __future__ import annotations

from enum import Enum

from m3bench.evals.protocols.base import Protocol
from m3bench.evals.protocols.gsm8k import Gsm8k
from m3bench.evals.protocols.gsm8k_chat import Gsm8kChat
from m3bench.evals.protocols.mmlu import MmluLoglikelihood
from m3bench.evals.protocols.mmlu_gen import MmluGenerative


class Task(str, Enum):
    MMLU = "mmlu"
    MMLU_GEN = "mmlu-gen"
    GSM8K = "gsm8k"
    GSM8K_CHAT = "gsm8k-chat"


_PROTOCOLS: dict[Task, type[Protocol]] = {
    Task.MMLU: MmluLoglikelihood,
    Task.MMLU_GEN: MmluGenerative,
    Task.GSM8K: Gsm8k,
    Task.GSM8K_CHAT: Gsm8kChat,
}


def get_protocol(task: Task) -> Protocol:
    return _PROTOCOLS[task]()
