"""A run's critic summarised and plotted: explained variance over the steps where it is defined."""

import pytest

from dtppo.logging import explained_var_mean
from dtppo.plot import curve


def test_explained_var_mean_leaves_out_steps_with_constant_returns():
    records = [{"step": 1, "train/critic/explained_var": -5.0, "train/critic/returns_var": 0.2},
               {"step": 2, "train/critic/explained_var": 0.4, "train/critic/returns_var": 0.2},
               # every sample got reward 0: the reference formula divides by 1e-8
               {"step": 3, "train/critic/explained_var": -868614.1, "train/critic/returns_var": 0.0},
               {"step": 4, "train/critic/explained_var": 0.2, "train/critic/returns_var": 0.25},
               {"step": 4, "validation/accuracy": 0.5}]
    assert explained_var_mean(records, after_step=1) == (pytest.approx(0.3), 1)
    assert explained_var_mean(records, after_step=0) == (pytest.approx((-5.0 + 0.4 + 0.2) / 3), 1)
    assert explained_var_mean(records, after_step=4) == (None, 0)
    # a log written before returns_var existed: every step counts
    old = [{k: v for k, v in r.items() if k != "train/critic/returns_var"} for r in records]
    assert explained_var_mean(old, after_step=3) == (pytest.approx(0.2), 0)



def test_an_undefined_explained_var_is_left_out_of_plots():
    rows = [{"step": s, "train/reward": 0.0 if var == 0 else 0.5, "train/critic/explained_var": ev,
             "train/critic/returns_var": var} for s, ev, var in [(1, 0.2, 0.2), (2, -868614.1, 0.0), (3, 0.3, 0.2)]]
    assert curve(rows, "train/critic/explained_var") == [(1, 0.2), (3, 0.3)]
    assert curve(rows, "train/reward") == [(1, 0.5), (2, 0.0), (3, 0.5)]  # other metrics keep every step
