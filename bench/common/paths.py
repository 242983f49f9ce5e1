"""Where the benchmarks read and write: the repository, and bench/results/<kind>/ by the kind of question (speed and
memory, learning experiments, device checks)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
PERF, LEARNING, DEVICE = RESULTS / "perf", RESULTS / "learning", RESULTS / "device"
