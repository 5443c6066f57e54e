"""Kernel launches counted in tests: each Triton kernel of the given modules wrapped so that `kernel[grid](...)`
records its name (and grid) before it runs."""

from __future__ import annotations


class _Counting:
    def __init__(self, name, kernel, launches: list, grids: bool):
        self.name, self.kernel, self.launches, self.grids = name, kernel, launches, grids

    def __getitem__(self, grid):
        self.launches.append((self.name, grid) if self.grids else self.name)
        return self.kernel[grid]


def recorded_launches(monkeypatch, modules, names=None, grids: bool = False) -> list:
    """The list each launch of the modules' kernels (`names`, default every `*_kernel`) is appended to, in order: its
    name, or (name, grid) with `grids`. monkeypatch undoes the wrapping."""
    launches: list = []
    for module in modules:
        for name in names or [n for n in dir(module) if n.endswith("_kernel")]:
            if hasattr(module, name):
                monkeypatch.setattr(module, name, _Counting(name, getattr(module, name), launches, grids))
    return launches
