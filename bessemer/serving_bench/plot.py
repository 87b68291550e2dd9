"""Latency against output throughput over a sweep of request rates, as a PNG: the curve a
serving system is judged by (how much latency each step up in load costs)."""

from __future__ import annotations

from pathlib import Path

from bessemer.errors import BessemerError


def plot_sweep(summaries: list[dict], path: Path, title: str) -> None:
    """Two panels, TTFT and TPOT (median and p99, ms) against output tokens/s, each point
    labelled with its request rate."""
    try:
        import matplotlib
    except ImportError:
        raise BessemerError("--plot needs matplotlib: pip install matplotlib (or pip install 'bessemer[bench]')") \
            from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    x = [s["output_throughput"] for s in summaries]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, key, name in ((axes[0], "ttft", "TTFT"), (axes[1], "tpot", "TPOT")):
        for stat, style in (("median", "o-"), ("p99", "s--")):
            ax.plot(x, [s[f"{stat}_{key}_ms"] for s in summaries], style, label=f"{stat} {name}")
        for s, xi in zip(summaries, x):
            ax.annotate(f"{s['request_rate']}/s", (xi, s[f"median_{key}_ms"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=8)
        ax.set_xlabel("output throughput (tok/s)")
        ax.set_ylabel(f"{name} (ms)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
