"""RESULTS.md of the learning study, rendered from summary.json and the results files (never typed in)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from study_config import ABLATIONS, StudyConfig
from study_files import export_measurements
from study_curves import plot_gains, plot_held_out_curves
from study_stats import StudyResults, read_results, study_summary
from study_tuning import read_tuning

from trainer_client.eval_report import mean_std, plot_curves, results_table
from trainer_client.timing import ITERATION_STAGES

SFT_LABEL = "SFT (start)"
CURVES_PNG = "results_learning_curves.png"
HELD_OUT_PNG = "results_held_out_curves.png"
GAINS_PNG = "results_gains.png"
INTERPRETATION_MD = "RESULTS_interpretation.md"
TRAINING_SMOOTHING = 8
INTERPRETATION_TITLE = "# Learning study: interpretation"


def points(fraction: float | None, sign: bool = False) -> str:
    if fraction is None:
        return "–"
    return f"{100 * fraction:+.1f}" if sign else f"{100 * fraction:.1f}"


def interval_text(gain: Mapping | None) -> str:
    """A paired gain ({"gain", "ci95"}) as '+3.2 [-0.4, +6.8]', in points."""
    if not gain or gain.get("ci95") is None:
        return "–"
    low, high = gain["ci95"]
    return f"{points(gain['gain'], True)} [{points(low, True)}, {points(high, True)}]"


def seed_interval_text(gain: Mapping | None) -> str:
    """The seed-aware interval and each training seed's gain, in points."""
    if not gain or not gain.get("seed_ci95"):
        return "–"
    per_seed = ", ".join(f"{seed}: {points(value, True)}" for seed, value in gain["per_seed"].items())
    return f"{interval_text({'gain': gain['gain'], 'ci95': gain['seed_ci95']})} (per seed {per_seed})"


def verdict(a: str, b: str, gain: Mapping | None) -> str:
    """Which side the paired 95 % interval puts ahead, if any: the seed-aware one where there is one (training
    seeds resampled, then games), else the one over games."""
    if not gain:
        return f"{a} vs {b}: not measured"
    seed_aware = bool(gain.get("seed_ci95"))
    low, high = gain["seed_ci95"] if seed_aware else gain["ci95"]
    if low > 0:
        head = f"**{a} beats {b}**"
    elif high < 0:
        head = f"**{b} beats {a}**"
    else:
        head = f"**no difference resolved** between {a} and {b} (the interval holds 0)"
    if seed_aware:
        return (f"{head}: {seed_interval_text(gain)} points with the training seeds resampled; over games alone "
                f"{interval_text(gain)}, paired on {gain['episodes']} episodes ({gain['games']} games)")
    return f"{head}: {interval_text(gain)} points, paired on {gain['episodes']} episodes ({gain['games']} games)"


def answer_lines(summary: Mapping) -> list[str]:
    """The plain answers, computed from summary.json: boundary against each baseline, which ablation carries a
    difference, the time it costs, and where boundary is not ahead."""
    comparisons, arms = summary["comparisons"], summary["arms"]
    if "boundary" not in arms:
        return ["No boundary run has finished yet."]
    lines = []
    for gain in comparisons.values():
        if gain["a"] == "boundary":
            lines.append(f"Boundary against {gain['b']}: " + verdict("boundary", gain["b"], gain) + ".")
    for (a, b), why in ABLATIONS.items():
        gain = comparisons.get(f"{a} vs {b}")
        if gain:
            lines.append(f"{why[0].upper()}{why[1:]} ({a} vs {b}): " + verdict(a, b, gain) + ".")
    readout, credit = comparisons.get("boundary vs ppo_critic_turn"), comparisons.get("ppo_critic_turn vs ppo_critic_verl")
    if readout and credit:
        resolved = [name for name, gain in (("the shared readout", readout), ("turn-level credit", credit))
                    if gain["ci95"][0] > 0 or gain["ci95"][1] < 0]
        lines.append("What carries the difference: " + (" and ".join(resolved) if resolved else
                     "neither ablation resolves a difference at this size") + ".")
    base = arms["boundary"].get("seconds_per_iteration")
    ratios = {arm: arms[arm]["time_vs_boundary"] for arm in arms if (arms[arm].get("time_vs_boundary") or {}).get("ratio")}
    costs = [f"{arm} {r['ratio']:.2f}x" for arm, r in ratios.items()]
    if costs and base:
        unscaled = sorted({seed for r in ratios.values() for seed in r["by_seed"] if seed not in r["normalized_seeds"]})
        scale = (" Seed by seed, each on its machine's reference step (benchlib.reference_step_seconds)." if not unscaled
                 else f" Seed by seed; seed{'s' * (len(unscaled) > 1)} {', '.join(map(str, unscaled))} recorded no machine "
                      "reference for some arm, so those ratios are raw and mix machines where an arm ran in another session.")
        lines.append(f"Cost in time: boundary's iteration took {base:.1f} s; each baseline's, relative to it: "
                     + ", ".join(costs) + "." + scale)
    behind = []
    for gain in comparisons.values():
        if gain["a"] != "boundary":
            continue
        where = [category for category, by in gain["by_category"].items() if by and by["ci95"][0] <= 0]
        if where:
            behind.append(f"against {gain['b']} in {', '.join(where)}")
    if behind:
        lines.append("Where boundary is not resolved ahead (per task category, paired interval holds 0 or lies "
                     "below): " + "; ".join(behind) + ".")
    return lines


def gains_table(split_summary_: Mapping) -> str:
    """Per arm: held-out success, its SFT start, the paired gain with its interval, time."""
    lines = [("| Method | seeds | held-out % (mean ± std over seeds) | SFT start % | paired gain over SFT, points [95 % CI] "
             "| s / iteration | RL min / run | eval min / run |"), "|---|---|---|---|---|---|---|---|"]
    for arm, s in split_summary_["arms"].items():
        held = points(s["held_out_mean"]) + (f" ± {points(s['held_out_std'])}" if s["held_out_std"] is not None else "")
        per_iteration = f"{s['seconds_per_iteration']:.2f}" if s["seconds_per_iteration"] else "–"
        wall = s["wall_seconds"]
        lines.append(f"| {arm} | {len(s['seeds'])} | {held} | {points(s['sft_mean'])} | "
                     f"{interval_text({'gain': s['gain'], 'ci95': s['gain_ci95']})} | "
                     f"{per_iteration} | {wall.get('train', 0) / 60:.1f} | {wall.get('eval', 0) / 60:.1f} |")
    return "\n".join(lines)


def score_lines(split_summary_: Mapping) -> list[str]:
    """The score beside success (StudyConfig.score), in points of the full score (100): per arm its mean and paired
    gain over the SFT start, then boundary's verdict against each baseline (summary.json holds every comparison)."""
    score = split_summary_["score"]
    lines = ["| Method | seeds | score (mean over seeds) | SFT start | paired gain over SFT [95 % CI], seeds resampled "
             "| seeds fixed |", "|---|---|---|---|---|---|"]
    for arm, s in score["arms"].items():
        lines.append(f"| {arm} | {len(s['seeds'])} | {points(s['mean'])} | {points(s['sft_mean'])} | "
                     f"{seed_interval_text(s['gain'])} | {interval_text(s['gain'])} |")
    lines += [""] + [f"- Score, boundary against {gain['b']}: " + verdict("boundary", gain["b"], gain) + "."
                     for gain in score["comparisons"].values() if gain["a"] == "boundary"]
    return lines


def comparisons_table(split_summary_: Mapping) -> str:
    """Each paired comparison, overall and per task category."""
    comparisons = split_summary_["comparisons"]
    categories = sorted({c for gain in comparisons.values() for c in gain["by_category"]})
    lines = ["| a vs b | all games, seeds resampled | all games, seeds fixed | " + " | ".join(categories) + " |",
             "|---|---|---|" + "---|" * len(categories)]
    for key, gain in comparisons.items():
        lines.append(f"| {key} | {seed_interval_text(gain)} | {interval_text(gain)} | "
                     + " | ".join(interval_text(gain["by_category"].get(c)) for c in categories) + " |")
    return "\n".join(lines)


def equal_time_table(split_summary_: Mapping) -> str:
    """Each arm where it stood when boundary had trained as long as its whole run, against boundary's end."""
    rows = split_summary_.get("equal_time") or {}
    if not rows:
        return "Not measured: no run with a held-out curve has finished beside a boundary run of its seed."
    lines = ["| arm | its success % at boundary's time | boundary's % | boundary's lead, seeds resampled | seeds fixed "
             "| iteration reached per seed (of boundary's minutes) |", "|---|---|---|---|---|---|"]
    for arm, e in rows.items():
        reached = ", ".join(f"{seed}: {p['iteration']} ({p['boundary_seconds'] / 60:.1f} min)"
                            for seed, p in e["per_seed"].items())
        lead = {"gain": e["boundary_lead"], "seed_ci95": e["seed_ci95"],
                "per_seed": {seed: p["boundary_lead"] for seed, p in e["per_seed"].items()}}
        lines.append(f"| {arm} | {points(e['success'])} | {points(e['boundary_success'])} | {seed_interval_text(lead)} "
                     f"| {interval_text({'gain': e['boundary_lead'], 'ci95': e['ci95']})} | {reached} |")
    return "\n".join(lines)


def tuning_table(tuning: Mapping) -> str:
    """Every tuning run's validation success, per arm, the chosen one in bold."""
    lines = [f"Validation split `{tuning['split']}` ({tuning['games']} games x eval seeds {tuning['eval_seeds']}), "
             f"training seed {tuning['seed']}, {tuning['iterations']} iterations per run, {tuning['runs_per_arm']} runs "
             f"per arm. SFT start on it: {points(tuning.get('sft_success'))} %. {tuning['rooms']['said']}", "",
             "| arm | setting | validation success % | RL min |", "|---|---|---|---|"]
    for arm, runs in tuning["runs"].items():
        for run in runs:
            chosen = run["overrides"] == tuning["chosen"].get(arm)
            setting = " ".join(run["overrides"])
            cell = f"**{points(run['success'])}** (chosen)" if chosen else points(run["success"])
            lines.append(f"| {arm} | `{setting}` | {cell} | {run['seconds']['train'] / 60:.1f} |")
    return "\n".join(lines)


def iteration_seconds(results: StudyResults, stage: str = "iteration") -> dict[str, list[float]]:
    # A stage added after a run was timed (trunk) is absent from its results: left out, not counted as 0.
    return {arm: [r["time_per_iteration"][stage] for r in by_seed.values()
                  if r["time_per_iteration"] and stage in r["time_per_iteration"]]
            for arm, by_seed in results.runs.items()}


def mean_std_text(values: Sequence[float], digits: int = 1) -> str:
    if not values:
        return "–"
    mean, std = mean_std(values)
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def time_table(results: StudyResults) -> str:
    stages = (*ITERATION_STAGES, "iteration")
    lines = ["| Method | " + " | ".join(stages) + " |", "|---|" + "---|" * len(stages)]
    for arm in results.runs:
        cells = [mean_std_text(iteration_seconds(results, stage)[arm], 3) for stage in stages]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def stage_table(results: StudyResults) -> str:
    """Wall time of every stage of the study, minutes, mean ± std over seeds."""
    lines = ["| Stage | minutes per seed | seeds |", "|---|---|---|"]
    sft_parts = list(dict.fromkeys(part for s in results.sft.values() for part in s["seconds"]))   # in stage order
    for part in sft_parts:
        values = [s["seconds"][part] / 60 for s in results.sft.values() if part in s["seconds"]]
        lines.append(f"| SFT start: {part} | {mean_std_text(values)} | {len(values)} |")
    for arm, by_seed in results.runs.items():
        for part in ("train", "eval"):
            values = [r["seconds"][part] / 60 for r in by_seed.values()]
            lines.append(f"| {arm}: {'RL' if part == 'train' else 'evaluation'} | {mean_std_text(values)} | {len(values)} |")
    return "\n".join(lines)


def table_files(results: StudyResults, split: str) -> list[dict]:
    """The held-out results in the shape `eval_report.results_table` pools (one file per label; a file's runs are
    every (training seed, eval seed) evaluation of that label)."""
    def file(label: str, evaluations: list[dict]) -> dict:
        first = evaluations[0] if evaluations else {}
        return {"label": label, "env": first.get("env"), "split": split, "temperature": results.cfg.rl.eval_temperature,
                "runs": [run for e in evaluations for run in e["runs"]], "tasks_played": first.get("tasks_played"),
                "split_tasks": first.get("split_tasks")}

    files = [file(SFT_LABEL, [s["evaluations"][split] for s in results.sft.values() if split in s["evaluations"]])]
    files += [file(arm, [r["evaluations"][split] for r in by_seed.values() if split in r["evaluations"]])
              for arm, by_seed in results.runs.items()]
    return [f for f in files if f["runs"]]


def runs_table(results: StudyResults, splits: Sequence[str]) -> str:
    """Every run's own numbers, one row per (label, seed): what the tables above are computed from."""
    lines = ["| Method | seed | " + " | ".join(f"{s} success % (per eval seed)" for s in splits)
             + " | s / iteration | results file |", "|---|---|" + "---|" * (len(splits) + 2)]

    def cells(evaluations: Mapping) -> str:
        return " | ".join(" / ".join(points(run["success"]) for run in evaluations[s]["runs"])
                          if s in evaluations else "–" for s in splits)

    for seed, s in sorted(results.sft.items()):
        lines.append(f"| {SFT_LABEL} | {seed} | {cells(s['evaluations'])} | – | seed_{seed}/sft.json |")
    for arm, by_seed in results.runs.items():
        for seed, r in sorted(by_seed.items()):
            per_iteration = f"{r['time_per_iteration']['iteration']:.3f}" if r["time_per_iteration"] else "–"
            lines.append(f"| {arm} | {seed} | {cells(r['evaluations'])} | {per_iteration} | seed_{seed}/{arm}/results.json |")
    return "\n".join(lines)


def setting_lines(results: StudyResults) -> list[str]:
    cfg, rl = results.cfg, results.cfg.rl
    lines = [f"- Env: **{cfg.env}**, server flags `{shlex.join(cfg.server_args) or '(none)'}`; training split "
             f"`{cfg.train_split}`; held-out: "
             + ", ".join(f"`{split}` ({cfg.eval_episodes.get(split) or 'all'} games)" for split in cfg.eval_splits)
             + f", the same games for every checkpoint, each played once per eval seed ({', '.join(map(str, cfg.eval_seeds))}) "
             f"at T = {rl.eval_temperature}.",
             (f"- Seeds: {', '.join(map(str, cfg.seeds))}. Each seed builds its own tokenizer and tiny model "
             f"(`{cfg.model_size}`) and one SFT checkpoint that every algorithm of the seed starts from.")]
    if results.sft:
        first = next(iter(results.sft.values()))
        lines.append(f"- Model: {first['parameters'] / 1e6:.2f}M parameters, vocabulary {first['vocabulary']}. SFT: "
                     f"{cfg.sft.episodes} expert episodes, {cfg.sft.epochs:g} epoch(s) at lr {cfg.sft.lr:g}"
                     f"{' decaying' if cfg.sft.lr_decay else ''} in batches of {cfg.sft.batch_turns} turns, prompt-loss "
                     f"weight {cfg.sft.prompt_loss_weight:g} (final loss "
                     + ", ".join(f"{s['loss_last']:.3f}" for s in results.sft.values()) + " per seed).")
    lines.append(f"- RL, equal for every algorithm: {rl.iterations} iterations x {rl.episodes_per_iteration} episodes "
                 f"(boundary and PPO: N tasks x 1; group methods: N/8 tasks x 8), actor lr {rl.optim.lr:g}, value-row "
                 f"lr {rl.optim.value_lr:g}, critic lr {rl.optim.critic_lr:g}, KL coef {rl.loss.kl_coef:g}, at most "
                 f"{rl.rollout.max_turns or 'the env default'} turns and {rl.rollout.max_new_tokens} new tokens per turn, "
                 f"T = {rl.rollout.temperature:g}.")
    lines.append("- Arms: " + "; ".join(f"**{arm}** `{' '.join(overrides)}`" for arm, overrides in cfg.arms.items()) + ".")
    return lines


def render_results(results: StudyResults, summary: Mapping, command: str, interpretation: str | None) -> str:
    cfg = results.cfg
    primary = cfg.eval_splits[0]
    expected = {(arm, seed) for arm in cfg.arms for seed in cfg.seeds}
    missing = sorted(expected - {(arm, seed) for arm, by_seed in results.runs.items() for seed in by_seed})
    seconds = sum(sum(s["seconds"].values()) for s in results.sft.values()) + \
        sum(sum(r["seconds"].values()) for by_seed in results.runs.values() for r in by_seed.values())
    out = ["# Learning study: results", "",
           (f"Generated by `{command}` from the results files under `{cfg.out_dir}` (copies and `summary.json` in "
           f"`{cfg.measurements_dir}`); do not edit by hand. Measured on this CPU (see BENCHMARKS.md for the "
           f"machine). Wall time of the runs reported here: {seconds / 3600:.2f} h."), ""]
    if len(cfg.seeds) < 3:
        out += [f"> **Preliminary**: {len(cfg.seeds)} seed(s); the study calls for at least 3.", ""]
    if missing:
        out += ["> **Incomplete**: not finished yet: " + ", ".join(f"{arm} seed {seed}" for arm, seed in missing), ""]
    out += ["## Setting", "", *setting_lines(results), "",
            f"## The answer, on `{primary}`", "",
            "Every comparison is paired: the same games, eval seeds and training seeds (each arm starts from its "
            "seed's SFT checkpoint). Intervals are 95 % bootstrap intervals: " + summary["pooling"], ""]
    out += [f"- {line}" for line in answer_lines(summary)]
    drawn = any(c.get("seed_ci95") for c in summary["comparisons"].values())
    out += ["", f"![paired gains]({GAINS_PNG})" if drawn else "", "",
            f"## Held-out success as the runs learned, `{primary}`", ""]
    curve = next((r["curve"] for by_seed in results.runs.values() for r in by_seed.values() if "curve" in r), None)
    out += ([f"![held-out curves]({HELD_OUT_PNG})", "",
             (f"Every saved checkpoint on the same {curve['games']} games of `{primary}` (eval seed {curve['eval_seed']}, "
              f"T = {cfg.rl.eval_temperature}), against iterations and against the run's own training minutes; mean over "
              "training seeds, the band from the lowest to the highest seed.")] if curve
            else ["Not measured: no run with a held-out curve has finished."])
    out += ["", "## Equal wall time", "",
            ("Where each arm stood once it had trained as long as boundary's whole run (its last checkpoint within "
             "boundary's training minutes, seed by seed; an arm faster than boundary stops at its last iteration), "
             "against boundary's end, on the curve's games:"), "", equal_time_table(summary), ""]
    tuning = read_tuning(cfg)
    out += ["## Tuning", "", tuning_table(tuning) if tuning else
            "Not run: every arm used the study's shared settings (its `arm_overrides`, if any, are listed above)."]
    for split_summary_ in [summary, *summary["other_splits"].values()]:
        split = split_summary_["split"]
        out += ["", f"## Gain over the SFT start and between arms, `{split}` ({split_summary_['games']} games)", ""]
        if not split_summary_["arms"]:
            out += ["Not evaluated (the env server does not serve this split), or no run has finished."]
            continue
        out += [gains_table(split_summary_), "", ("Paired differences in points, a minus b [95 % CI], on all games "
                "and per task category:"), "", comparisons_table(split_summary_)]
        if "score" in split_summary_:
            out += ["", f"Score (mean reward x 100) on `{split}`, paired the same way:", "", *score_lines(split_summary_)]
    for split in cfg.eval_splits:
        files = table_files(results, split)
        out += ["", f"## Held-out success per category on `{split}`", ""]
        out += [results_table(files)] if files else ["Not evaluated: the env server does not serve this split."]
    out += ["", "## Training-rollout success (secondary)", "", f"![training curves]({CURVES_PNG})", "",
            ("Success of the training rollouts (T = 1.0, fresh games each iteration), moving mean over "
             f"{TRAINING_SMOOTHING} iterations, mean ± std over seeds: noisy by construction; the held-out curves "
             "above are what to read."), "",
            "## Time per iteration and its parts", "",
            "Seconds, mean ± std over seeds of each run's mean iteration (stage names as in verl's timing_raw).", "",
            time_table(results), "",
            "## Wall time per stage", "", stage_table(results), "",
            "## Interpretation (the lead's)", ""]
    # The notes' own title line stands alone in docs/; inside RESULTS.md the section heading above replaces it.
    out += [interpretation.strip().removeprefix(INTERPRETATION_TITLE).strip()] if interpretation else [
        f"> _Not written yet: put it in `{cfg.report_dir}/{INTERPRETATION_MD}`; the next report includes it here._"]
    out += ["", "## Every run", "", runs_table(results, cfg.eval_splits), ""]
    return "\n".join(out)


def write_report(cfg: StudyConfig, command: str) -> list[Path]:
    """RESULTS.md, its PNG, summary.json and the measurement copies; returns the paths written."""
    results = read_results(cfg)
    report_dir = Path(cfg.report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if results.curves:
        written.append(plot_curves(results.curves, report_dir / CURVES_PNG, smooth=TRAINING_SMOOTHING))
    summary = study_summary(results, command)
    written += [p for p in (plot_held_out_curves(results.runs, report_dir / HELD_OUT_PNG),
                            plot_gains(summary["comparisons"], report_dir / GAINS_PNG)) if p]
    measurements = export_measurements(cfg) if (Path(cfg.out_dir) / "study.yaml").is_file() else Path(cfg.measurements_dir)
    measurements.mkdir(parents=True, exist_ok=True)
    (measurements / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    notes = report_dir / INTERPRETATION_MD
    path = report_dir / "RESULTS.md"
    path.write_text(render_results(results, summary, command, notes.read_text() if notes.is_file() else None))
    return [path, *written, measurements]
