"""A simulation's pool over time as a PNG: the pages KV blocks and adapter slots held, and
the requests running and waiting, for a platform team to see where the memory went."""

from pathlib import Path

from inference.engine.simulation import SimulationResult


def plot_occupancy(result: SimulationResult, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    from matplotlib import pyplot

    samples = result.occupancy
    t = [s["t"] for s in samples]
    figure, (pages, requests) = pyplot.subplots(2, 1, sharex=True, figsize=(9, 6))
    try:
        pages.stackplot(
            t,
            [s["kv_pages"] for s in samples],
            [s["adapter_pages"] for s in samples],
            labels=["KV blocks", "adapter slots"],
        )
        if samples:
            pages.axhline(samples[0]["pages"], color="black", linewidth=0.8, label="pool")
        pages.set_ylabel("pool pages")
        pages.legend(loc="upper right")
        pages.set_title(title)
        requests.plot(t, [s["running"] for s in samples], label="running")
        requests.plot(t, [s["waiting"] for s in samples], label="waiting")
        requests.set_ylabel("requests")
        requests.set_xlabel("simulated seconds")
        requests.legend(loc="upper right")
        figure.tight_layout()
        figure.savefig(path, dpi=100)
    finally:
        pyplot.close(figure)
