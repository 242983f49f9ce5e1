"""One source of truth for defaults: the dataclasses in dtppo.config, documented field by field, and
recipes/base.yaml, which must name every field with the same value."""

import ast
import dataclasses
import inspect
import keyword
import typing

import pytest
import yaml

from dtppo import config as config_lib
from dtppo.config import Config
from dtppo.config import schema as config_schema
from dtppo.workers.updater import lr_lambda
from tests.support.recipes import REPO, TINY

BASE = REPO / "recipes" / "base.yaml"


def _differences(built, default, path=""):
    """Dotted keys whose values differ between two config trees."""
    if not dataclasses.is_dataclass(default):
        return [] if built == default else [f"{path}: base.yaml {built!r} != Config() {default!r}"]
    return [
        d
        for f in dataclasses.fields(default)
        for d in _differences(getattr(built, f.name), getattr(default, f.name), f"{path}.{f.name}".lstrip("."))
    ]


def _key_mismatches(tree, cls, path=""):
    """Keys a dataclass has that the YAML section lacks, and keys the YAML has that the dataclass lacks."""
    fields = typing.get_type_hints(cls)
    tree = {f"{k}_" if keyword.iskeyword(k) else k: v for k, v in tree.items()}  # env.class is the field class_
    out = [f"{path}{name}: missing from base.yaml" for name in fields if name not in tree]
    out += [f"{path}{name}: in base.yaml but not a Config field" for name in tree if name not in fields]
    for name in sorted(fields.keys() & tree.keys()):
        if dataclasses.is_dataclass(fields[name]):
            out += _key_mismatches(tree[name] or {}, fields[name], f"{path}{name}.")
    return out


def test_base_yaml_equals_config_defaults():
    assert _differences(config_lib.load(BASE), Config()) == []


def test_base_yaml_names_every_field_and_nothing_else():
    assert _key_mismatches(yaml.safe_load(BASE.read_text()), Config) == []


def test_key_check_catches_a_missing_and_an_extra_key():
    # negative control: the walk above must see a dropped key and a stray one
    tree = yaml.safe_load(BASE.read_text())
    del tree["ppo"]["gae"]["gamma"]
    tree["loss"]["typo_key"] = 1
    assert sorted(_key_mismatches(tree, Config)) == [
        "loss.typo_key: in base.yaml but not a Config field",
        "ppo.gae.gamma: missing from base.yaml",
    ]


def test_every_config_field_has_a_docstring():
    from dtppo.config import generation, inputs, loss, models, optim, policy, ppo, reward, run, value

    classes = [
        node
        for source in (config_schema, models, optim, generation, policy, value, ppo, loss, inputs, reward, run)
        for node in ast.parse(inspect.getsource(source)).body
        if isinstance(node, ast.ClassDef) and node.decorator_list
    ]
    assert len(classes) == 35  # the 34 sections and Config itself
    undocumented = []
    for cls in classes:
        body = cls.body
        for i, node in enumerate(body):
            if isinstance(node, ast.AnnAssign):
                nxt = body[i + 1] if i + 1 < len(body) else None
                documented = (
                    isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)
                    and nxt.value.value.strip()
                )
                if not documented:
                    undocumented.append(f"{cls.name}.{node.target.id}")
    assert undocumented == []


def test_schedule_lengths_default_to_their_stage():
    cfg = Config()
    assert cfg.sft.scheduler.total_steps == cfg.sft.num_steps == 500
    # 50 steps x 1 epoch x (64 samples / 32 per optimizer step)
    assert cfg.policy.scheduler.total_steps == cfg.value.scheduler.total_steps == 100
    # the bug this replaces: a Python-built Config() ran SFT's cosine schedule at a constant LR
    assert lr_lambda(cfg.sft.scheduler)(cfg.sft.num_steps - 1) == pytest.approx(
        cfg.sft.scheduler.min_lr_ratio, abs=1e-4
    )

    cfg = config_lib.load(
        BASE,
        [
            "ppo.max_num_steps=10",
            "ppo.ppo_epochs=2",
            "value.warmup.steps=4",
            "ppo.num_generations_per_prompt=2",
            "policy.train_global_batch_size=16",
            "policy.train_micro_batch_size=16",
            "sft.num_steps=7",
        ],
    )
    assert cfg.policy.scheduler.total_steps == (10 - 4) * 2 * (128 // 16)
    assert cfg.value.scheduler.total_steps == 10 * 2 * (128 // 32)
    assert cfg.sft.scheduler.total_steps == 7
    assert config_lib.load(TINY).sft.scheduler.total_steps == 1200


def test_an_explicit_schedule_length_wins_and_survives_a_round_trip():
    cfg = config_lib.load(BASE, ["sft.scheduler.total_steps=42", "policy.scheduler.total_steps=9"])
    assert (cfg.sft.scheduler.total_steps, cfg.policy.scheduler.total_steps) == (42, 9)
    assert config_lib.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(config_lib.ConfigError, match=r"^sft\.scheduler\.total_steps:"):
        config_lib.load(BASE, ["sft.scheduler.total_steps=-1"])


def test_turning_the_value_shift_off_warns_once(capsys):
    config_lib.load(BASE)
    assert capsys.readouterr().err == ""
    cfg = config_lib.load(BASE, ["value.shift_values=false"])
    err = capsys.readouterr().err
    assert err.count("WARNING") == 1 and "value.shift_values=false" in err and "value-alignment" in err
    config_lib.from_dict(cfg.to_dict())  # ranks rebuild the config: no second warning
    assert capsys.readouterr().err == ""
