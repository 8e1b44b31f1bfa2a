"""``--plot FILE.png``: concurrency, setup time, jitter and round-trip latency over the run (matplotlib, Agg).

matplotlib is the ``plot`` extra, not a dependency of the gateway: ``gateway loadtest`` asks
:func:`missing_reason` before it places a call, so a run is never lost to a plot that cannot be drawn."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from gateway.loadtest.results import RunResult


def missing_reason() -> str | None:
    """Why ``--plot`` cannot work here, or None when matplotlib is importable."""
    if importlib.util.find_spec("matplotlib") is not None:
        return None
    return (
        "--plot needs matplotlib, the gateway's plot extra: pip install 'voice-gateway[plot]' "
        "(from a checkout: pip install -e '.[plot]')"
    )


def plot(run: RunResult, path: str | Path, *, title: str = "gateway loadtest") -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    t = [s.t_s for s in run.timeline]
    ax = axes[0]
    ax.plot(t, [s.up for s in run.timeline], color="tab:blue", label="calls up")
    ax.plot(t, [s.failed for s in run.timeline], color="tab:red", label="failed (cumulative)")
    ax.set_ylabel("calls")
    ax.legend(loc="upper left")

    answered = [c for c in run.calls if c.setup_ms is not None and c.answered_s is not None]
    ax = axes[1]
    ax.scatter([c.answered_s for c in answered], [c.setup_ms for c in answered], s=6, color="tab:green")
    ax.set_ylabel("setup ms")

    ax = axes[2]
    ax.plot(t, [s.jitter_p99_ms for s in run.timeline], color="tab:orange", label="p99 over calls up")
    ended = [c for c in answered if c.jitter_ms is not None and c.ended_s is not None]
    ax.scatter([c.ended_s for c in ended], [c.jitter_ms for c in ended], s=6, color="tab:gray", label="per call (end)")
    ax.set_ylabel("jitter ms")
    ax.legend(loc="upper left")

    ax = axes[3]
    points = [(at, rtt) for c in answered for at, rtt in zip(c.rtt_at_s, c.rtt_ms, strict=True)]
    if points:
        xs, ys = zip(*points, strict=True)
        ax.scatter(xs, ys, s=6, color="tab:purple")
    ax.set_ylabel("round trip ms")
    ax.set_xlabel("seconds since start")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(str(path), dpi=100)
    plt.close(fig)
