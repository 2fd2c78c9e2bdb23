"""PNG plots of a `run_all` result: latency CDFs (fork overhead host vs bare, mutations with
and without fork load, reads) and fork throughput vs concurrent clients. Needs matplotlib
(the `bench` extra); without it, no plots and a note saying so.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _cdf(ax: Any, samples: list[float], label: str) -> None:
    if not samples:
        return
    ordered = sorted(samples)
    n = len(ordered)
    ax.plot(ordered, [(i + 1) / n for i in range(n)], label=f"{label} (n={n})")


def _finish(fig: Any, ax: Any, title: str, xlabel: str, path: Path, log_x: bool = True) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of requests ≤ x")
    if log_x:
        ax.set_xscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_all(results: Mapping[str, Any], out_dir: Path, stem: str) -> list[Path]:
    """Write the plots next to the JSON; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    benches = {b["name"]: b for b in results["benchmarks"]}

    overhead = benches.get("fork overhead vs the bare provider")
    if overhead:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for provider, fig_data in overhead["figures"].items():
            if not isinstance(fig_data, dict) or "host" not in fig_data:
                continue
            _cdf(ax, fig_data["host"]["samples"], f"{provider}: fork.create → committed")
            _cdf(ax, fig_data["bare"]["samples"], f"{provider}: bare thread/read + thread/fork")
        path = out_dir / f"{stem}-fork-overhead-cdf.png"
        _finish(fig, ax, "Fork latency: host vs bare provider", "ms (log)", path)
        plt.close(fig)
        written.append(path)

    mutations = benches.get("mutations with and without fork load")
    if mutations:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for phase, label in (("alone", "no fork load"), ("underForkLoad", "8 clients forking")):
            for kind, lat in mutations["figures"][phase].items():
                if kind != "all":
                    _cdf(ax, lat["samples"], f"{kind}, {label}")
        path = out_dir / f"{stem}-mutations-cdf.png"
        _finish(fig, ax, "Mutation latency with and without fork load", "ms (log)", path)
        plt.close(fig)
        written.append(path)

    throughput = benches.get("fork throughput vs concurrent clients")
    if throughput:
        levels = throughput["figures"]["levels"]
        xs = sorted(int(k) for k in levels)
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(xs, [levels[str(x)]["forksPerSecond"] for x in xs], marker="o", label="forks/s")
        ax.axhline(50, linestyle="--", color="grey", label="target 50 forks/s")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_title("Fork throughput vs concurrent clients (distinct sources)")
        ax.set_xlabel("concurrent forking clients")
        ax.set_ylabel("forks committed per second")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{stem}-fork-throughput.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

        fig, ax = plt.subplots(figsize=(7, 4.2))
        for x in xs:
            _cdf(ax, levels[str(x)]["latency"]["samples"], f"{x} clients")
        path = out_dir / f"{stem}-fork-latency-by-clients-cdf.png"
        _finish(fig, ax, "Fork latency by concurrent clients", "ms (log)", path)
        plt.close(fig)
        written.append(path)

    scale = benches.get("scale")
    if scale:
        many = scale["figures"]["many"]
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for kind in ("session.get", "fork.get"):
            _cdf(ax, many[kind]["samples"], kind)
        path = out_dir / f"{stem}-reads-cdf.png"
        _finish(fig, ax, "Read latency, 8 clients", "ms (log)", path)
        plt.close(fig)
        written.append(path)
    return written
