"""``dtppo plot LOG_DIR [LOG_DIR ...]``: PNG curves of reward, validation accuracy, critic loss and explained
variance; several runs are overlaid (e.g. dp=1 vs dp=2, or the value-shift A/B)."""

from __future__ import annotations

from pathlib import Path

from dtppo.observability.logger import explained_var_defined, read_metrics

PANELS = [
    ("train/reward", "train reward"),
    ("validation/accuracy", "validation accuracy"),
    ("train/critic/loss", "critic loss"),
    ("train/critic/explained_var", "critic explained variance"),
]


def curve(records: list[dict], key: str) -> list[tuple[int, float]]:
    """(step, value) of one metric over a run; steps whose EV is undefined (constant returns) are left out."""
    return [
        (r["step"], r[key])
        for r in records
        if isinstance(r.get(key), (int, float)) and (key != "train/critic/explained_var" or explained_var_defined(r))
    ]


def plot_runs(log_dirs: list[str | Path], out: str | Path | None = None) -> Path:
    """One 2×2 figure with every run overlaid; written to ``out`` or ``<first LOG_DIR>/curves.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for log_dir in log_dirs:
        records = read_metrics(log_dir)
        for ax, (key, _) in zip(axes.flat, PANELS):
            points = curve(records, key)
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, marker="o" if len(points) < 30 else None, label=str(log_dir))
    for ax, (key, title) in zip(axes.flat, PANELS):
        ax.set_title(title)
        ax.set_xlabel("PPO step")
        ax.grid(alpha=0.3)
        if key == "train/critic/explained_var":
            ax.set_ylim(-1.0, 1.0)  # an untrained critic's EV can be far below 0 and hide the rest
    if len(log_dirs) > 1:
        axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    out = Path(out) if out is not None else Path(log_dirs[0]) / "curves.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
