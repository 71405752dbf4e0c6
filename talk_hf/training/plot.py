"""A loss/BLEU plot of a run's metrics.jsonl, the loss curves of several runs in one plot, and the plotting helpers
the benchmark scripts share."""

import json
from pathlib import Path


def read_metrics(path):
    """metrics.jsonl -> list of dicts (training records have "loss", evaluation records "valid_loss"; the evaluation
    of a run's averaged last checkpoints has "averaged_checkpoints" too, the repeated one of the best checkpoint a
    run ends with "best_checkpoint")."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def curve(records, key):
    """-> ([(step, value)] of the training trajectory, [(step, value)] of averaged checkpoints) for the records
    holding `key`: the averaged weights' evaluation shares its step with the last checkpoint's but is not a point of
    the run's path, and the best checkpoint's repeated evaluation is already one."""
    points = [r for r in records if key in r]
    return ([(r["step"], r[key]) for r in points if "averaged_checkpoints" not in r and "best_checkpoint" not in r],
            [(r["step"], r[key]) for r in points if "averaged_checkpoints" in r])


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, image_path):
    """Lay out, write as PNG (100 dpi) and close."""
    fig.tight_layout()
    fig.savefig(image_path, dpi=100)
    pyplot().close(fig)


def plot_metrics(metrics_path, image_path):
    """Training loss and validation loss against steps, validation BLEU on a second axis when present."""
    plt = pyplot()
    records = read_metrics(metrics_path)
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    valid, averaged = curve(records, "valid_loss")
    bleu = curve(records, "valid_bleu")[0]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), label="train loss (smoothed labels)")
    if valid:
        ax.plot(*zip(*valid), "o-", label="valid loss")
    if averaged:
        ax.plot(*zip(*averaged), "*", markersize=10, label="valid loss, last checkpoints averaged")
    ax.set_xlabel("update")
    ax.set_ylabel("cross-entropy")
    handles = ax.get_legend_handles_labels()
    if bleu:
        ax2 = ax.twinx()
        ax2.plot(*zip(*bleu), "s--", color="tab:green", label="valid BLEU")
        ax2.set_ylabel("BLEU")
        more = ax2.get_legend_handles_labels()
        handles = (handles[0] + more[0], handles[1] + more[1])
    ax.legend(*handles, loc="center right")  # one legend for both axes
    save_figure(fig, image_path)
    return image_path


def plot_runs(runs, image_path, key="valid_loss", ylabel="validation loss"):
    """One curve per run: `key` (a metrics.jsonl field) against updates, and a star for the run's averaged last
    checkpoints; runs: {label: metrics.jsonl path}."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, metrics_path in runs.items():
        points, averaged = curve(read_metrics(metrics_path), key)
        if not points:
            raise ValueError(f"{metrics_path} holds no {key!r} record to plot for {label!r}")
        (line,) = ax.plot(*zip(*points), "o-", markersize=3, label=label)
        if averaged:
            ax.plot(*zip(*averaged), "*", markersize=10, color=line.get_color(),
                    label=f"{label}, last checkpoints averaged")
    ax.set_xlabel("update")
    ax.set_ylabel(ylabel)
    ax.legend()
    save_figure(fig, image_path)
    return image_path
