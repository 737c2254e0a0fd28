"""limen-eval's pure parts: mean ± std over results, the anchor-style table, learning curves, task subsets,
the settings a checkpoint is evaluated with, and the prompting baselines' prompts."""

from __future__ import annotations

import math

import pytest
import yaml

from trainer_client.checkpoints import find_run_config
from trainer_client.eval_report import (
    ALFWORLD_CATEGORIES, mean_curve, mean_std, plot_curves, results_table, summarize_results,
)
from trainer_client.evaluate import EvalJob, job_settings, subset
from trainer_client.local_server import EnvTarget
from trainer_client.prompting_baselines import PROMPTING_STYLES, prompt_config, worked_example
from trainer_client.prompts import PromptConfig, build_prompt, parse_action
from trainer_client.train_config import TrainConfig


def result(won: dict[str, tuple[int, int]], score: float | None = None) -> dict:
    """An EvalResult.as_dict()-shaped result from {category: (won, episodes)}."""
    total_won, total = sum(w for w, _ in won.values()), sum(n for _, n in won.values())
    return {"success": total_won / total, "score": 100.0 * total_won / total if score is None else score,
            "by_category": {k: {"episodes": n, "won": w, "success": w / n if n else math.nan}
                            for k, (w, n) in won.items()}}


def results_file(label: str, env: str, runs: list[dict], split: str = "valid_seen") -> dict:
    return {"label": label, "env": env, "split": split, "split_tasks": 140, "tasks_played": 140,
            "temperature": TrainConfig.eval_temperature, "runs": runs}


def test_mean_std_is_the_sample_std():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert mean_std([5.0]) == (5.0, None)
    with pytest.raises(ValueError):
        mean_std([])


def test_summarize_results_in_percent_over_seeds():
    runs = [result({"pick": (1, 2), "look": (0, 2)}), result({"pick": (2, 2), "look": (1, 2)})]
    summary = summarize_results(runs)
    # 25% and 75%: mean 50, sample std sqrt(25² + 25²) = 35.36
    assert summary["success"] == {"mean": 50.0, "std": pytest.approx(25 * math.sqrt(2)), "n": 2}
    assert summary["success/pick"]["mean"] == 75.0 and summary["success/look"]["mean"] == 25.0


def test_a_category_with_no_episodes_is_left_out_not_counted_as_zero():
    summary = summarize_results([result({"pick": (1, 1), "heat": (0, 0)})])
    assert "success/heat" not in summary and summary["success/pick"]["mean"] == 100.0


def test_results_table_has_the_anchor_columns_and_one_row_per_label():
    files = [
        results_file("grpo", "alfworld", [result({c: (1, 2) for c in ALFWORLD_CATEGORIES})]),
        results_file("grpo", "alfworld", [result({c: (2, 2) for c in ALFWORLD_CATEGORIES})]),
        results_file("grpo", "webshop", [result({"all": (1, 4)}, score=60.0)], split="test"),
        results_file("boundary", "alfworld", [result({"pick": (3, 4)})]),
    ]
    lines = results_table(files).splitlines()
    assert lines[0] == "| Method | Pick | Look | Clean | Heat | Cool | Pick2 | All | WS Score | WS Succ |"
    grpo = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert grpo[0] == "grpo" and grpo[1:8] == ["75.0 ± 35.4"] * 7  # (50, 100): mean 75, sample std 35.36
    assert grpo[8:] == ["60.0", "25.0"]
    boundary = [c.strip() for c in lines[3].split("|")[1:-1]]
    assert boundary[1] == "75.0" and boundary[2] == "–" and boundary[7] == "75.0" and boundary[8] == "–"
    assert "valid_seen (140 of 140 tasks)" in lines[-1]


def test_other_envs_get_their_own_categories_as_columns():
    table = results_table([results_file("x", "toy", [result({"goto": (1, 1), "fetch": (0, 1)})], split="test")])
    assert table.splitlines()[0] == "| Method | toy fetch | toy goto | toy All |"


def test_mean_curve_over_runs_of_different_lengths():
    runs = [[{"iteration": 0, "s": 0.0}, {"iteration": 1, "s": 1.0}],
            [{"iteration": 0, "s": 1.0}, {"iteration": 1, "s": float("nan")}, {"iteration": 2, "s": 0.5}]]
    iterations, mean, std = mean_curve(runs, "s")
    assert iterations == [0, 1, 2] and mean == [0.5, 1.0, 0.5]
    assert std == [pytest.approx(math.sqrt(0.5)), 0.0, 0.0]


def test_plot_curves_writes_a_png(tmp_path):
    runs = {"boundary": [[{"iteration": i, "rollout/success": i / 10, "eval/success": 0.1} for i in range(5)]]}
    out = plot_curves(runs, tmp_path / "curves.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_subset_is_fixed_and_spread():
    ids = [f"{c}-{i:03d}" for c in ("a", "b", "c") for i in range(20)]
    chosen = subset(ids, 9)
    assert chosen == subset(list(reversed(ids)), 9) and len(set(chosen)) == 9
    assert len({i[0] for i in chosen}) > 1  # not the first category only, as a prefix would be
    assert subset(ids, 0) == sorted(ids) == subset(ids, 100)


def test_job_settings_take_the_runs_prompt_and_the_eval_temperature(tmp_path):
    checkpoint = tmp_path / "run" / "checkpoints" / "iter_000009" / "policy"
    checkpoint.mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump({
        "algo": "gigpo", "prompt": {"history_obs_max_words": 12}, "rollout": {"max_new_tokens": 48, "max_turns": 5}}))
    assert find_run_config(checkpoint) == tmp_path / "run" / "config.yaml"
    label, prompts, rollout = job_settings(EvalJob(checkpoint=str(checkpoint), env=EnvTarget("toy")))
    assert label == "gigpo" and prompts.history_obs_max_words == 12 and prompts.example == ""
    assert rollout.temperature == TrainConfig.eval_temperature and rollout.max_new_tokens == 48
    assert rollout.max_turns == 0  # the env's own limit, as the anchor evaluates, unless asked
    label, prompts, rollout = job_settings(EvalJob(checkpoint=str(checkpoint), env=EnvTarget("toy"), prompting="react",
                                                   max_turns=3))
    assert label == "policy (react)" and prompts.example == worked_example("toy") and rollout.max_turns == 3


def test_eval_job_rejects_bad_options():
    with pytest.raises(ValueError, match="prompting must be one of"):
        EvalJob(checkpoint="x", prompting="reflexion")
    with pytest.raises(ValueError, match="at least one seed"):
        EvalJob(checkpoint="x", seeds=())


@pytest.mark.parametrize("env", ["alfworld", "webshop", "toy"])
def test_react_examples_use_the_training_reply_format(env):
    example = worked_example(env)
    replies = [line.removeprefix("Reply: ") for line in example.splitlines() if line.startswith("Reply: ")]
    assert len(replies) >= 3
    assert all(parse_action(reply).valid for reply in replies)
    prompt = build_prompt(env, "do the thing", "here", ["look"], [], 0, prompt_config("react", env))
    assert prompt.index(example) < prompt.index("Your task is to: do the thing.")


def test_zero_shot_is_the_training_prompt():
    base = PromptConfig(history_turns=3)
    assert prompt_config("zero-shot", "alfworld", base) == base
    assert set(PROMPTING_STYLES) == {"zero-shot", "react"}
    with pytest.raises(ValueError, match="unknown prompting style"):
        prompt_config("cot", "alfworld")
    with pytest.raises(ValueError, match="no ReAct-style example"):
        worked_example("sokoban")
