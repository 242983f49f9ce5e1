"""``dtppo plot LOG_DIR``: PNG curves of reward, validation accuracy, critic loss and explained variance."""

from __future__ import annotations

from pathlib import Path

from dtppo.logging import read_metrics

PANELS = [
    ("train/reward", "train reward"),
    ("validation/accuracy", "validation accuracy"),
    ("train/critic/loss", "critic loss"),
    ("train/critic/explained_var", "critic explained variance"),
]


def plot_run(log_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(log_dir)
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, title) in zip(axes.flat, PANELS):
        points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
        if points:
            steps, values = zip(*points)
            ax.plot(steps, values, marker="o" if len(points) < 30 else None)
        ax.set_title(title)
        ax.set_xlabel("PPO step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(log_dir) / "curves.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return [out]
