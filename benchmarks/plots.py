"""Log-log line plots for the benchmark reports (matplotlib if installed; else skipped)."""

from __future__ import annotations

from typing import Sequence


def loglog(path: str, xs: Sequence[float], series: Sequence[tuple[str, Sequence[float], str]], xlabel: str,
           ylabel: str, hline: tuple[float, str] | None = None) -> bool:
    """Plot each (label, ys, style) against ``xs`` on log-log axes into ``path``; a dotted
    horizontal line at ``hline`` (value, label). False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, ys, style in series:
        ax.loglog(list(xs), list(ys), style, label=label)
    if hline is not None:
        ax.axhline(hline[0], color="grey", lw=0.8, ls=":", label=hline[1])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
