"""The interleaved-rounds method every benchmark uses (benchmarks/rounds.py), on real processes, a smoke run of the
training-step benchmark, and the formulation benchmarks.layers sets against the transposed convolution. Speed itself
is never asserted here: that is the benchmarks' job."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from benchmarks import rounds
from benchmarks.layers import STEP_MIX, convolutions, step_flops
from thermal2visible.paths import PARAMS
from tests.support.figures import assert_drawn


def test_each_round_runs_every_configuration_in_a_rotated_order():
    calls = []
    measurements = {
        name: (lambda name=name, seconds=seconds: calls.append(name) or seconds)
        for name, seconds in (("a", 0.2), ("b", 0.1), ("c", 0.4))
    }
    records = rounds.measure_rounds(
        measurements, rounds=3, warmup_rounds=1, after_each_round=lambda: calls.append("peak")
    )
    # warm-up round first; what the figures are divided by is measured after every timed round, beside them
    assert calls == ["c", "a", "b", "a", "b", "c", "peak", "b", "c", "a", "peak", "c", "a", "b", "peak"]
    assert [r["round"] for r in records] == [0] * 3 + [1] * 3 + [2] * 3
    summary = rounds.summarize(records, baseline="a")
    assert summary["configs"]["b"]["speedup_median"] == 2.0 and summary["configs"]["b"]["verdict"] == "faster"
    assert summary["configs"]["c"]["speedup_median"] == 0.5 and summary["configs"]["c"]["verdict"] == "slower"
    assert summary["configs"]["a"]["verdict"] == "baseline"


def test_the_peak_is_the_best_clean_measurement_and_a_share_above_it_is_no_figure():
    from benchmarks import common  # torch and Lightning: imported by the test that needs them only

    peaks = common.GemmPeaks(["fp32"])  # every CPU has fast fp32 GEMMs; bf16 is emulated on AVX2-only ones
    peaks.measure()
    (sample,) = peaks.samples["fp32"]
    assert sample["gflops"] > 0 and {"steal", "foreign_load", "flagged"} <= sample.keys()
    # a busy moment's measurement (flagged) is no ceiling, however high: the best clean one is
    peaks.samples["bf16"] = [
        {"gflops": 250.0, "flagged": False},
        {"gflops": 400.0, "flagged": False},
        {"gflops": 150.0, "flagged": True},
    ]
    assert peaks.peak("bf16") == {"gflops": 400.0, "clean": True, "measurements": 3}
    assert common.share_text(peaks.arithmetic(300e9, 1.0, "bf16")) == "75% of bf16 peak"
    over = peaks.arithmetic(600e9, 1.0, "bf16")
    assert over["share_of_peak"] is None and "measurement error" in common.share_text(over)
    peaks.samples["bf16"] = [{"gflops": 150.0, "flagged": True}]
    assert peaks.peak("bf16")["clean"] is False and "no clean measurement" in peaks.text()


def test_a_spread_that_crosses_one_is_no_measurable_difference():
    records = [
        {"config": name, "round": r, "seconds": seconds, "flagged": False}
        for r, (a, b) in enumerate([(1.0, 0.9), (1.0, 1.1), (1.0, 0.95)])
        for name, seconds in (("a", a), ("b", b))
    ]
    figures = rounds.summarize(records, baseline="a")["configs"]["b"]
    assert figures["speedup_min"] < 1 < figures["speedup_max"]
    assert figures["verdict"] == "no measurable difference"
    assert rounds.ratio_text(figures).endswith("no measurable difference")


def test_flagged_rounds_are_left_out_while_enough_clean_ones_remain():
    records = [
        {"config": name, "round": r, "seconds": seconds, "flagged": r == 1}
        for r, b in enumerate([0.5, 5.0, 0.5, 0.5])
        for name, seconds in (("a", 1.0), ("b", b))
    ]
    summary = rounds.summarize(records, baseline="a")
    assert summary["rounds_counted"] == 3 and not summary["flagged_rounds_counted"]
    assert summary["configs"]["b"]["speedup_min"] == 2.0  # the round under load (x0.2) is not among them
    records = [dict(record, flagged=record["round"] > 0) for record in records]
    assert rounds.summarize(records, baseline="a")["flagged_rounds_counted"]  # too few clean: all count, and it says so


def only_this_tests_load(monkeypatch, reported: Path) -> None:
    """/proc/stat's machine as if the processes this test starts were all that ran on it: busy ticks are this
    process's, its reaped children's and the CPU seconds a process outside its tree wrote into `reported` as it
    exited. The machine's other load (other users' jobs) then cannot decide whether our own time counts as ours."""
    real = rounds._machine_ticks

    def machine_ticks() -> tuple[int, int, int]:
        times = os.times()
        seconds = times.user + times.system + times.children_user + times.children_system
        seconds += sum(float(path.read_text()) for path in reported.glob("*"))
        return real()[0], round(seconds * os.sysconf("SC_CLK_TCK")), 0

    monkeypatch.setattr(rounds, "_machine_ticks", machine_ticks)


def busy_for(seconds: float, report: Path | None = None) -> str:
    """A Python command line that keeps a core busy for `seconds`, then writes its CPU seconds to `report`."""
    ending = f"\nopen({str(report)!r}, 'w').write(str(time.process_time()))" if report else ""
    return f'{sys.executable} -c "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass{ending}"'


@pytest.mark.slow  # Python processes started through a shell
def test_load_from_another_process_is_foreign_and_our_own_children_are_not(tmp_path, monkeypatch):
    # A busy loop whose parent shell has exited belongs to no one here: it is someone else's load. More load from
    # elsewhere only adds to it, so this half reads the real machine.
    orphan = subprocess.run(
        ["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(orphan.stdout)
    try:
        time.sleep(0.5)
        with rounds.MachineLoad() as load:
            time.sleep(1.0)
        assert load.foreign > 0.3 / os.cpu_count() and load.flagged
    finally:
        os.kill(pid, signal.SIGKILL)
    only_this_tests_load(monkeypatch, tmp_path)
    with rounds.MachineLoad() as own:
        subprocess.run(["sh", "-c", busy_for(1.0)], check=True)
    assert own.foreign < rounds.FOREIGN_LIMIT and not own.flagged


@pytest.mark.slow  # Python processes started through a shell
def test_a_process_named_as_ours_counts_as_ours_with_what_it_starts(tmp_path, monkeypatch):
    # As a container engine's: a shell outside this tree (its parent has exited) that works for the benchmark, and
    # the busy Python it starts. Unnamed, they are foreign load; named by `also_ours`, both are ours.
    reports = tmp_path / "reports"
    reports.mkdir()
    only_this_tests_load(monkeypatch, reports)
    loads = {}
    for named in (False, True):
        report = tmp_path / f"busy-{named}"
        start = f"sh -c {shlex.quote(busy_for(1.5, report))} >/dev/null 2>&1 & echo $!"
        engine = int(subprocess.run(["sh", "-c", start], capture_output=True, text=True, check=True).stdout)
        with rounds.MachineLoad(also_ours=(lambda pid=engine: {pid}) if named else set) as loads[named]:
            while not report.exists():
                time.sleep(0.1)
            time.sleep(0.1)  # its CPU seconds written
            report.rename(reports / report.name)  # on the machine from now on
    assert loads[False].flagged and loads[False].foreign > 0.2
    assert loads[True].foreign < rounds.FOREIGN_LIMIT and not loads[True].flagged


@pytest.mark.slow  # Python processes started through a shell
def test_a_descendant_that_outlives_its_parent_stays_ours(tmp_path, monkeypatch):
    # As DDP's second rank can: started by a process that exits first, then re-parented to init while it works.
    only_this_tests_load(monkeypatch, tmp_path)
    with rounds.MachineLoad() as load:
        subprocess.run(["sh", "-c", f"{busy_for(1.5, tmp_path / 'orphan')} & sleep 0.6"], check=True)
        time.sleep(1.4)  # the orphan works on alone, then exits
    assert (tmp_path / "orphan").is_file()  # its time is on the machine
    assert load.foreign < rounds.FOREIGN_LIMIT and not load.flagged


@pytest.mark.slow
def test_train_step_benchmark_writes_ratios_with_their_spread(tmp_path, run_benchmark):
    done = run_benchmark(
        "train_step",
        tmp_path,
        *("--sizes", "32", "--rounds", "2", "--warmup-rounds", "0", "--steps", "1", "--no-profile"),
        *("--configs", "default", "default + small convs as matmul"),
        *("--report", "train_step_small"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = tmp_path / "benchmarks" / "results"
    names = sorted(path.name for path in results.iterdir())
    stem = names[0].removesuffix(".json")
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-train_step_small", stem)  # a new dated result
    assert names == [f"{stem}.json", f"{stem}.md", f"{stem}.png"]
    report = json.loads((results / f"{stem}.json").read_text())
    (result,) = report["results"]
    assert result["summary"]["rounds"] == 2 and len(result["records"]) == 6
    for figures in (
        result["summary"]["configs"]["default"],
        result["vs_default"]["default + small convs as matmul"],
    ):
        assert figures["speedup_min"] <= figures["speedup_median"] <= figures["speedup_max"]
    figures = result["summary"]["configs"]["default"]
    assert figures["gflops_per_s"] > 0 and report["machine"]["cpu"]
    assert all(peak["measurements"] == 2 for peak in report["matmul_peak_gflops"].values())  # one per round
    assert_drawn(results / f"{stem}.png")


def test_a_run_writes_a_new_dated_result_and_replaces_a_file_only_at_a_path_it_is_given(tmp_path, monkeypatch):
    from benchmarks.common import RESULTS, result_file, result_stem, write_report

    monkeypatch.chdir(tmp_path)
    first = result_stem("layers")
    assert first.parent == RESULTS and re.fullmatch(r"\d{4}-\d{2}-\d{2}-layers", first.name)
    write_report(first, {"run": 1})
    second = result_stem("layers")  # the day's name is taken, by any of a run's files: the next number
    assert second.name == f"{first.name}-2"
    result_file(second, ".png").write_bytes(b"png")
    assert result_stem("layers").name == f"{first.name}-3"
    assert json.loads((tmp_path / f"{first}.json").read_text())["run"] == 1  # never written over
    # an explicit path is the user's choice: exactly there, replacing what is there
    assert result_stem("layers", tmp_path / "mine.json") == tmp_path / "mine"
    assert result_stem("layers", tmp_path / "mine") == tmp_path / "mine"
    write_report(result_stem("layers", tmp_path / "mine.json"), {"run": 2})
    write_report(result_stem("layers", tmp_path / "mine.json"), {"run": 3})
    assert json.loads((tmp_path / "mine.json").read_text())["run"] == 3


def test_time_to_quality_stops_by_the_params_rule_unless_told_otherwise(tmp_path):
    """The benchmark's runs stop as the project's do (params.yaml's early_stop and epoch cap); the options override
    them, and the pix2pix default's own run takes the common cap unless told its own."""
    from benchmarks.time_to_quality import parse_args

    values = yaml.safe_load(PARAMS.read_text())
    values["early_stop"] |= {
        "window": values["early_stop"]["window"] + 2,
        "patience": values["early_stop"]["patience"] + 3,
    }
    values["train"]["max_epochs"] += 7
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(values))
    args = parse_args(["--params", str(params)])
    assert (args.window, args.patience) == (values["early_stop"]["window"], values["early_stop"]["patience"])
    assert args.max_epochs == args.baseline_max_epochs == values["train"]["max_epochs"]
    args = parse_args(["--params", str(params), "--window", "3", "--patience", "8", "--max-epochs", "9"])
    assert (args.window, args.patience, args.max_epochs, args.baseline_max_epochs) == (3, 8, 9, 9)
    args = parse_args(["--params", str(params), "--baseline-max-epochs", "4"])
    assert (args.max_epochs, args.baseline_max_epochs) == (values["train"]["max_epochs"], 4)


def test_time_to_quality_bars_take_the_colour_of_their_setups_curves(tmp_path):
    """One colour per setup across both panels (nine variants: more than the palette holds), the verdict in words."""
    import matplotlib.colors
    import matplotlib.pyplot as plt

    from benchmarks.time_to_quality import PAPER, PROJECT, plot

    setups = [PAPER, PROJECT, *(f"project default, variant {k}" for k in range(9))]
    children = {
        (name, seed): {"psnr_seconds": [1.0, 2.0, 3.0], "psnr_smoothed": [None, 15.0 + k, 15.5 + k]}
        for k, name in enumerate(setups)
        for seed in (0, 1)
    }
    speedups = {name: [2.0 + k, 3.0 + k] for k, name in enumerate(setups)} | {PAPER: [1, 1], setups[2]: [0.8, 1.2]}
    records = [
        {"config": name, "round": seed, "seconds": 10.0 / speedups[name][seed], "flagged": False}
        for seed in (0, 1)
        for name in setups
    ]
    summary = rounds.summarize(records, baseline=PAPER)
    plot(children, summary, tmp_path / "ttq.png", "a machine")
    curves, bars = plt.gcf().axes
    curve_colour = {}
    for line, (name, _) in zip(curves.get_lines(), children):
        curve_colour.setdefault(name, matplotlib.colors.to_hex(line.get_color()))
    bar_colour = {
        label.get_text(): matplotlib.colors.to_hex(patch.get_facecolor())
        for label, patch in zip(bars.get_yticklabels(), bars.patches)
    }
    verdicts = [text.get_text() for text in bars.texts if "no measurable difference" in text.get_text()]
    plt.close("all")
    assert bar_colour == curve_colour and len(set(curve_colour.values())) > 2
    assert verdicts == ["x1.00 [0.80-1.20]\nno measurable difference"]
    assert_drawn(tmp_path / "ttq.png")


def test_the_step_mix_of_the_layers_adds_up_to_the_plain_steps_flops():
    """benchmarks.layers weighs each network's layers as the plain step runs them; FlopCounterMode on one plain step
    (what train_step divides by) must agree, up to D's first input gradient, which D's own step skips."""
    from benchmarks.common import PAPER_SIZE
    from benchmarks.train_step import plain_step_flops

    layers = convolutions(batch=1)
    mixed = sum(STEP_MIX[name.split()[0]] * step_flops(layer, shape) for name, layer, shape in layers)
    batch = [(torch.randn(1, 1, PAPER_SIZE, PAPER_SIZE), torch.randn(1, 3, PAPER_SIZE, PAPER_SIZE))]
    assert mixed == pytest.approx(plain_step_flops(PAPER_SIZE, batch), rel=0.01)


def test_a_seed_spread_summarises_each_score_over_the_runs_that_have_it():
    from benchmarks.seed_spread import spread

    runs = [
        {"test_psnr": 21.0, "test_ssim": 0.70, "identity": 0.8, "wall_s": 100.0},
        {"test_psnr": 22.5, "test_ssim": 0.72, "identity": None, "wall_s": 120.0},
        {"test_psnr": 21.9, "test_ssim": 0.65, "identity": 1.0, "wall_s": 110.0},
    ]
    figures = spread(runs)
    assert figures["test_psnr"] == pytest.approx({"mean": 21.8, "min": 21.0, "max": 22.5, "spread": 1.5})
    assert figures["test_ssim"]["spread"] == pytest.approx(0.07)
    assert figures["identity"] == pytest.approx({"mean": 0.9, "min": 0.8, "max": 1.0, "spread": 0.2})  # 2 of 3


def test_an_equal_budget_run_is_ended_by_time_alone():
    """--budgets: the pix2pix default trains for a multiple of the project default's wall time, the run's other ends
    (early stop, the epoch cap) out of its way; the overrides are params the stages accept."""
    from benchmarks.time_to_quality import budget_overrides

    from thermal2visible.config.load import load_params, preset_overrides
    from thermal2visible.paths import PIX2PIX_DEFAULT

    params = load_params(PARAMS, [*preset_overrides(PIX2PIX_DEFAULT), *budget_overrides(300.0, 3)])
    assert params.train.max_minutes == pytest.approx(15.0)
    assert params.train.max_epochs * 1.0 > 15 * 60 * 1000  # more epochs than a millisecond each could fill
    assert params.early_stop.patience >= params.train.max_epochs


def test_equal_budgets_give_each_rounds_gain_and_their_median_and_range():
    from benchmarks.time_to_quality import at_equal_budgets

    runs = [
        {"budget_factor": factor, "seed": seed, "pix2pix_val_psnr": pix2pix, "project_val_psnr": project}
        for factor, seed, pix2pix, project in [
            (1, 0, 20.0, 22.0),
            (1, 1, 21.0, 22.5),
            (1, 2, 19.0, 22.0),
            (3, 0, 23.0, 22.0),
            (3, 1, 22.0, 22.5),
        ]
    ]
    summary = at_equal_budgets(runs)
    assert list(summary) == ["1x", "3x"]
    assert summary["1x"]["project_gain_db_median"] == pytest.approx(2.0)  # gains 2.0, 1.5, 3.0
    assert (summary["1x"]["project_gain_db_min"], summary["1x"]["project_gain_db_max"]) == (1.5, 3.0)
    assert summary["3x"]["project_gain_db_median"] == pytest.approx(-0.25)  # gains -1.0, +0.5
    assert summary["3x"]["rounds"] == 2 and summary["3x"]["pix2pix_val_psnr"] == [23.0, 22.0]


def test_the_baseline_reaches_its_own_best_even_where_rounding_would_lift_it():
    """The target is the pix2pix default's best smoothed PSNR as its curve holds it: a best at the last epoch whose
    4-decimal rounding lies above it (seen: 16.643193 -> 16.6432) still counts as reached, at that epoch."""
    from benchmarks.time_to_quality import PAPER, PROJECT, time_to_targets

    baseline_curve = [15.2, 16.1, 16.643193435668945]
    children = {
        (PAPER, 0): {"psnr_seconds": [10.0, 20.0, 30.0], "psnr_smoothed": baseline_curve},
        (PROJECT, 0): {"psnr_seconds": [4.0, 8.0, 12.0, 16.0], "psnr_smoothed": [None, 16.0, 16.7, 17.0]},
    }
    children[PAPER, 0]["best_psnr_smoothed"] = max(baseline_curve)
    children[PROJECT, 0]["best_psnr_smoothed"] = 17.0
    time_to_targets(children)
    assert children[PAPER, 0]["seconds_to_target"] == 30.0
    assert children[PROJECT, 0]["seconds_to_target"] == 12.0
    assert children[PROJECT, 0]["target_psnr"] == max(baseline_curve)


def test_seconds_per_epoch_leave_out_the_start_up():
    """The first epoch's time carries the process's start-up; the rest are the epochs' own."""
    from benchmarks.seed_spread import seconds_per_epoch

    assert seconds_per_epoch({"psnr_seconds": [12.0, 14.0, 16.5, 18.0]}) == pytest.approx(2.0)
    assert seconds_per_epoch({"psnr_seconds": [12.0]}) is None


def test_the_stop_rule_is_chosen_on_validation_curves_alone():
    """benchmarks.stop_rule: the fewest epochs among the rules that stop every run before the cap within the budget;
    the runs' test scores, which it must never read, change nothing."""
    from benchmarks.stop_rule import choose

    def curve(rise: float, seed: int) -> list[float]:  # a fast rise, then a slow creep with epoch-to-epoch noise
        noise = torch.Generator().manual_seed(seed)
        return [
            12 + 10 * (1 - 0.9**epoch) + rise * epoch + 0.3 * float(torch.randn(1, generator=noise))
            for epoch in range(120)
        ]

    runs = [
        {"psnr": curve(rise, seed), "psnr_seconds": [5.0 * epoch for epoch in range(1, 121)], "test_psnr": 20.0 + seed}
        for seed, rise in enumerate((0.001, 0.004, 0.002))
    ]
    cap, grid, chosen = choose(runs, window=5, budget=0.1)
    assert cap == 120 and chosen is not None
    assert all(stop < cap for stop in chosen["stops"]) and chosen["mean_val_loss_db"] <= 0.1
    assert chosen["mean_time_share"] == pytest.approx(chosen["mean_epochs"] / cap)
    eligible = [row for row in grid if row["before_cap"] == len(runs) and row["mean_val_loss_db"] <= 0.1]
    assert chosen["mean_epochs"] == min(row["mean_epochs"] for row in eligible)
    assert any(row["mean_epochs"] < chosen["mean_epochs"] for row in grid)  # shorter rules exist, over budget
    flipped = [run | {"test_psnr": 40.0 - run["test_psnr"]} for run in runs]
    assert choose(flipped, window=5, budget=0.1) == (cap, grid, chosen)


def test_every_kept_result_is_cited_from_the_docs_or_code_or_from_a_result_they_cite():
    """Measurements are kept where something a reader follows names them: the docs, the code, or a result those cite
    (a summary naming its raw .json); the rest live in git history. Any suffix of a cited stem is kept with it."""
    root = Path(__file__).resolve().parents[2]
    results = root / "benchmarks" / "results"
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout.split()
    kept = [path for path in tracked if path.startswith("benchmarks/results/")]
    stems = {Path(path).relative_to("benchmarks/results").as_posix().split(".")[0] for path in kept}

    def named(text: str) -> set[str]:
        return {stem for stem in stems if Path(stem).name in text}

    cited: set[str] = set()
    for path in set(tracked) - set(kept):
        if (root / path).suffix in {".md", ".py", ".sh", ".yaml", ".txt", ""} and (root / path).is_file():
            cited |= named((root / path).read_text(errors="replace"))
    frontier = set(cited)
    while frontier:
        found = set()
        for stem in frontier:
            for text_file in results.glob(f"{stem}.*"):
                if text_file.suffix in {".md", ".json"}:
                    found |= named(text_file.read_text())
        frontier = found - cited
        cited |= found
    assert sorted(stems - cited) == [], sorted(stems - cited)
