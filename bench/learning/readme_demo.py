"""The README's demo block, written from a real `make demo` run so that it cannot drift from one: the run's JSON
(runs/demo/critic_alignment.json) kept with the machine it ran on as bench/results/learning/demo_readme.json, its
curves as docs/img/demo.png, and between the README's demo-output markers one line of result, then the table and
the expected-range lines `make demo` printed (bench/learning/report.py renders them from the JSON).
tests/repo/test_readme.py renders the block again from the kept JSON and fails when the README differs.

    make demo && python -m bench.learning.readme_demo
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import shutil
from datetime import date
from pathlib import Path

from bench.common.paths import LEARNING, REPO
from bench.common.readme import with_block
from bench.common.record import command_line, write_record
from bench.learning.report import print_expected, print_table

README = REPO / "README.md"
KEPT = LEARNING / "demo_readme.json"
EXPECTED = LEARNING / "demo_expected.json"
BLOCK = "demo-output"  # the README block this script writes (bench.common.readme)


def machine() -> dict:
    """Where the run happened: the CPU, and the kernel set torch chose (AVX-512 or AVX2 kernels train differently)."""
    import torch

    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    cpu = names[0] if names else platform.processor()
    return {"cpu": cpu, "kernels": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}


def render(kept: dict, expected: dict) -> str:
    """The README block: a line of result, then the table and the range check as `make demo` prints them."""
    arms = {r["arm"]: r["result"] for r in kept["runs"]}
    shift, noshift = arms["shift"], arms["noshift"]
    where = kept["machine"]
    line = (
        f"Validation accuracy {shift['accuracy_start']:.1%} before PPO; after 40 steps {shift['accuracy_final']:.1%} "
        f"with aligned values and {noshift['accuracy_final']:.1%} with values one token late (one run each; "
        f"{where['cpu']}, torch's {where['kernels']} kernels, {kept['date']}). What `make demo` printed:"
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_table(kept["summary"])
        print_expected(kept["runs"], expected)
    return f"{line}\n\n```{out.getvalue().rstrip()}\n```"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default="runs/demo/critic_alignment.json", help="the JSON `make demo` wrote")
    args = parser.parse_args()
    run = json.loads((REPO / args.run).read_text())
    kept = {"date": date.today().isoformat(), "machine": machine(), "runs": run["runs"], "summary": run["summary"]}
    kept = write_record(KEPT, kept, "make demo && " + command_line())  # the README renders what was kept
    shutil.copyfile(REPO / Path(args.run).with_suffix(".png"), REPO / "docs" / "img" / "demo.png")
    README.write_text(with_block(README.read_text(), BLOCK, render(kept, json.loads(EXPECTED.read_text()))))
    print(f"wrote {KEPT.relative_to(REPO)} and README.md's demo block")


if __name__ == "__main__":
    main()
