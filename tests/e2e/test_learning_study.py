"""The learning study's smallest configuration (configs/study_smoke.yaml: 1 seed, 2 iterations, every core
algorithm, 2 eval seeds, the toy env through a real env server), run end to end; summary.json and RESULTS.md
checked number by number against the run's results files; a rerun skips what is done; `--commit` makes one
commit per finished part in a scratch git repository, and a fresh out_dir resumes from those commits; the paired
verdicts on made-up 3-seed results."""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import subprocess
from pathlib import Path

import pytest
import yaml
from study_fixtures import ROOT, SMOKE, WINS, made_up_results
from training_fixtures import load_benchmark

from trainer_client import config
from trainer_client.demo import DemoConfig
from trainer_client.train_config import TrainConfig

import study_config
import study_files
import study_report
import study_stats

CORE = ("boundary", "grpo", "ppo_critic_turn", "ppo_critic_verl")


@pytest.fixture(scope="module")
def study():
    return load_benchmark(ROOT / "benchmarks" / "learning_study.py")


def smoke_args(out: Path, *extra: str) -> list[str]:
    return ["--config", str(SMOKE), f"out_dir={out}", f"report_dir={out}", f"measurements_dir={out / 'measurements'}",
            "--threads", "2", *extra]


@pytest.fixture(scope="module")
def smoke_run(study, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("study_smoke")
    assert study.main(smoke_args(out)) == 0
    return out


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def table_rows(markdown: str, heading: str) -> list[list[str]]:
    """The cells of the first table under the heading that starts with `## heading` (header and separator dropped)."""
    section = markdown.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    first_table = section[section.index("\n|"):].split("\n\n", 1)[0]
    rows = [line for line in first_table.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def mean_success(evaluation: dict) -> float:
    return statistics.fmean(run["success"] for run in evaluation["runs"])


def test_smoke_study_runs_every_core_algorithm_on_the_same_episodes(smoke_run):
    sft = read(smoke_run / "seed_0" / "sft.json")
    assert sft["expert_won"] == sft["expert_episodes"] == 24
    assert set(sft["seconds"]) == {"expert_play", "tokenizer_and_model", "sft", "eval"}
    played = {}
    for label, result in [("sft", sft)] + [(arm, read(smoke_run / "seed_0" / arm / "results.json")) for arm in CORE]:
        evaluation = result["evaluations"]["test"]
        assert [run["seed"] for run in evaluation["runs"]] == [0, 1] and evaluation["tasks_played"] == 12
        for run in evaluation["runs"]:
            assert run["episodes"] + run["dropped"] == 12 and len(run["outcomes"]) == run["episodes"]
            assert run["success"] == pytest.approx(statistics.fmean(o["won"] for o in run["outcomes"]))
        played[label] = {(o["task_id"], run["seed"]) for run in evaluation["runs"] for o in run["outcomes"]}
    assert len(set(map(frozenset, played.values()))) == 1     # every checkpoint played the same (game, eval seed)s
    for arm in CORE:
        result = read(smoke_run / "seed_0" / arm / "results.json")
        assert (result["arm"], result["seed"], result["iterations"], result["episodes_per_iteration"]) == (arm, 0, 2, 8)
        assert result["group_size"] == (8 if arm == "grpo" else 1)
        rows = [json.loads(line) for line in (smoke_run / "seed_0" / arm / "metrics.jsonl").read_text().splitlines()]
        assert [row["iteration"] for row in rows] == [0, 1]
        assert result["time_per_iteration"]["iteration"] == pytest.approx(
            statistics.fmean(row["time/iteration"] for row in rows))
        assert result["machine"]["reference_step_s"] > 0 and result["machine"]["torch_threads"] >= 1
        # Each arm started from the seed's one SFT checkpoint.
        config = (smoke_run / "seed_0" / arm / "config.yaml").read_text()
        assert f"path: {smoke_run / 'seed_0' / 'sft'}" in config
    assert (smoke_run / "results_learning_curves.png").stat().st_size > 10_000


def test_the_webshop_study_runs_every_core_arm_and_pairs_the_score(study, tmp_path):
    """configs/study_webshop.yaml, shrunk to a minute: product ids are whole tokens of the seed's tokenizer, and the
    summary and RESULTS.md pair the score beside success."""
    from transformers import AutoTokenizer

    out = tmp_path / "study_webshop"
    assert study.main(["--config", str(ROOT / "configs" / "study_webshop.yaml"), f"out_dir={out}", f"report_dir={out}",
                       f"measurements_dir={out / 'measurements'}", "--threads", "2", "seeds=[0]", "eval_seeds=[0]",
                       "eval_episodes={test: 4}", "sft.episodes=8", "sft.epochs=0.5", "rl.iterations=1",
                       "rl.episodes_per_iteration=8", "rl.save_every=1", "curve_episodes=2", "model_size=micro"]) == 0
    vocabulary = AutoTokenizer.from_pretrained(out / "seed_0" / "base").get_vocab()
    assert any(re.fullmatch(r"s\d{9}", token) for token in vocabulary)
    summary = read(out / "measurements" / "summary.json")
    assert summary["env"] == "webshop" and set(summary["score"]["arms"]) == set(CORE)
    assert set(summary["score"]["comparisons"]) >= {f"boundary vs {arm}" for arm in CORE[1:]}
    assert "Score (mean reward x 100) on `test`" in (out / "RESULTS.md").read_text()


def test_summary_json_is_computed_from_the_results_files(smoke_run):
    summary = read(smoke_run / "measurements" / "summary.json")
    sft = read(smoke_run / "seed_0" / "sft.json")
    assert (summary["seeds"], summary["iterations"], summary["eval_seeds"], summary["games"]) == ([0], 2, [0, 1], 12)
    assert set(summary["arms"]) == set(CORE)
    for arm in CORE:
        result, entry = read(smoke_run / "seed_0" / arm / "results.json"), summary["arms"][arm]
        assert entry["held_out_mean"] == pytest.approx(mean_success(result["evaluations"]["test"]))
        assert entry["held_out_std"] is None                        # one training seed: no spread to report
        assert entry["sft_mean"] == pytest.approx(mean_success(sft["evaluations"]["test"]))
        # Nothing dropped on the toy env, so the paired gain is the plain difference of the two success rates.
        assert entry["gain"] == pytest.approx(entry["held_out_mean"] - entry["sft_mean"])
        low, high = entry["gain_ci95"]
        assert low <= entry["gain"] <= high and entry["episode_pairs"] == 24
        assert entry["seconds_per_iteration"] == pytest.approx(result["time_per_iteration"]["iteration"])
    boundary, grpo = summary["arms"]["boundary"], summary["arms"]["grpo"]
    assert summary["comparisons"]["boundary vs grpo"]["gain"] == pytest.approx(
        boundary["held_out_mean"] - grpo["held_out_mean"])
    assert list(summary["comparisons"]) == ["boundary vs grpo", "boundary vs ppo_critic_turn",
                                            "boundary vs ppo_critic_verl", "ppo_critic_turn vs ppo_critic_verl"]
    # The copies that get committed: the same results files, and the SFT start every arm resumes from; no RL
    # checkpoints, no untrained base.
    copied = smoke_run / "measurements" / "seed_0"
    assert read(copied / "boundary" / "results.json") == read(smoke_run / "seed_0" / "boundary" / "results.json")
    assert [p.relative_to(copied) for p in copied.glob("**/*.safetensors")] == [Path("sft/model.safetensors")]
    assert (copied / "sft" / "model.safetensors").read_bytes() == (smoke_run / "seed_0" / "sft" / "model.safetensors").read_bytes()
    assert not list(copied.glob("**/checkpoints")) and not (copied / "base").exists()


def test_results_md_numbers_equal_the_summary_and_results_files(smoke_run):
    markdown = (smoke_run / "RESULTS.md").read_text()
    summary = read(smoke_run / "measurements" / "summary.json")

    def points(value: float, sign: bool = False) -> str:
        return f"{100 * value:+.1f}" if sign else f"{100 * value:.1f}"

    gains = table_rows(markdown, "Gain over the SFT start and between arms, `test`")
    assert [row[0] for row in gains] == list(CORE)
    for arm, seeds, held, start, gain, per_iteration, *_ in gains:
        entry = summary["arms"][arm]
        low, high = entry["gain_ci95"]
        assert (seeds, held, start) == ("1", points(entry["held_out_mean"]), points(entry["sft_mean"]))
        assert gain == f"{points(entry['gain'], True)} [{points(low, True)}, {points(high, True)}]"
        assert per_iteration == f"{entry['seconds_per_iteration']:.2f}"
    answers = markdown.split("## The answer, on `test`", 1)[1].split("\n## ", 1)[0]
    versus_grpo = next(line for line in answers.splitlines() if line.startswith("- Boundary against grpo"))
    comparison = summary["comparisons"]["boundary vs grpo"]
    assert points(comparison["gain"], True) in versus_grpo and f"paired on {comparison['episodes']} episodes" in versus_grpo
    # Every run's own row: success per eval seed, and the time table.
    runs = {"SFT (start)": read(smoke_run / "seed_0" / "sft.json")}
    runs |= {arm: read(smoke_run / "seed_0" / arm / "results.json") for arm in CORE}
    for label, seed, success, per_iteration, _ in table_rows(markdown, "Every run"):
        run = runs[label]
        assert (seed, success) == ("0", " / ".join(points(r["success"]) for r in run["evaluations"]["test"]["runs"]))
        assert per_iteration == ("–" if label == "SFT (start)" else f"{run['time_per_iteration']['iteration']:.3f}")
    for row in table_rows(markdown, "Time per iteration and its parts"):
        stages = runs[row[0]]["time_per_iteration"]
        assert row[1:] == [f"{stages[s]:.3f}" for s in ("generation", "env_wait", "trunk", "old_log_prob", "ref",
                                                          "values", "adv", "update_critic", "update_actor",
                                                          "iteration")]
    stage_rows = {row[0]: row[1] for row in table_rows(markdown, "Wall time per stage")}
    assert stage_rows["SFT start: sft"] == f"{runs['SFT (start)']['seconds']['sft'] / 60:.1f}"
    assert stage_rows["grpo: RL"] == f"{runs['grpo']['seconds']['train'] / 60:.1f}"
    assert "> **Preliminary**: 1 seed(s)" in markdown and "Incomplete" not in markdown


def test_a_rerun_skips_finished_runs(study, smoke_run):
    stamps = {p: p.stat().st_mtime_ns for p in smoke_run.glob("seed_0/**/*.json")}
    assert study.main(smoke_args(smoke_run)) == 0
    assert {p: p.stat().st_mtime_ns for p in smoke_run.glob("seed_0/**/*.json")} == stamps


def test_a_held_out_split_missing_from_finished_runs_is_evaluated_on_rerun(study, smoke_run):
    # e.g. valid_seen, when the study first ran without ALFWORLD_DATA: the finished steps keep their training and
    # only play the split they lack, which (seeded per episode) gives what a first evaluation would have given.
    files = [smoke_run / "seed_0" / "sft.json", smoke_run / "seed_0" / "grpo" / "results.json"]
    before = [read(path) for path in files]
    for path, result in zip(files, before):
        path.write_text(json.dumps(result | {"evaluations": {}}))
    assert study.main(smoke_args(smoke_run)) == 0
    for path, result in zip(files, before):
        runs, expected = read(path)["evaluations"]["test"]["runs"], result["evaluations"]["test"]["runs"]
        assert [run["outcomes"] for run in runs] == [run["outcomes"] for run in expected]


def test_a_changed_setting_is_refused_on_an_existing_out_dir(study, smoke_run, capsys):
    with pytest.raises(SystemExit):
        study.main(smoke_args(smoke_run, "rl.optim.lr=0.5"))
    assert "holds runs made with other settings (rl.optim.lr)" in capsys.readouterr().err


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.mark.timeout(900)   # a whole smoke seed: over the default 300 s on 2 cores shared by ~20 busy processes
def test_commit_publishes_each_finished_part_and_a_fresh_out_dir_resumes_from_it(study, smoke_run, tmp_path):
    # Last in this file: it adds seed 1 to the smoke run.
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "study@example.invalid")
    git(repo, "config", "user.name", "study")
    stale = repo / "docs" / "measurements" / "study" / "seed_0" / "base" / "tokenizer.json"  # an older study's copy
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    (repo / "other.txt").write_text("someone else's work")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "before")
    (repo / "other.txt").write_text("someone else's staged change")
    git(repo, "add", "other.txt")
    docs = repo / "docs"
    measurements = docs / "measurements" / "study"
    args = ["--config", str(SMOKE), f"report_dir={docs}", f"measurements_dir={measurements}", "seeds=[0,1]", "--commit"]
    assert study.main([*args, f"out_dir={smoke_run}"]) == 0

    # Seed 0 was finished: its first part's publish commits all of it; then seed 1's SFT and each arm, one by one.
    subjects = git(repo, "log", "--format=%s").splitlines()
    assert len(subjects) == 7 and subjects[-1] == "before"
    assert "seed 0 sft finished" in subjects[-2] and "seed 1 sft finished" in subjects[-3]
    assert ["seed 1 " + arm + " finished" in subject for subject, arm in zip(subjects[3::-1], CORE)] == [True] * 4
    for revision, seeds in (("HEAD~5", [0]), ("HEAD", [0, 1])):
        summary = json.loads(git(repo, "show", f"{revision}:docs/measurements/study/summary.json"))
        assert summary["seeds"] == seeds
        committed = set(git(repo, "ls-tree", "-r", "--name-only", revision).splitlines())
        assert {f"docs/measurements/study/seed_{s}/{arm}/results.json" for s in seeds for arm in CORE} <= committed
        assert {f"docs/measurements/study/seed_{s}/sft/model.safetensors" for s in seeds} <= committed
        assert {"docs/RESULTS.md", "docs/results_learning_curves.png"} <= committed
        assert "docs/measurements/study/seed_0/base/tokenizer.json" not in committed
        assert not [name for name in committed if "/checkpoints/" in name]
    assert git(repo, "show", "HEAD:other.txt") == "someone else's work"          # not swept into the study's commits
    assert git(repo, "diff", "--cached", "--name-only").split() == ["other.txt"]  # still staged, untouched
    assert study.main([*args, f"out_dir={smoke_run}"]) == 0                       # nothing new: no commit
    assert len(git(repo, "log", "--format=%s").splitlines()) == 7

    # A new session's checkout: out_dir is gone, the commits remain. Every finished part is restored and skipped
    # (no training, no evaluation: no checkpoint is written), and the numbers are the same (only the command that
    # generated them names the other out_dir).
    fresh = tmp_path / "fresh_out"
    summary_before = read(measurements / "summary.json")
    assert study.main([*args, f"out_dir={fresh}"]) == 0
    assert read(fresh / "seed_1" / "grpo" / "results.json") == read(smoke_run / "seed_1" / "grpo" / "results.json")
    assert not list(fresh.glob("**/checkpoints")) and not (fresh / "seed_0" / "base").exists()
    summary_after = read(measurements / "summary.json")
    assert summary_after.pop("generated_by") != summary_before.pop("generated_by")
    assert summary_after == summary_before


def test_a_committed_study_with_other_settings_is_not_restored(tmp_path):
    committed = tmp_path / "measurements"
    committed.mkdir()
    cfg = config.load(study_config.StudyConfig, SMOKE)
    other = config.to_dict(cfg)
    other["sft"]["epochs"] = 99
    (committed / "study.yaml").write_text(yaml.safe_dump(other))
    (committed / "seed_0").mkdir()
    (committed / "seed_0" / "sft.json").write_text("{}")
    out = tmp_path / "out"
    fresh = dataclasses.replace(cfg, out_dir=str(out), measurements_dir=str(committed))
    assert study_files.restore_from_measurements(fresh) == []
    assert not out.exists()
    same = committed / "study.yaml"
    same.write_text(yaml.safe_dump(config.to_dict(cfg)))
    assert study_files.restore_from_measurements(fresh) == [Path("study.yaml"), Path("seed_0/sft.json")]
    assert (out / "seed_0" / "sft.json").read_text() == "{}"


def test_publishing_keeps_committed_parts_this_config_does_not_run(tmp_path):
    """A tuning run published with `extended: false` once deleted the committed extended arms: export replaces the
    arms the config runs and leaves the others as committed."""
    cfg = config.load(study_config.StudyConfig, SMOKE)
    out, committed = tmp_path / "out", tmp_path / "measurements"
    cfg = dataclasses.replace(cfg, out_dir=str(out), measurements_dir=str(committed), extended=False)
    arm = sorted(cfg.arms)[0]
    for root, name, text in ((committed, "rloo", "kept"), (committed, arm, "old"), (out, arm, "new")):
        for file in ("results.json", "metrics.jsonl", "config.yaml"):
            (root / "seed_0" / name).mkdir(parents=True, exist_ok=True)
            (root / "seed_0" / name / file).write_text(text)
    assert "rloo" not in cfg.arms
    study_files.export_measurements(cfg)
    assert (committed / "seed_0" / "rloo" / "results.json").read_text() == "kept"
    assert (committed / "seed_0" / arm / "results.json").read_text() == "new"


# ---- the pure parts, on made-up results ------------------------------------------------------------------------

def test_paired_gain_pools_seeds_per_game_and_leaves_out_what_one_side_dropped():
    results = made_up_results()
    boundary, grpo = results.runs["boundary"], results.runs["grpo"]
    gain = study_stats.paired(boundary, grpo, "test")
    assert gain["gain"] == pytest.approx(0.5) and gain["games"] == 40 and gain["episodes"] == 240
    assert 0 < gain["ci95"][0] < 0.5 < gain["ci95"][1]
    assert study_stats.paired(boundary, grpo, "test", category="b")["gain"] == 0.0
    # grpo's seed 2 dropped game g00 on eval seed 1: that episode leaves the pairing on both sides.
    runs = grpo[2]["evaluations"]["test"]["runs"]
    runs[1]["outcomes"] = [o for o in runs[1]["outcomes"] if o["task_id"] != "g00"]
    assert study_stats.paired(boundary, grpo, "test")["episodes"] == 239
    # Only the seeds both sides finished are paired.
    assert study_stats.paired(boundary, {0: grpo[0]}, "test")["seeds"] == [0]


def test_summary_and_answers_are_computed_from_the_numbers():
    results = made_up_results()
    summary = study_stats.study_summary(results, "python benchmarks/learning_study.py")
    assert summary["seeds"] == [0, 1, 2] and summary["iterations"] == results.cfg.rl.iterations
    boundary = summary["arms"]["boundary"]
    assert (boundary["held_out_mean"], boundary["held_out_std"], boundary["sft_mean"]) == (0.75, 0.0, 0.125)
    assert boundary["gain"] == pytest.approx(0.625) and boundary["gain_ci95"][0] > 0.4
    assert boundary["seconds_per_iteration"] == 3.0 and boundary["wall_seconds"] == {"train": 120.0, "eval": 30.0}
    lines = study_report.answer_lines(summary)
    text = "\n".join(lines)
    assert "Boundary against grpo: **boundary beats grpo**: +50.0 [" in text
    assert "Boundary against ppo_critic_turn: **no difference resolved** between boundary and ppo_critic_turn" in text
    readout = next(line for line in lines if line.startswith("The shared readout"))
    credit = next(line for line in lines if line.startswith("Turn-level credit"))
    assert "no difference resolved" in readout and "**ppo_critic_turn beats ppo_critic_verl**: +35.0" in credit
    assert "What carries the difference: turn-level credit." in text
    assert "boundary's iteration took 3.0 s; each baseline's, relative to it: grpo 1.00x, ppo_critic_turn 2.00x" in text
    where = next(line for line in lines if line.startswith("Where boundary is not resolved ahead"))
    assert "against grpo in b" in where and "against ppo_critic_turn in a, b" in where and "verl" not in where
    markdown = study_report.render_results(results, summary, "python benchmarks/learning_study.py", interpretation="It learned.")
    assert "| boundary | 3 | 75.0 ± 0.0 | 12.5 | +62.5 [" in markdown
    assert "## Interpretation (the lead's)\n\nIt learned." in markdown and "Preliminary" not in markdown
    assert "> **Incomplete**" not in markdown


def test_the_score_is_paired_beside_success_when_the_study_asks_for_it():
    results = made_up_results()
    assert "score" not in study_stats.study_summary(results, "cmd")
    # Boundary's lost games still earn half the score (a purchase nearly right), grpo's nothing: the scores part.
    for by_seed in results.runs["boundary"].values():
        for run in by_seed["evaluations"]["test"]["runs"]:
            for outcome in run["outcomes"]:
                outcome["score"] = 1.0 if outcome["won"] else 0.5
            run["score"] = 100 * statistics.fmean(o["score"] for o in run["outcomes"])
    graded = study_stats.StudyResults(dataclasses.replace(results.cfg, score=True), results.sft, results.runs, {})
    summary = study_stats.study_summary(graded, "cmd")
    score, success = summary["score"], summary["arms"]["boundary"]
    assert score["sft_mean"] == 0.125 and score["arms"]["boundary"]["mean"] == pytest.approx(0.875)
    assert score["arms"]["boundary"]["gain"]["gain"] == pytest.approx(0.75) and success["gain"] == pytest.approx(0.625)
    assert score["arms"]["boundary"]["gain"]["per_seed"] == pytest.approx({0: 0.75, 1: 0.75, 2: 0.75})
    versus_grpo = score["comparisons"]["boundary vs grpo"]
    assert versus_grpo["gain"] == pytest.approx((30 + 0.5 * 10 - 10) / 40) and versus_grpo["seed_ci95"][0] > 0
    markdown = study_report.render_results(graded, summary, "cmd", interpretation=None)
    assert "Score (mean reward x 100) on `test`" in markdown and "| boundary | 3 | 87.5 | 12.5 | +75.0 [" in markdown
    assert "- Score, boundary against grpo: **boundary beats grpo**: +62.5 [" in markdown


def test_time_ratios_are_taken_seed_by_seed_on_each_machines_reference_step():
    results = made_up_results()           # boundary 3 s, ppo_critic_turn 6 s per iteration, no machine recorded
    turn, boundary = results.runs["ppo_critic_turn"], results.runs["boundary"]
    assert study_stats.time_vs(turn, boundary) == {"ratio": 2.0, "by_seed": {0: 2.0, 1: 2.0, 2: 2.0}, "normalized_seeds": []}
    # Seed 1's critic ran on a machine twice as slow at the reference step: on one scale it cost as much as boundary.
    for seed, arm, reference in [(1, turn, 0.4), (1, boundary, 0.2), (2, turn, 0.2), (2, boundary, 0.2)]:
        arm[seed]["machine"] = {"reference_step_s": reference}
    ratios = study_stats.time_vs(turn, boundary)
    assert ratios["by_seed"] == {0: 2.0, 1: 1.0, 2: 2.0} and ratios["normalized_seeds"] == [1, 2]
    summary = study_stats.study_summary(results, "cmd")
    assert summary["arms"]["ppo_critic_turn"]["time_vs_boundary"]["ratio"] == pytest.approx(5 / 3)
    text = "\n".join(study_report.answer_lines(summary))
    assert "ppo_critic_turn 1.67x" in text and "seeds 0, 1, 2 recorded no machine reference" in text   # grpo recorded none


def test_extended_arms_in_progress_keep_the_finished_core_seeds():
    results = made_up_results()
    extended = dataclasses.replace(results.cfg, extended=True)
    runs = results.runs | {"rloo": {0: results.runs["grpo"][0]}}            # one extended arm, one seed so far
    summary = study_stats.study_summary(study_stats.StudyResults(extended, results.sft, runs, {}), "cmd")
    assert summary["seeds"] == [0, 1, 2] and summary["arms"]["rloo"]["seeds"] == [0]
    assert study_stats.finished_seeds(study_stats.StudyResults(results.cfg, results.sft, {k: v for k, v in runs.items()
                                                                               if k != "grpo"}, {})) == []


def test_a_reversed_gap_is_said_the_other_way():
    wins = WINS | {"grpo": range(40)}     # grpo wins every game
    summary = study_stats.study_summary(made_up_results(wins), "cmd")
    assert "**grpo beats boundary**: -25.0 [" in "\n".join(study_report.answer_lines(summary))


def test_unequal_episodes_are_refused_before_any_work():
    with pytest.raises(ValueError, match="not a multiple of grpo's group size 8"):
        study_config.StudyConfig(rl=TrainConfig(episodes_per_iteration=12))
    with pytest.raises(ValueError, match="unknown arms"):
        study_config.StudyConfig(arm_overrides={"ppo": ["optim.lr=1"]})
    with pytest.raises(ValueError, match="eval_seeds"):
        study_config.StudyConfig(eval_seeds=(0, 0))


def test_the_study_mirrors_the_demo():
    """configs/study.yaml runs the demo's recipe (configs/base/demo_recipe.yaml: games, model, SFT and RL settings);
    only what the study must set differently may differ."""
    demo = config.load(DemoConfig, ROOT / "configs" / "demo.yaml")
    study_cfg = config.load(study_config.StudyConfig, ROOT / "configs" / "study.yaml")
    for key in ("env", "train_split", "server_args", "model_size", "sft"):
        assert getattr(study_cfg, key) == getattr(demo, key), key
    assert study_cfg.eval_splits[0] == demo.eval_split and study_cfg.eval_episodes[demo.eval_split] >= 300
    differ = study_config.changed_settings(config.to_dict(demo.rl), config.to_dict(study_cfg.rl))
    # The study ran (and is committed) on the anchor's prompt layout; the demo moved to the compact one after it.
    assert set(differ) <= {"algo", "iterations", "save_every", "optim.critic_lr", "prompt.compact"}, differ
    assert not study_cfg.rl.prompt.compact
    assert study_cfg.rl.iterations >= 48 and len(study_cfg.seeds) >= 3 and len(study_cfg.eval_seeds) >= 2
    assert yaml.safe_load((ROOT / "configs" / "study.yaml").read_text())["rl"].get("algo") is None


def test_a_setting_added_after_a_save_reads_as_its_default(tmp_path):
    cfg = config.load(study_config.StudyConfig, ROOT / "configs" / "study.yaml")
    saved_tree = config.to_dict(cfg)
    del saved_tree["sft"]["mistake_rate"]                   # saved before the setting existed
    saved = tmp_path / "study.yaml"
    saved.write_text(yaml.safe_dump(saved_tree, sort_keys=False))
    assert study_config.stale_settings(saved, cfg) == []
    changed = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, mistake_rate=0.2))
    assert study_config.stale_settings(saved, changed) == ["sft.mistake_rate"]
    more_epochs = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, epochs=cfg.sft.epochs + 1))
    assert study_config.stale_settings(saved, more_epochs) == ["sft.epochs"]


def test_a_study_saved_with_flat_sft_keys_reads_in_todays_shape(tmp_path):
    """Studies saved before the SFT settings became one section wrote `sft_lr`, ...: they are the same settings."""
    cfg = config.load(study_config.StudyConfig, ROOT / "configs" / "study.yaml")
    tree = config.to_dict(cfg)
    tree |= {f"sft_{key}": value for key, value in tree.pop("sft").items()}
    saved = tmp_path / "study.yaml"
    saved.write_text(yaml.safe_dump(tree, sort_keys=False))
    assert study_config.stale_settings(saved, cfg) == []
    more_epochs = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, epochs=cfg.sft.epochs + 1))
    assert study_config.stale_settings(saved, more_epochs) == ["sft.epochs"]


def test_the_committed_study_resumes_under_todays_settings(tmp_path):
    """The finished arms ran with timed batches (batch_wait_s 0.02); today's lock-step batches only change how a run
    executes, so `extended=true` resumes the committed study instead of refusing it. A setting of what is learned
    still makes it stale."""
    cfg = config.load(study_config.StudyConfig, ROOT / "configs" / "study.yaml")
    tree = yaml.safe_load((ROOT / "docs" / "measurements" / "study" / "study.yaml").read_text())
    tree["rl"]["rollout"]["batch_wait_s"] = 0.02                     # as the four core arms ran
    committed = tmp_path / "study.yaml"
    committed.write_text(yaml.safe_dump(tree, sort_keys=False))
    assert cfg.rl.rollout.batch_wait_s != 0.02 and study_config.stale_settings(committed, cfg) == []
    changed = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, rollout=dataclasses.replace(
        cfg.rl.rollout, max_turns=cfg.rl.rollout.max_turns + 1)))
    assert study_config.stale_settings(committed, changed) == ["rl.rollout.max_turns"]
