"""``dtppo plot`` (``dtppo.observability.plot``): a metric's curve over a run, the steps whose explained variance is
undefined left out, and one PNG with several runs overlaid."""

import json

import pytest

from dtppo.errors import InputError
from dtppo.observability.plot import curve, plot_runs


def test_an_undefined_explained_var_is_left_out_of_plots():
    rows = [
        {
            "step": s,
            "train/reward": 0.0 if var == 0 else 0.5,
            "train/critic/explained_var": ev,
            "train/critic/returns_var": var,
        }
        for s, ev, var in [(1, 0.2, 0.2), (2, -868614.1, 0.0), (3, 0.3, 0.2)]
    ]
    assert curve(rows, "train/critic/explained_var") == [(1, 0.2), (3, 0.3)]
    assert curve(rows, "train/reward") == [(1, 0.5), (2, 0.0), (3, 0.5)]  # other metrics keep every step


def test_a_text_value_or_a_missing_metric_is_no_point():
    rows = [{"step": 1, "train/reward": "nan"}, {"step": 2}, {"step": 3, "train/reward": 1}]
    assert curve(rows, "train/reward") == [(3, 1)]


def test_several_runs_are_drawn_into_one_png(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        rows = [{"step": s, "train/reward": s / 4, "validation/accuracy": 0.5} for s in range(1, 4)]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = plot_runs([tmp_path / "a", tmp_path / "b"])
    assert out == tmp_path / "a" / "curves.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_runs([tmp_path / "a"], tmp_path / "x" / "c.png").is_file()
    with pytest.raises(InputError, match="no metrics.jsonl"):
        plot_runs([tmp_path / "missing"])
