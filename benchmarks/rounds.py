"""Interleaved rounds: how every benchmark compares configurations on a noisy VM.

A single sequential run cannot tell a lead from a slow stretch of the machine.
So each round measures every configuration once, in an order rotated from round to round (A B C, B C A, C A B, ...),
after untimed warm-up rounds; a configuration's figure in a round is set against the baseline's in the *same* round,
and the report gives the median of those per-round ratios with their spread (min-max). A spread that crosses 1.0 is
"no measurable difference".

Around every measurement the machine is watched through /proc: CPU steal (the hypervisor ran someone else) and the
CPU time of processes outside this benchmark's own process tree. A round with steal or foreign load above the
thresholds is flagged and left out of the ratios, as long as enough clean rounds remain (else all rounds count and the
summary says so).
"""

from __future__ import annotations

import os
import statistics
import threading
from pathlib import Path
from typing import Callable

from tests.support.servers import process_ticks, process_tree

STEAL_LIMIT = 0.05  # share of the machine's CPU time stolen by the hypervisor
FOREIGN_LIMIT = 0.10  # share of the machine's CPU time used by processes outside this benchmark
MIN_CLEAN_ROUNDS = 3


def _machine_ticks() -> tuple[int, int, int]:
    """(all, busy, steal) clock ticks of every CPU since boot (/proc/stat; guest time is already in user)."""
    user, nice, system, idle, iowait, irq, softirq, steal = (
        int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    total = user + nice + system + idle + iowait + irq + softirq + steal
    return total, total - idle - iowait - steal, steal


class MachineLoad:
    """Context manager: the steal share and the foreign-process share of the machine's CPU time while it was open.

    Our own CPU time is counted two ways, and the larger count is taken (each can only miss time, never add some):
    this process tree's time, reaped children included, from start to end, which misses a process that left the tree
    (DDP's second rank, started by the first, can outlive it and be re-parented to init); and the time of every
    process ever seen in the tree, sampled every SAMPLE_SECONDS, which misses each exited process's last moments.
    A sample reads /proc/*/stat: 1.5 ms here, under 1 % of one core at this rate, the same for every configuration.
    """

    SAMPLE_SECONDS = 0.2

    def __init__(self, also_ours: Callable[[], set[int]] = set):
        # Processes that work for the benchmark outside its process tree (a container engine's), found at each
        # sample: their trees count as ours.
        self._also_ours = also_ours

    def __enter__(self) -> "MachineLoad":
        self._first: dict[int, int] = {}
        self._last: dict[int, int] = {}
        self._machine = _machine_ticks()
        self._tree = self._tree_ticks(self._sample(started=True))
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample_until_done, daemon=True)
        self._sampler.start()
        return self

    @staticmethod
    def _tree_ticks(stats: dict[int, tuple[int, int, int]]) -> int:
        return sum(stats[pid][1] + stats[pid][2] for pid in process_tree(stats, {os.getpid()}))

    def _sample(self, started: bool = False) -> dict[int, tuple[int, int, int]]:
        stats = process_ticks()
        for pid in process_tree(stats, {*self._last, os.getpid(), *self._also_ours()}):
            self._first.setdefault(pid, stats[pid][1] if started else 0)  # born while the block ran: from zero
            self._last[pid] = stats[pid][1]
        return stats

    def _sample_until_done(self) -> None:
        while not self._done.wait(self.SAMPLE_SECONDS):
            self._sample()

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._sampler.join()
        tree = self._tree_ticks(self._sample()) - self._tree
        total, busy, steal = (now - then for now, then in zip(_machine_ticks(), self._machine))
        own = max(tree, sum(self._last[pid] - self._first[pid] for pid in self._last))
        self.steal = steal / total if total else 0.0
        self.foreign = max(0.0, busy - own) / total if total else 0.0
        self.flagged = self.steal > STEAL_LIMIT or self.foreign > FOREIGN_LIMIT


def rotated(names: list[str], round_index: int) -> list[str]:
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def measure_rounds(
    measurements: dict[str, Callable[[], float]],
    rounds: int,
    warmup_rounds: int = 1,
    label: str = "",
    after_each_round: Callable[[], None] = lambda: None,
    also_ours: Callable[[], set[int]] = set,
) -> list[dict]:
    """Run every measurement once per round, order rotated each round; each callable returns one figure (seconds,
    lower is better). Warm-up rounds run untimed first; `after_each_round` runs after every timed round (what the
    figures are divided by, measured under the same conditions); `also_ours`: as MachineLoad's. Returns one record
    per timed measurement."""
    names, records = list(measurements), []
    for round_index in range(-warmup_rounds, rounds):
        for name in rotated(names, round_index):
            with MachineLoad(also_ours) as load:
                seconds = measurements[name]()
            if round_index < 0:
                print(f"  {label}warm-up {name}: {seconds:.4g} s", flush=True)
                continue
            records.append(
                {
                    "config": name,
                    "round": round_index,
                    "seconds": seconds,
                    "steal": round(load.steal, 3),
                    "foreign_load": round(load.foreign, 3),
                    "flagged": load.flagged,
                }
            )
            flag = (
                "  FLAGGED (steal %.0f%%, foreign load %.0f%%)" % (100 * load.steal, 100 * load.foreign)
                if load.flagged
                else ""
            )
            print(f"  {label}round {round_index + 1}/{rounds} {name}: {seconds:.4g} s{flag}", flush=True)
        if round_index >= 0:
            after_each_round()
    return records


def verdict(low: float, high: float) -> str:
    if low == high == 1.0:
        return "baseline"
    if low <= 1.0 <= high:
        return "no measurable difference"
    return "faster" if low > 1.0 else "slower"


def summarize(records: list[dict], baseline: str) -> dict:
    """Per configuration: median seconds, and the speed-up over `baseline` (baseline seconds / its seconds in the same
    round) as median and min-max over the clean rounds."""
    by_round: dict[int, dict[str, dict]] = {}
    for record in records:
        by_round.setdefault(record["round"], {})[record["config"]] = record
    clean = [r for r, row in by_round.items() if not any(record["flagged"] for record in row.values())]
    all_rounds_counted = len(clean) < min(MIN_CLEAN_ROUNDS, len(by_round))
    counted = sorted(by_round) if all_rounds_counted else clean
    summary = {
        "baseline": baseline,
        "rounds": len(by_round),
        "rounds_counted": len(counted),
        "flagged_rounds_counted": all_rounds_counted,
        "configs": {},
    }
    for name in by_round[counted[0]]:
        ratios = [by_round[r][baseline]["seconds"] / by_round[r][name]["seconds"] for r in counted]
        summary["configs"][name] = {
            "median_s": statistics.median(by_round[r][name]["seconds"] for r in counted),
            "speedup_median": round(statistics.median(ratios), 3),
            "speedup_min": round(min(ratios), 3),
            "speedup_max": round(max(ratios), 3),
            "verdict": verdict(min(ratios), max(ratios)),
        }
    return summary


def ratio_text(figures: dict) -> str:
    """'x1.32 [1.28-1.37]' or 'x1.02 [0.97-1.06], no measurable difference'."""
    if figures["verdict"] == "baseline":
        return "x1 (baseline)"
    text = f"x{figures['speedup_median']:.2f} [{figures['speedup_min']:.2f}-{figures['speedup_max']:.2f}]"
    return text + (", no measurable difference" if figures["verdict"] == "no measurable difference" else "")


def plot_speedups(axis, summary: dict, title: str, colours: dict[str, str] | None = None) -> None:
    """Horizontal bars of the median speed-up with the min-max spread as error bars, and the 1.0 line. A bar's
    colour is its verdict, or, given `colours` (configuration -> colour, to match another panel of the figure), its
    configuration's, and the verdict is written beside it."""
    names = list(summary["configs"])
    figures = [summary["configs"][name] for name in names]
    medians = [f["speedup_median"] for f in figures]
    spread = [
        [m - f["speedup_min"] for m, f in zip(medians, figures)],
        [f["speedup_max"] - m for m, f in zip(medians, figures)],
    ]
    palette = {"baseline": "#4c72b0", "no measurable difference": "#999999", "faster": "#55a868", "slower": "#c44e52"}
    if colours is None:
        bar_colours = [palette[f["verdict"]] for f in figures]
        labels = [ratio_text(f).split(",")[0] for f in figures]
    else:
        bar_colours = [colours[name] for name in names]
        labels = [ratio_text(f).replace(", ", "\n") for f in figures]
    bars = axis.barh(names, medians, xerr=spread, color=bar_colours, capsize=3)
    axis.bar_label(bars, labels=labels, padding=8, fontsize=8)
    axis.axvline(1, color="black", linewidth=0.8)
    axis.set_xlim(0, max(f["speedup_max"] for f in figures) * 1.6)
    axis.invert_yaxis()
    axis.set(xlabel=f"speed-up over the baseline (median, min-max of {summary['rounds_counted']} rounds)", title=title)
