"""An EngineConfig as `m3bench serve` flags (the sweep's --serve mode starts that command).

    serve_args(EngineConfig(model=Path("ckpt"), load_format=LoadFormat.DUMMY))   # ["--model", "ckpt", ...]

A field's flag is `--field-name` (m3bench/cli/engine_flags.py), but SERVE_FLAG's; booleans are
`--x` / `--no-x`; None is left out. tests/cli/test_engine_flags.py parses this list back through the CLI
and checks that the same EngineConfig comes out.
"""

from __future__ import annotations

from m3bench.runtime.engine_config import EngineConfig

SERVE_FLAG = {"tensor_parallel_size": "--tp", "enable_prefix_caching": "--prefix-caching"}
NO_FLAG = ("draft_page_size",)  # library-only settings: `m3bench serve` cannot be told them


def serve_args(cfg: EngineConfig) -> list[str]:
    """`m3bench serve` arguments that rebuild `cfg`."""
    args: list[str] = []
    for name, value in cfg.to_dict().items():
        if value is None:
            continue
        if name in NO_FLAG:
            raise ValueError(f"{name} has no `m3bench serve` flag")
        flag = SERVE_FLAG.get(name, "--" + name.replace("_", "-"))
        args += [flag if value else "--no-" + flag[2:]] if isinstance(value, bool) else [flag, str(value)]
    return args
