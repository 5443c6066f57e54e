"""Kernel modules imported after `import triton` still honour TRITON_INTERPRET; the wrappers
fall back to torch on CPU without importing triton at all."""

import subprocess
import sys

import torch

from m3bench.runtime.kernels.attention import paged_attention
from m3bench.runtime.kernels.reference import paged_attention_ref

from .cases import make_case

PROBE = """
import os, sys, triton  # triton first, as another test of the same process might
os.environ["TRITON_INTERPRET"] = "1"
from m3bench.runtime.kernels import attention_triton
from triton.runtime.interpreter import InterpretedFunction
assert isinstance(attention_triton.paged_attn_kernel, InterpretedFunction)
"""

NO_TRITON = """
import sys, torch
from m3bench.runtime.kernels import attention, msa_index, moe, kv_quant
assert "triton" not in sys.modules, "importing the wrappers must not import triton"
"""


def test_late_env_var_turns_interpreter_on():
    proc = subprocess.run([sys.executable, "-c", PROBE], check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_wrappers_import_no_triton():
    proc = subprocess.run([sys.executable, "-c", NO_TRITON], check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_cpu_auto_backend_is_the_reference():
    case = make_case(30, q_lens=[2, 1], seq_lens=[20, 33])
    got = paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                          case.query_start_loc, 0.2)
    want = paged_attention_ref(case.q, case.k_cache, case.v_cache, case.block_tables,
                               case.seq_lens, case.query_start_loc, 0.2)
    assert torch.equal(got[:case.n_tokens], want[:case.n_tokens])
