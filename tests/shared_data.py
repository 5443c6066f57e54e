"""Where the offline MMLU / GSM8K copies are: $M3BENCH_DATA, else ../shared/data beside the checkout."""

import os
from pathlib import Path

SHARED_DATA = Path(os.environ.get("M3BENCH_DATA") or Path(__file__).resolve().parents[1].parent / "shared" / "data")
