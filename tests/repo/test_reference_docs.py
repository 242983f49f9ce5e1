"""The references in docs/ are the code's: docs/guides/config.md is what the schema generates (every key a recipe can
set, each with its docstring)."""

import re

from dtppo import config as config_lib
from dtppo.config.reference import config_reference
from tests.support.recipes import REPO

DOCS = REPO / "docs" / "guides"


def _leaves(tree: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in tree.items():
        if isinstance(value, dict) and key != "kwargs":
            keys |= _leaves(value, f"{prefix}{key}.")
        else:
            keys.add(f"{prefix}{key}")
    return keys


def test_docs_config_md_is_the_generated_reference():
    assert (DOCS / "config.md").read_text() == config_reference(), (
        "docs/guides/config.md is stale: python -m dtppo.config.reference > docs/guides/config.md"
    )


def test_the_reference_has_every_key_once_with_a_meaning():
    rows, section = [], None
    for line in config_reference().splitlines():
        if heading := re.fullmatch(r"## `(.+)`", line):
            section = heading.group(1)
        elif row := re.fullmatch(r"\| `([^`]+)` \| (.+?) \| `(.*?)` \| (.*) \|", line):
            rows.append((f"{section}.{row.group(1)}", row.group(4)))
    keys = [key for key, _ in rows]
    assert len(keys) == len(set(keys)) and set(keys) == _leaves(config_lib.from_dict({}).to_dict())
    assert [key for key, meaning in rows if not meaning.strip()] == []


def _stop_classes() -> dict[str, int]:
    """Every ``RunStopped`` class dtppo defines (its modules imported) and its exit code; subclasses the tests define
    are not dtppo's."""
    import importlib
    import pkgutil

    import dtppo
    from dtppo.errors import RunStopped

    skip = ("dtppo.generation.vllm_engine", "dtppo.__main__")  # vLLM is optional; __main__ runs the CLI
    for module in pkgutil.walk_packages(dtppo.__path__, "dtppo."):
        if module.name not in skip:
            importlib.import_module(module.name)
    classes, todo = {}, [RunStopped]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("dtppo."):
            classes[cls.__name__] = cls.exit_code
        todo += cls.__subclasses__()
    return classes


def test_the_exit_code_table_names_every_stop_class_with_its_code():
    table = (DOCS / "reliability.md").read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    documented = {
        name: int(code)
        for code, row in re.findall(r"^\| (\d) \|(.*)$", table, re.MULTILINE)
        for name in re.findall(r"`(?:\w+\.)*([A-Z]\w+)`", row)
    }
    classes = _stop_classes()
    assert {name: documented.get(name) for name in classes} == classes
    assert documented["ConfigError"] == 2
