"""The recipe reference, generated from the schema: every key with its type, default and the docstring under its
field. ``python -m dtppo.config.reference > docs/guides/config.md`` writes docs/guides/config.md; a test keeps it
current."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import keyword
import textwrap
import types
import typing
from typing import Any, Literal

from dtppo.config.loading import KWARGS
from dtppo.config.renames import RENAMES
from dtppo.config.schema import Config

HEADER = """# Configuration reference

Every key a recipe may set, with its type, its default and what it does, section by section. Generated from the
schema (`python -m dtppo.config.reference > docs/guides/config.md`; a test fails when it is stale). A recipe sets any
subset (`defaults:` names a recipe it starts from); a command line overrides any key as `section.key=value`. Where a
default is `null` and the text says "filled in", the loaded config holds the value it derives.
"""


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of dataclass ``cls``, as one line per field."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            docs[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def recipe_key(name: str) -> str:
    """The key a recipe writes for field ``name`` (``class_`` is ``class``)."""
    bare = name.removesuffix("_")
    return bare if name.endswith("_") and keyword.iskeyword(bare) else name


def type_text(hint: Any) -> str:
    """A field's type as a recipe writer reads it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [type_text(a) for a in args if a is not type(None)]
        return " or ".join(inner) + (" or null" if type(None) in args else "")
    if origin is Literal:
        return " \\| ".join(str(a) for a in args)
    if origin is tuple:
        if args[-1:] == (Ellipsis,):
            return f"list of {type_text(args[0])}"
        return f"[{', '.join(type_text(a) for a in args)}]"
    return getattr(hint, "__name__", str(hint))


def default_text(value: Any) -> str:
    """A default as YAML writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(default_text(v) for v in value) + "]"
    if isinstance(value, str):
        # a newline, an edge space or nothing at all shows quoted, as YAML needs it
        plain = value and value.isprintable() and value.strip() == value
        return value if plain else json.dumps(value, ensure_ascii=False)
    return repr(value)


def section_lines(cls: type, path: str) -> list[str]:
    """The table of ``cls``'s own keys under the heading ``path``, then each subsection's."""
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    summary = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].replace("\n", " ")
    lines = [f"## `{path}`", "", summary, "", "| key | type | default | meaning |", "|---|---|---|---|"]
    nested = []
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            nested.append((hint, f"{path}.{recipe_key(field.name)}"))
            continue
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        kind, shown = type_text(hint), default_text(default)
        if hint == KWARGS:  # a mapping, stored as (name, value) pairs so that the config stays hashable
            kind, shown = "mapping", "{}"
        meaning = docs.get(field.name, "").replace("``", "`").replace("|", "\\|")
        lines.append(f"| `{recipe_key(field.name)}` | {kind} | `{shown}` | {meaning} |")
    lines.append("")
    for hint, sub in nested:
        lines += section_lines(hint, sub)
    return lines


def config_reference() -> str:
    """docs/guides/config.md: every section of ``Config`` in schema order."""
    lines = [HEADER]
    hints = typing.get_type_hints(Config)
    for field in dataclasses.fields(Config):
        lines += section_lines(hints[field.name], field.name)
    lines += renamed_lines()
    return "\n".join(lines).rstrip() + "\n"


def renamed_lines() -> list[str]:
    """The table of keys that moved into their feature's subsection (``renames.RENAMES``)."""
    lines = [
        "## Renamed keys",
        "",
        "A recipe or override that writes an old name still loads: the key is moved to its new place and one line on "
        "stderr names the new key. A recipe that sets both names is refused.",
        "",
        "| old key | new key |",
        "|---|---|",
    ]
    return lines + [f"| `{old}` | `{new}` |" for old, new in RENAMES.items()] + [""]


if __name__ == "__main__":
    print(config_reference(), end="")
