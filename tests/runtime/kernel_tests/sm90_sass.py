"""The sm90 SASS of every recorded variant of the named kernels, one file a variant, to tell whether a source change
changes the code a GPU runs (no GPU needed). Run it before and after the change, then `diff -r BEFORE AFTER`:

    python tests/runtime/kernel_tests/sm90_sass.py /tmp/sass_before mx_gemv_kernel moe_gemv_down_kernel
    (change the kernels' source)
    python tests/runtime/kernel_tests/sm90_sass.py /tmp/sass_after mx_gemv_kernel moe_gemv_down_kernel
    diff -r /tmp/sass_before /tmp/sass_after && echo "the same machine code"

The launches are sm90_compile.py's (the wrappers at M3 per-GPU shapes, PDL off and on); each variant's file is named
by its kernel and a hash of its constexprs and argument types, and holds its SASS instructions (cuobjdump -sass, the
comments and headers left out). Identical files mean the GPU runs the same instructions in the same order, so a
timing taken before the change stands. Run without TRITON_INTERPRET; exit 2 when a name is no recorded kernel.
"""

import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # sm90_compile.py, beside this script
import sm90_compile

from m3bench.runtime.kernels import backend

_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4}\*/\s+(.*?)\s*;?\s*(/\*.*)?$")


def cuobjdump() -> str:
    """The cuobjdump that Triton's NVIDIA backend ships (beside its ptxas), else the one on PATH."""
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else "cuobjdump"


def sass_lines(cubin: bytes) -> list[str]:
    """The instructions of a cubin's SASS, one a line, with their offsets (/*0010*/)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([cuobjdump(), "-sass", f.name], check=True, capture_output=True, text=True).stdout
    return [line.strip() for line in text.splitlines() if _INSTRUCTION.match(line)]


def variant_name(fn, args, kwargs) -> str:
    key = repr(sm90_compile.variant_key(fn, args, kwargs))
    return f"{fn.__name__}-{hashlib.sha1(key.encode()).hexdigest()[:12]}.sass"


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: sm90_sass.py OUT_DIR KERNEL [KERNEL ...]", file=sys.stderr)
        return 2
    out, names = Path(argv[0]), set(argv[1:])
    runs = sm90_compile.record_modes((4,))  # wraps the kernels: kernel_names() after it
    unknown = names - sm90_compile.kernel_names()
    if unknown:
        print(f"no such kernel: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    launches = [v for mode in (backend.Pdl.OFF, backend.Pdl.ON) for v in sm90_compile.variants(runs[mode])
                if v[0].__name__ in names]
    for fn, args, kwargs in launches:
        compiled = sm90_compile.compile_launch(fn, args, dict(kwargs))
        (out / variant_name(fn, args, kwargs)).write_text("\n".join(sass_lines(compiled.asm["cubin"])) + "\n")
    print(f"{len(launches)} variants of {len(names)} kernels written to {out}")
    return 0 if launches else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
