"""benchmarks/report.py (with report_sections.py) renders docs/BENCHMARKS.md from sample JSON in the shapes the
benchmarks write (built with the benchmarks' own summarizing functions where they have them), and the pure pieces
of the new benchmarks: percentiles, spreads, the sessions bound."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import statistics
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


def load(name: str):
    """A benchmark script as a module; benchmarks/ goes on sys.path for their sibling import of benchlib."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report():
    return load("report")


@pytest.fixture(scope="module")
def sections():
    return load("report_sections")


def wire_run(wire, scale: float) -> list[dict]:
    cells = [wire.summarize(mode, concurrency, [scale * base * (1 + i / 100) for i in range(100)], 1.0)
             for concurrency in (1, 16, 256)
             for mode, base in (("in-process", 0.001), ("unary", 0.004), ("stream", 0.002))]
    return [dataclasses.asdict(c) for c in wire.with_added(cells)]


def sessions_result(sessions_capacity) -> dict:
    levels = [sessions_capacity.summarize_level(n, [([0.001 * n] * 50 + [0.002 * n], 2.0)] * 5) for n in (16, 64, 256)]
    return {"think_s": 0.5, "bound_ms": 50.0, "seconds": 2.0, "min_steps": 400, "repeats": 5, "results": [
        {"env": "toy", "workers": 2, "levels": levels,
         "max_sessions_under_bound": sessions_capacity.max_sessions_under(levels, 50.0)}]}


def rollout_result(rollout_overlap) -> dict:
    from trainer_client.rollout import RolloutTimes

    rounds = [{"async": RolloutTimes(wall_s=10.0 + r, generation_s=8.0), "lock-step": RolloutTimes(wall_s=12.0, generation_s=6.0)}
              for r in range(5)]
    return rollout_overlap.summarize(rounds) | {"setting": {
        "env": "alfworld gen_train (small generated games)", "episodes": 64, "max_turns": 8, "max_new_tokens": 24,
        "workers": 1, "torch_threads": 1, "model_size": "tiny", "batch_wait_s": 0.02, "rounds": 5}}


def iteration_result(iteration_cost) -> dict:
    seconds = {algo: {stage: 0.0 for stage in (*iteration_cost.ITERATION_STAGES, "iteration")} for algo in iteration_cost.ALGOS}
    seconds["boundary"] |= {"generation": 1.0, "update_actor": 2.0, "iteration": 3.0}
    seconds["ppo_critic"] |= {"generation": 1.0, "values": 0.5, "update_critic": 1.5, "update_actor": 2.0, "iteration": 5.0}
    return {"mode": "synthetic", "model": "tiny:tiny", "device": "cpu", "threads": 2, "iterations": 5,
            "setting": {"episodes": 16}, "seconds": seconds, "ratio": iteration_cost.ratios(seconds, *iteration_cost.ALGOS),
            "claimed_ratio": iteration_cost.CLAIMED_RATIO}


SAMPLES = {
    "alfworld_speed_small": {"source": "generated (small)", "games": 12, "steps": 197,
                             "median": {"reset, first visit": {"upstream_ms": 518.3, "limen_ms": 56.8, "ratio": 0.1096, "goal": 0.5},
                                        "reset, revisit": {"upstream_ms": 518.3, "limen_ms": 9.2, "ratio": 0.0178, "goal": None},
                                        "step": {"upstream_ms": 47.8, "limen_ms": 2.8, "ratio": 0.0586, "goal": 0.4}},
                             "p90_step_ms": {"upstream_ms": 64.2, "limen_ms": 7.2},
                             "median_cpu": {"reset, first visit": {"upstream_ms": 500.0, "limen_ms": 50.0, "ratio": 0.1, "goal": 0.5},
                                            "reset, revisit": {"upstream_ms": 500.0, "limen_ms": 8.0, "ratio": 0.016, "goal": None},
                                            "step": {"upstream_ms": 40.0, "limen_ms": 2.0, "ratio": 0.05, "goal": 0.4}},
                             "p90_step_cpu_ms": {"upstream_ms": 50.0, "limen_ms": 3.0}},
    "webshop_tagger": {"titles": 1000, "same_noun_lists": 348, "pairs": 69726, "goals": 6910, "results_per_goal": 10,
                       "equal": {"title_score": 41516, "r_type": 67745, "reward": 67943, "success": 69724}},
    "policy": {"tiny": {"fwd+bwd full logits s": 0.36, "speed-up response-only": 0.98}},
}


def webshop_run(search_p50: float) -> dict:
    latency = {"p50": search_p50, "p99": 4.5, "n": 500}
    return {"env": {"catalog": "synthetic", "products": 1000, "search_ms": latency, "reset_ms": latency, "step_ms": latency},
            "index": {"products": 50000, "analyze_s": 2.0, "build_s": 3.0, "load_s": 0.01, "matrix_mib": 5.0,
                      "search_ms": latency, "full_catalog_build_min_at_this_length": 1.5},
            "full_catalog_build_min_at_real_length": 5.0}


@pytest.fixture(scope="module")
def results(report, tmp_path_factory) -> Path:
    """A results dir as `report.py --run default` leaves it, alfworld_speed_official having failed."""
    out = tmp_path_factory.mktemp("bench")
    wire, sessions, rollout, iteration = (load(n) for n in ("wire", "sessions_capacity", "rollout_overlap", "iteration_cost"))
    outputs = {"sessions": sessions_result(sessions), "rollout": rollout_result(rollout),
               "iteration_cost_synthetic": iteration_result(iteration), **SAMPLES}
    for name, data in outputs.items():
        (out / f"{name}.1.json").write_text(json.dumps(data))
    for i in range(1, 6):
        (out / f"wire.{i}.json").write_text(json.dumps(wire_run(wire, scale=i)))
        (out / f"webshop_speed.{i}.json").write_text(json.dumps(webshop_run(search_p50=0.1 * i)))
    record = {"returncode": 0, "seconds": 12.0, "finished_at": "2026-01-01T00:00:00+00:00", "log": "x.log",
              "load_average_before": [2.5, 2.0, 1.9], "load_average_after": [3.25, 2.1, 1.9]}
    manifest = {"machine": {"cpu": "Test CPU", "logical_cpus": 2, "usable_cpus": 2, "memory_gib": 8.0,
                            "load_average_at_start": [1.5, 1.0, 0.5], "load_average_at_end": [2.75, 2.0, 1.0],
                            "data": {"ALFWORLD_DATA": "/data/alfworld", "WEBSHOP_DATA": "(unset)"}, "platform": "Linux", "python": "3.11",
                            "torch": "2.13.0+cpu", "torch_default_threads": 2, "OMP_WAIT_POLICY": "PASSIVE",
                            "git": "abc1234", "started_at": "2026-01-01T00:00:00+00:00"},
                "runs": {name: record for name in (*outputs, "wire", "webshop_speed")}
                | {"alfworld_speed_official": record | {"returncode": 1, "log": "artifacts/bench/alfworld_speed_official.log"}}}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_every_benchmark_gets_a_section_with_its_command(report, results, tmp_path):
    document = tmp_path / "BENCHMARKS.md"
    assert report.main(["--run", "none", "--results", str(results), "--out", str(document)]) == 0
    text = document.read_text()
    for bench in report.BENCHMARKS:
        assert f"## {bench.title}\n" in text
        if bench.args:
            assert report.display_command(bench, bench.output_paths(results)[0]) in text
    assert "| load average at start (1, 5, 15 min) | 1.5, 1.0, 0.5 |" in text
    assert "| load average at end (1, 5, 15 min) | 2.75, 2.0, 1.0 |" in text
    assert "**Measured under load**: the 1-minute load average was 1.5, 2.75 (start, end) on 2 usable CPUs" in text
    assert "$ALFWORLD_DATA, WEBSHOP_DATA unset" in text and "/data/alfworld" not in text
    wire_section = text.split("## Wire overhead")[1].split("\n## ")[0]
    assert "1-minute load average 2.5 before, 3.25 after" in wire_section
    official = text.split("## ALFWorld reset and step, ours vs upstream: official games")[1].split("\n## ")[0]
    assert "**Not measured**: the command exited with code 1 (log: `artifacts/bench/alfworld_speed_official.log`)" in official
    rollout_section = text.split("## Rollout")[1].split("\n## ")[0]
    assert "**Not measured**" not in rollout_section and "no results file yet" not in rollout_section


def test_figures_come_from_the_json(report, results):
    outputs = {b.name: report.load_outputs(b, results) for b in report.BENCHMARKS}
    text = report.render_document(json.loads((results / "manifest.json").read_text()), outputs, results)
    # wire: 5 runs with latencies scaled 1..5 x (unary p50 5.96 ms x scale); its ratio to in-process is 4 in each.
    assert "| 16 | unary | 100 | 17.9 [5.96, 29.8] | 23.8 [7.92, 39.6] | 4.00 |" in text
    # webshop: median [min, max] of the five runs' search p50.
    assert "| search p50 ms (BM25 top-50, uncached) | 0.300 [0.100, 0.500] |" in text
    # sessions: p99 is 2 ms per session (32, 128, 512 ms); only 16 sessions stay under 50 ms.
    assert "most sessions with p99 <= 50 ms: **16**" in text
    assert "| 64 | 2.00 | 255 | 64.0 | 128 | 25.5 |" in text   # 51 steps x 5 repeats; p99 is the slow step
    # rollout: the env-wait share of each mode, and the ratios.
    assert "| lock-step | 12.0 | 6.00 | 6.00 | 0.500 | 0 |" in text
    # iteration cost, and the GPU row from the committed measurement, labelled as such.
    assert "Iteration ratio boundary / ppo_critic **0.600**" in text
    assert "**Measured on NVIDIA H200 by `make gpu-check`**" in text and "Iteration ratio **0.847**" in text
    assert "| equal reward | 97.44% |" in text
    # The summary at the top repeats headline figures, each with where it was measured.
    summary = text.split("## Summary")[1].split("\n## ")[0]
    assert "| rollout wall time, async / lock-step | 1.00 [0.833, 1.17] | this CPU |" in summary
    assert "| iteration time, boundary / ppo_critic (Qwen2.5-1.5B shape, random init) | 0.847 | a GPU (NVIDIA H200) |" in summary
    assert "ALFWorld step wall time, ours / upstream (generated (small) games) | 0.059 |" in summary
    assert "ALFWorld step CPU time, ours / upstream (generated (small) games) | 0.050 |" in summary
    assert "| step | 40.0 | 2.00 | 0.050 | <= 0.4 |" in text   # the CPU-time table


def test_load_note_tells_a_busy_machine_from_an_idle_one(report):
    def info(start: float, end: float | None) -> dict:
        return {"usable_cpus": 2, "load_average_at_start": [start, 0, 0],
                "load_average_at_end": None if end is None else [end, 0, 0]}

    assert report.load_note(info(0.2, 1.1)).startswith("**Measured under load**")   # busy by the end
    assert report.load_note(info(0.2, 0.4)).startswith("The machine was close to idle: 1-minute load average 0.2, 0.4")
    assert "load average 0.3 (start, end)" in report.load_note(info(0.3, None))   # a run that never finished
    machine = {"cpu": "c", "logical_cpus": 2, "usable_cpus": 2, "memory_gib": 1, "platform": "p", "python": "3",
               "torch": "t", "torch_default_threads": 1, "OMP_WAIT_POLICY": "PASSIVE", "git": "g", "started_at": "s",
               **info(0.2, 0.4), "reruns": ["sessions at 2026-01-01T01:00:00+00:00"]}
    assert "| re-run afterwards | sessions at 2026-01-01T01:00:00+00:00 |" in report.render_machine(machine)


@pytest.mark.parametrize("value, text", [(1571.2, "1571"), (22.18, "22.2"), (0.00291, "0.00291"), (0.0, "0"),
                                         (float("nan"), "–"), (None, "–"), (1.0, "1.00")])
def test_number_never_uses_scientific_notation(sections, value, text):
    assert sections.number(value) == text


def test_percentile_and_spread():
    benchlib = load("benchlib")
    assert benchlib.percentile(list(range(1, 101)), 99) == 99
    assert benchlib.percentile([3.0], 99) == 3.0
    assert benchlib.percentile([1, 2], 50) == 1
    assert benchlib.spread([3, 1, 2, 5, 4]) == {"median": 3, "min": 1, "max": 5, "runs": 5}
    with pytest.raises(ValueError):
        benchlib.spread([])


def test_small_levels_are_measured_long_enough_for_a_p99():
    sessions = load("sessions_capacity")
    assert sessions.level_seconds(16, 0.5, 2.0, 400) == 12.5      # 16 sessions step ~32 times a second
    assert sessions.level_seconds(512, 0.5, 2.0, 400) == 2.0      # the floor


def test_max_sessions_stops_at_the_first_level_over_the_bound():
    sessions = load("sessions_capacity")

    def level(n: int, p99: float) -> dict:
        return {"sessions": n, "p99_ms": {"median": p99}}

    assert sessions.max_sessions_under([level(64, 60.0), level(16, 10.0), level(256, 40.0)], 50.0) == 16
    assert sessions.max_sessions_under([level(16, 80.0)], 50.0) is None
    assert sessions.endless_action("webshop", 1, __import__("random").Random(0)).startswith("search[")
    assert sessions.endless_action("webshop", 2, __import__("random").Random(0)) == "click[back to search]"


def _episode(observations_actions: list[tuple[str, str]], won: bool):
    from trainer_client.rollout import EpisodeRecord, TaskRef, Turn

    turns = [Turn((1,), (2,), (0.0,), observation, action, True, 0.0, 0.0, False) for observation, action in observations_actions]
    return EpisodeRecord(TaskRef("alfworld", "gen_test", "t"), turns=turns, won=won, terminated=won, truncated=not won)


def test_demo_failures_counts_rejected_and_repeated_actions():
    demo_failures = load("demo_failures")
    lost = _episode([("start", "go to desk 1")] + [("Nothing happens.", "go to desk 1")] * 6, won=False)
    won = _episode([("start", "go to bed 1"), ("You arrive at bed 1.", "take book 1 from bed 1")], won=True)
    # Five of the lost episode's actions were answered "Nothing happens."; its last action has no answer.
    assert demo_failures.rejected_flags(lost) == [True] * 6 + [None]
    assert demo_failures.rejected_flags(won) == [False, False]
    stats = demo_failures.failure_stats([lost, won])
    assert stats["success"] == 0.5 and stats["lost_with_5_rejected"] == 1
    assert stats["rejected_share"] == pytest.approx(6 / 9) and stats["repeat_share"] == pytest.approx(6 / 9)


def test_outcome_spread_splits_variance_within_and_between_tasks():
    spread = load("outcome_spread").spread
    # Task a always wins, task b always loses: all of the spread is between tasks.
    between = spread([[1.0, 1.0], [0.0, 0.0]])
    assert between["variance"] == 0.25 and between["within_task_share"] == 0.0 and between["tasks_that_differ"] == 0.0
    # Both tasks win half their samples: all of it is within.
    within = spread([[1.0, 0.0], [0.0, 1.0]])
    assert within["within_task_share"] == 1.0 and within["tasks_that_differ"] == 1.0
    mixed = spread([[1.0, 0.0], [0.0, 0.0]])   # total 3/16, within (1/4 + 0) / 2
    assert mixed["within_task_share"] == pytest.approx((1 / 8) / (3 / 16)) and mixed["tasks_that_differ"] == 0.5


def test_demo_failures_mc_advantages_favour_what_wins():
    demo_failures = load("demo_failures")
    lost = _episode([("start", "go to desk 1"), ("Nothing happens.", "go to desk 1"), ("Nothing happens.", "look")], won=False)
    won = _episode([("start", "go to bed 1"), ("You arrive at bed 1.", "take book 1 from bed 1")], won=True)
    advantages = demo_failures.mc_advantages([lost, won], gamma=0.5)
    returns = [0.0, 0.0, 0.0, 0.5, 1.0]
    mean, std = sum(returns) / 5, statistics.stdev(returns)
    assert [a for row in advantages for a in row] == pytest.approx([(g - mean) / std for g in returns])
    kinds = demo_failures.advantage_by_kind([lost, won], gamma=0.5)
    assert kinds["rejected (lost)"]["n"] == 2 and kinds["rejected (lost)"]["mean"] < 0
    assert kinds["accepted (won)"]["n"] == 2 and kinds["accepted (won)"]["mean"] > 0


def test_demo_failures_counts_unlisted_actions():
    demo_failures = load("demo_failures")
    # The lost episode's first action was listed, its six rejected repeats of "go to shelf 1" were not.
    lost = _episode([("start", "go to desk 1")] + [("Nothing happens.", "go to shelf 1")] * 6, won=False)
    stats = demo_failures.failure_stats([lost], [[True] + [False] * 6])
    assert stats["unlisted_share"] == pytest.approx(6 / 7)
    # Five of the six unlisted actions were answered "Nothing happens." (the last has no answer); the first
    # rejection answered the listed "go to desk 1".
    assert stats["rejected_unlisted_share"] == pytest.approx(5 / 6)


def test_value_readout_probe_separates_a_linear_signal_from_noise():
    probe = load("value_readout_probe")
    assert probe.discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(800, 16, generator=generator)
    episode = torch.arange(800) // 10
    linear = features @ torch.randn(16, generator=generator) + 0.3
    _, held_out = probe.held_out_explained_variance(features, linear, episode, strength=0.01)
    assert held_out > 0.99
    noise = torch.randn(800, generator=generator)
    train, held_out = probe.held_out_explained_variance(features, noise, episode, strength=0.01)
    assert train > 0 and held_out < 0.05        # fits its own noise a little, predicts none of the rest


def test_decode_cache_times_both_caches_on_the_same_prompts(tmp_path, capsys):
    decode_cache = load("decode_cache")
    out = tmp_path / "decode.json"
    assert decode_cache.main(["--model", "tiny", "--batch", "2", "--prompt-tokens", "12", "--repeats", "1",
                              "--threads", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["model"] == "tiny model" and result["prompt_tokens"] == [12, 13]
    for row in result["rows"].values():
        assert 0 < row["prefill_s"] < row["generate_24_s"]
    assert result["decode_step_ratio"] > 0
    assert "growing / preallocated: decode step" in capsys.readouterr().out
