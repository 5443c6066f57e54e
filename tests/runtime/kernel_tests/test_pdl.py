"""Programmatic dependent launch (kernels/pdl_triton.py, backend.Pdl): the switch, the launch sites' keywords, and
the static race check (griddepcontrol.wait before any global access) on hand-written PTX and on every kernel
built for sm90."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from m3bench.runtime.kernels import backend
from m3bench.runtime.kernels.backend import Pdl, pdl_args, pdl_launch

from .pdl_checks import flag_problems, has_gdc, opcode_counts, trigger_side, wait_problems

SCRIPT = Path(__file__).with_name("sm90_compile.py")


def _gpu():
    """A stand-in for a CUDA tensor (this machine has none; backend.sm_capability is patched per test)."""
    return SimpleNamespace(is_cuda=True, device=SimpleNamespace(index=0))


@pytest.mark.parametrize("mode, code", [(Pdl.ON, 1), (Pdl.EARLY, 2)])
def test_pdl_on_for_cuda_sm90_when_chosen(monkeypatch, mode, code):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(backend, "sm_capability", lambda index: (9, 0))
    monkeypatch.setitem(backend.PDL, "launch", mode)
    assert pdl_launch(_gpu())
    assert pdl_args(_gpu()) == {"PDL": code, "launch_pdl": True}


def test_pdl_off_when_not_chosen_or_not_possible(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setitem(backend.PDL, "launch", Pdl.OFF)
    monkeypatch.setattr(backend, "sm_capability", lambda index: (9, 0))
    assert not pdl_launch(_gpu()) and pdl_args(_gpu()) == {"PDL": 0}  # not chosen
    monkeypatch.setitem(backend.PDL, "launch", Pdl.ON)
    assert not pdl_launch(torch.zeros(1)) and pdl_args(torch.zeros(1)) == {"PDL": 0}  # CPU
    monkeypatch.setattr(backend, "sm_capability", lambda index: (8, 9))
    assert not pdl_launch(_gpu())  # Ada: no griddepcontrol
    monkeypatch.setattr(backend, "sm_capability", lambda index: (10, 0))
    assert pdl_launch(_gpu())  # Blackwell has it too
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl_launch(_gpu()) and pdl_args(_gpu()) == {"PDL": 0}  # the interpreter runs no PTX


def test_pdl_mode_from_the_environment(monkeypatch):
    from m3bench.runtime.errors import InputError

    monkeypatch.delenv(backend.PDL_ENV_VAR, raising=False)
    assert backend.pdl_from_env() is backend.PDL_DEFAULT
    monkeypatch.setenv(backend.PDL_ENV_VAR, "early")
    assert backend.pdl_from_env() is Pdl.EARLY
    monkeypatch.setenv(backend.PDL_ENV_VAR, "yes")
    with pytest.raises(InputError, match="M3BENCH_PDL='yes'"):
        backend.pdl_from_env()


PTX = """
.visible .entry k(
	.param .u64 .ptr .global .align 1 k_param_0,
	.param .u32 k_param_1
)
{
	.reg .b32 	%r<12>;
$L__func_begin0:
	.loc	1 6 0
// %bb.0:
	ld.param.b32 	%r2, [k_param_1];
	ld.param.b64 	%rd1, [k_param_0];
$L__tmp0:
	mov.u32 	%r4, %ctaid.x;
	{HEAD}
	// begin inline asm
	griddepcontrol.wait ;
	// end inline asm
	griddepcontrol.launch_dependents ;
	@%p2 ld.global.b32 { %r7 }, [ %rd4 + 0 ];
	@!%p1 bra 	$L__BB0_2;
	@%p2 atom.global.gpu.acq_rel.add.f32 %r6, [ %rd5 + 0 ], %r7;
$L__BB0_2:
	ret;
$L__func_end0:
}
"""


@pytest.mark.parametrize("head", [
    "",
    "ld.shared.b32 %r1, [%r2];",  # shared memory: no other kernel's
    "st.shared::cta.b32 [%r2], %r1;",
    "cp.async.commit_group ;",  # no memory access of its own
    "mov.u32 %r3, 0x0; shl.b32 %r1, %r4, 7;",
])
def test_wait_first_passes(head):
    assert wait_problems(PTX.replace("{HEAD}", head)) == []


@pytest.mark.parametrize("head, why", [
    ("ld.global.b32 { %r3 }, [ %rd3 + 0 ];", "global access"),
    ("@%p1 st.global.v4.b32 [ %rd3 + 0 ], { %r1, %r2, %r3, %r4 };", "global access"),
    ("atom.global.gpu.acq_rel.add.s32 %r6, [ %rd5 + 0 ], 1;", "global access"),
    ("red.global.add.f32 [ %rd5 + 0 ], %r7;", "global access"),
    ("cp.async.cg.shared.global [ %r1 + 0 ], [ %rd3 + 0 ], 0x10, %r2;", "global access"),
    ("cp.async.bulk.prefetch.L2.global [%rd3], %r2;", "global access"),
    ("ld.u32 %r3, [%rd3];", "global access"),  # a generic address may be global
    ("@%p1 bra $L__BB0_2;", "branch"),
    ("$L__BB0_1:", "block label"),
])
def test_anything_global_or_a_branch_before_the_wait_fails(head, why):
    problems = wait_problems(PTX.replace("{HEAD}", head))
    assert len(problems) == 1 and why in problems[0], problems


def test_missing_or_predicated_wait_fails():
    assert wait_problems(PTX.replace("griddepcontrol.wait ;", "")) == ["no griddepcontrol.wait"]
    assert "predicated" in wait_problems(PTX.replace("griddepcontrol.wait", "@%p1 griddepcontrol.wait"))[0]


def test_trigger_side_and_presence():
    assert trigger_side(PTX) == "after" and has_gdc(PTX)
    early = PTX.replace("{HEAD}", "griddepcontrol.launch_dependents ;")
    assert trigger_side(early) == "before" and wait_problems(early) == []
    off = PTX.replace("griddepcontrol.wait ;", "").replace("griddepcontrol.launch_dependents ;", "")
    assert trigger_side(off) is None and not has_gdc(off)


def test_opcode_counts_ignore_the_gdc_instructions_and_the_order():
    on = PTX.replace("{HEAD}", "")
    off = on.replace("griddepcontrol.wait ;", "").replace("griddepcontrol.launch_dependents ;", "")
    moved = off.replace("mov.u32 \t%r4, %ctaid.x;", "").replace("ret;", "mov.u32 %r9, %ctaid.x;\n\tret;")
    assert opcode_counts(on) == opcode_counts(off) == opcode_counts(moved)  # moved: later, another register
    assert opcode_counts(PTX.replace("{HEAD}", "fma.rn.f32 %r1, %r2, %r3, %r4;")) != opcode_counts(on)


def test_flag_problems_name_every_mismatch():
    params = ["x_ptr", "N", "PDL"]
    ok = [("a_kernel", params, {"PDL": 1, "launch_pdl": True})]
    assert flag_problems(ok, 1) == []
    assert flag_problems([("a_kernel", params, {"PDL": 0})], 0) == []
    bad = [("a_kernel", params, {"PDL": 1}),  # waits, but launched plainly
           ("b_kernel", params, {"PDL": 0, "launch_pdl": True}),  # launched early, never waits: a race
           ("c_kernel", ["x_ptr"], {})]
    got = flag_problems(bad, 1)
    assert len(got) == 3 and "c_kernel: no PDL parameter" in got


def _run_script(*flags: str, timeout: int) -> subprocess.CompletedProcess:
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    return subprocess.run([sys.executable, str(SCRIPT), *flags], check=False, capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_every_launch_site_passes_pdl_consistently():
    """Every kernel's launches, recorded under each PDL mode: PDL == the mode's code, launch_pdl exactly when on,
    and every kernel of the Triton modules launched (sm90_compile.py --record-only: nothing compiles)."""
    proc = _run_script("--record-only", timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "launch flags: ok (25 kernels, 3 PDL modes)" in proc.stdout  # + the one-token MoE GEMVs (2026-12-06)


@pytest.mark.slow
def test_every_pdl_variant_waits_before_any_global_access():
    """The static race check: each recorded variant's PDL twin (and one early-trigger variant per kernel) built
    for sm90, griddepcontrol.wait first in its PTX (sm90_compile.py --pdl-only)."""
    proc = _run_script("--pdl-only", timeout=900)
    if "ptxas" in proc.stdout + proc.stderr and "not found" in proc.stdout + proc.stderr:
        pytest.skip("no ptxas in this triton install")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("race check:"))
    done, total = line.split()[2].split("/")
    assert done == total and int(total) >= 25 and "(25 kernels)" in line, line
