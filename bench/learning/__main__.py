"""Every learning experiment of bench/learning/ as its spec states it: the command that runs it, its question, arms,
seeds and record; ``--dry-run`` also plans each one's runs through the driver (every config loaded) and prints them.

    python -m bench.learning [--dry-run]
"""

from __future__ import annotations

import argparse
import importlib

from bench.learning.driver import Suite, arm_overrides, parser, plan

MODULES = ["critic", "async_lag", "episodes", "lora", "long_task", "warmup"]


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--dry-run", action="store_true", help="plan every spec's runs and print their commands")
    dry_run = cli.parse_args().dry_run
    for module in MODULES:
        specs = importlib.import_module(f"bench.learning.{module}").SPECS
        for key, spec in specs.items():
            command = f"python -m bench.learning.{module}" + (f" {key}" if len(specs) > 1 else "")
            parts = spec.parts if isinstance(spec, Suite) else {"": spec}
            print(f"{command}\n    {spec.question}\n    record: bench/results/learning/{spec.name}.json")
            args = parser(specs).parse_args([key] if len(specs) > 1 else [])
            for task, part in parts.items():
                arms = ", ".join(arm_overrides(part, args))
                print(f"    {task + ': ' if task else ''}{part.recipe}; arms {arms}; seeds {list(part.seeds)}", end="")
                print(f"; SFT models {list(part.sft_seeds)}" if part.sft_seeds else "; the recipe's SFT model")
                for run in plan(part, args) if dry_run else []:
                    print(f"      {run['command']}")


if __name__ == "__main__":
    main()
