"""m3bench: benchmarking and accuracy toolkit for MiniMax-M3."""

__version__ = "0.1.0"
