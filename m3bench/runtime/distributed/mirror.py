"""Mirrored calls: rank 0's stand-in for a module every rank holds (the target under speculation, the
Eagle3 draft), so a loop written for one process runs under TP unchanged.

Each call's arguments go to the other ranks first (a CALL header, an int64 descriptor on the control
group, then every tensor on the model group); then all ranks run the module. Tensors produced on rank
0 (draft tokens it sampled, features it gathered) are sent as they are; KV stores are named by code
(each rank has its own); a CaptureSpec is rank 0's alone (the other ranks' residuals are not read).

    runner.model = Mirrored(runner.model, Callee.TARGET, driver, {id(kv): Store.TARGET_KV})
    runner.draft(tok, pos, feature, meta, store)       # every rank runs the draft step
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import Any

import torch

from m3bench.runtime.attention.metadata import AttnMetadata
from m3bench.runtime.distributed.protocol import Op, broadcast0, send_header

DTYPES = (torch.int64, torch.int32, torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.bool,
          torch.uint8)


class Callee(IntEnum):
    TARGET = 0
    DRAFT = 1


class Method(IntEnum):
    FORWARD = 0
    LOGITS = 1  # compute_logits


class Store(IntEnum):
    TARGET_KV = 0
    DRAFT_KV = 1


class Kind(IntEnum):
    TENSOR = 1  # dtype code, ndim, *shape
    META = 2  # number of rows, query lens, seq lens; then its five tensors
    STORE = 3  # Store code
    NONE = 4  # None, or rank 0's CaptureSpec


class Mirrored:
    """Attribute reads go to the module; calls and compute_logits run on every rank."""

    def __init__(self, module: Any, callee: Callee, driver: Any, stores: dict[int, Store]) -> None:
        self.__dict__.update(_module=module, _callee=callee, _driver=driver, _stores=stores)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def __call__(self, *args: Any) -> Any:
        return self._driver.mirrored(self._callee, Method.FORWARD, encode(args, self._stores),
                                     lambda: self._module(*args))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._driver.mirrored(self._callee, Method.LOGITS, encode((hidden,), self._stores),
                                     lambda: self._module.compute_logits(hidden))


def encode(args: tuple, stores: dict[int, Store]) -> tuple[list[int], list[torch.Tensor]]:
    """(descriptor, tensors in the order the descriptor names them)."""
    desc, tensors = [len(args)], []
    for a in args:
        if isinstance(a, torch.Tensor):
            _tensor(a, desc, tensors)
        elif isinstance(a, AttnMetadata):
            b = a.num_seqs
            desc += [Kind.META, b, *a.query_lens_host, *a.seq_lens_host]
            for t in (a.query_start_loc, a.seq_lens, a.block_tables, a.slot_mapping, a.positions):
                _tensor(t, desc, tensors)
        elif id(a) in stores:
            desc += [Kind.STORE, stores[id(a)]]
        else:  # None or the capture spec
            desc.append(Kind.NONE)
    return desc, tensors


def _tensor(t: torch.Tensor, desc: list[int], tensors: list[torch.Tensor]) -> None:
    desc += [Kind.TENSOR, DTYPES.index(t.dtype), t.dim(), *t.shape]
    tensors.append(t.contiguous())


def send_call(control: Any, model_group: Any, callee: Callee, method: Method, desc: list[int],
              tensors: list[torch.Tensor]) -> None:
    send_header(control, Op.CALL, (callee, method, len(desc)))
    broadcast0(torch.tensor(desc, dtype=torch.int64), control)
    for t in tensors:
        broadcast0(t, model_group)


def receive_call(control: Any, model_group: Any, fields: list[int], device: torch.device,
                 stores: dict[Store, Any]) -> tuple[Callee, Method, list[Any]]:
    callee, method, n = fields[:3]
    desc = torch.zeros(n, dtype=torch.int64)
    broadcast0(desc, control)

    def recv(dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype, device=device)
        broadcast0(t, model_group)
        return t

    return Callee(callee), Method(method), decode(desc.tolist(), recv, stores)


def decode(desc: list[int], recv: Callable[[torch.dtype, list[int]], torch.Tensor], stores: dict[Store, Any]) -> list:
    at = [1]

    def take(n: int = 1) -> list[int]:
        out = desc[at[0]:at[0] + n]
        at[0] += n
        return out

    def tensor() -> torch.Tensor:
        kind, code, ndim = take(3)
        assert kind == Kind.TENSOR, "mirrored-call descriptor out of step"
        return recv(DTYPES[code], take(ndim))

    args: list[Any] = []
    for _ in range(desc[0]):
        kind = Kind(take()[0])
        if kind is Kind.TENSOR:
            at[0] -= 1
            args.append(tensor())
        elif kind is Kind.META:
            b = take()[0]
            q, s = take(b), take(b)
            qsl, lens, tables, slots, pos = (tensor() for _ in range(5))
            args.append(AttnMetadata(qsl, lens, tables, slots, pos, q, s))
        elif kind is Kind.STORE:
            args.append(stores[Store(take()[0])])
        else:
            args.append(None)
    return args


def mirror_spec_runner(driver: Any, runner: Any, kv: Any) -> None:
    """Put the speculative runner's target and draft behind Mirrored stand-ins; the other ranks get a
    draft KV pool like rank 0's."""
    store = runner.layout.store
    driver.alloc_draft(store.num_pages, store.page_size, kv.kv_dtype)
    stores = {id(kv): Store.TARGET_KV, id(store): Store.DRAFT_KV}
    runner.model = Mirrored(runner.model, Callee.TARGET, driver, stores)
    runner.draft = Mirrored(runner.draft, Callee.DRAFT, driver, stores)
