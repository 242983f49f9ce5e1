"""README.md's generated blocks: the text between ``<!-- NAME ... -->`` and ``<!-- /NAME -->`` is written by a
script from a kept run (bench/learning/readme_demo.py: ``demo-output``; bench/device/quickstart.py:
``quickstart-output``)."""

from __future__ import annotations


def with_block(readme: str, name: str, block: str) -> str:
    """``readme`` with the text between block ``name``'s markers replaced by ``block``."""
    start = readme.index("\n", readme.index(f"<!-- {name}")) + 1
    return readme[:start] + block + "\n" + readme[readme.index(f"<!-- /{name} -->") :]
