"""Programmatic dependent launch (PDL, Hopper+) in the runtime's Triton kernels: the one helper every kernel
calls first.

A kernel launched with `launch_pdl=True` may start while the kernel before it in the stream is still
running (its launch and ramp overlap that kernel's tail). `griddepcontrol.wait` then blocks until the previous
kernel has completed and its memory is visible, so nothing global (load, store, atomic) may come before it:
`pdl_wait(PDL)` is the first statement of every kernel, and the launch passes `**backend.pdl_args(t)` (PDL and
launch_pdl together). PDL codes (backend.PDL_CODE): 0 off (no instruction at all: the interpreter and other
GPUs compile what they did before), 1 wait, then let the next kernel launch; 2 let the next kernel launch,
then wait (its launch overlaps this whole kernel; it still waits for this one to complete before its own
first access).
"""

import triton
import triton.language as tl


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait for the previous kernel of the stream (PDL 1, 2) and let the next one launch (PDL 2: before the wait)."""
    if PDL == 2:
        tl.extra.cuda.gdc_launch_dependents()
    if PDL != 0:
        tl.extra.cuda.gdc_wait()
    if PDL == 1:
        tl.extra.cuda.gdc_launch_dependents()
