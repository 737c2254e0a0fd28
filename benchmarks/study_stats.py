"""The learning study's numbers (summary.json), pure functions of its results files: held-out success per arm
over seeds, the paired gains with their bootstrap intervals, and the time per iteration relative to boundary's."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from study_config import ABLATIONS, CORE_ARMS, StudyConfig, seed_dir
from study_curves import equal_time

from trainer_client.eval_report import mean_std, read_run
from trainer_client.paired import compare as paired_compare
from trainer_client.paired import game_means, outcome_values, paired_gain, seed_game_gain


def reference_step(run: Mapping) -> float | None:
    """The machine's reference step an arm recorded (None for arms run before it was recorded)."""
    return (run.get("machine") or {}).get("reference_step_s")


def time_ratio(run: Mapping, base: Mapping) -> float | None:
    """Seconds per iteration of `run` over those of `base` (one seed), each divided by its machine's reference
    step where both recorded one; None where either has no timing."""
    times = [r.get("time_per_iteration", {}) or {} for r in (run, base)]
    if not all(t.get("iteration") for t in times):
        return None
    refs = [reference_step(r) for r in (run, base)]
    scale = refs[1] / refs[0] if all(refs) else 1.0
    return times[0]["iteration"] / times[1]["iteration"] * scale



@dataclass(frozen=True)
class StudyResults:
    """Everything RESULTS.md and summary.json say, as read from the results files."""

    cfg: StudyConfig
    sft: dict[int, dict]                     # seed -> sft.json
    runs: dict[str, dict[int, dict]]         # arm -> seed -> results.json
    curves: dict[str, list[list[dict]]]      # arm -> one metrics.jsonl per seed


def read_results(cfg: StudyConfig) -> StudyResults:
    sft, runs, curves = {}, {}, {}
    for seed in cfg.seeds:
        path = seed_dir(cfg, seed) / "sft.json"
        if path.is_file():
            sft[seed] = json.loads(path.read_text())
        for arm, overrides in cfg.arms.items():
            run_dir = seed_dir(cfg, seed) / arm
            if (run_dir / "results.json").is_file():
                result = json.loads((run_dir / "results.json").read_text())
                if result.get("overrides", list(overrides)) != list(overrides):
                    continue   # made with the arm's earlier settings: rerun by the study, never mixed in
                runs.setdefault(arm, {})[seed] = result
                curves.setdefault(arm, []).append(read_run(str(run_dir))[1])
    return StudyResults(cfg, sft, runs, curves)


def finished_seeds(results: StudyResults) -> list[int]:
    """Seeds whose SFT start and every core arm have finished. The extended arms, added to a finished study
    later, do not take a seed back out; each arm's summary lists the seeds it has."""
    return [seed for seed in results.cfg.seeds
            if seed in results.sft and all(seed in results.runs.get(arm, {}) for arm in CORE_ARMS)]


def seed_success(evaluation: Mapping) -> float:
    """One checkpoint's held-out success on a split: the mean over its eval seeds (each over the same games)."""
    return statistics.fmean(run["success"] for run in evaluation["runs"])


def game_outcomes(by_seed: Mapping[int, Mapping], split: str, category: str | None = None,
                  metric: str = "won") -> dict[tuple, float]:
    """{(task id, (training seed, eval seed)): 1.0 won, 0.0 lost (or its score)}: every episode one label played on
    `split` (of one task category, or all). Dropped episodes are absent, so a pairing leaves them out on both sides.
    The training seed joins the eval seed in the key's second place, so trainer_client.paired averages a
    game over both."""
    outcomes = {}
    for seed, result in by_seed.items():
        if split not in result["evaluations"]:
            continue
        runs = [{"outcomes": [o for o in run["outcomes"] if category is None or o["category"] == category]}
                for run in result["evaluations"][split]["runs"]]
        outcomes |= {(task_id, (seed, eval_seed)): value
                     for (task_id, eval_seed), value in outcome_values(runs, metric).items()}
    return outcomes


def paired(a: Mapping[int, Mapping], b: Mapping[int, Mapping], split: str, category: str | None = None,
           metric: str = "won") -> dict | None:
    """Success (or score) of `a` minus `b` on the episodes both played (same training seed, eval seed and game),
    with two 95 % intervals; None when they share no episode.

    Pooling: a game's gain is its mean over every (training seed, eval seed) pair both played; the interval
    is a bootstrap over games (trainer_client.paired.paired_gain), the unit that was sampled. The training
    seeds are held fixed, so the interval covers game and sampling noise given these seeds' SFT starts; the
    seed-aware interval beside it (seed_ci95, trainer_client.paired.seed_game_gain) resamples the training
    seeds, then the games within each, and is the one the verdicts follow; per_seed gives each seed's gain."""
    seeds = a.keys() & b.keys()
    a_games = game_outcomes({s: a[s] for s in seeds}, split, category, metric)
    b_games = game_outcomes({s: b[s] for s in seeds}, split, category, metric)
    if not a_games.keys() & b_games.keys():
        return None
    gain = paired_compare(before=b_games, after=a_games)
    by_seed = {side: per_seed_games(games) for side, games in (("a", a_games), ("b", b_games))}
    common = {s: by_seed["a"][s].keys() & by_seed["b"][s].keys() for s in by_seed["a"].keys() & by_seed["b"].keys()}
    games = set.intersection(*map(set, common.values())) if common else set()
    seed_level = {}
    if games:
        before = {s: {g: by_seed["b"][s][g] for g in games} for s in common}
        after = {s: {g: by_seed["a"][s][g] for g in games} for s in common}
        _, low, high = seed_game_gain(before, after)
        seed_level = {"seed_ci95": [low, high],
                      "per_seed": {s: statistics.fmean(after[s][g] - before[s][g] for g in games) for s in sorted(common)}}
    return {"gain": gain.gain, "ci95": [gain.lo, gain.hi], "games": gain.games, "episodes": gain.episodes,
            "seeds": sorted(seeds), **seed_level}


def per_seed_games(outcomes: Mapping[tuple, float]) -> dict[int, dict[str, float]]:
    """{training seed: {game: mean over its eval seeds}} from game_outcomes' keys (task id, (seed, eval seed))."""
    by_seed: dict[int, dict] = {}
    for (task_id, (seed, eval_seed)), value in outcomes.items():
        by_seed.setdefault(seed, {})[(task_id, eval_seed)] = value
    return {seed: game_means(values) for seed, values in by_seed.items()}


def equal_time_summary(runs: Mapping[str, Mapping[int, Mapping]]) -> dict[str, dict]:
    """Each arm where it stood when boundary finished its run (study_curves.equal_time), on the curve's games:
    its success and boundary's, boundary's lead with both intervals, and the iteration each seed had reached."""
    out = {}
    for arm, per_seed in equal_time(runs).items():
        before = {s: p["arm"] for s, p in per_seed.items()}
        after = {s: p["base"] for s, p in per_seed.items()}
        games = set.intersection(*(set(before[s]) & set(after[s]) for s in per_seed))
        before = {s: {g: v for g, v in values.items() if g in games} for s, values in before.items()}
        after = {s: {g: v for g, v in values.items() if g in games} for s, values in after.items()}
        gain, low, high = seed_game_gain(before, after)
        pooled = paired_gain({g: statistics.fmean(before[s][g] for s in per_seed) for g in games},
                             {g: statistics.fmean(after[s][g] for s in per_seed) for g in games})
        out[arm] = {"boundary_lead": gain, "seed_ci95": [low, high], "ci95": [pooled[1], pooled[2]],
                    "games": len(games), "seeds": sorted(per_seed),
                    "success": statistics.fmean(v for s in per_seed for v in before[s].values()),
                    "boundary_success": statistics.fmean(v for s in per_seed for v in after[s].values()),
                    "per_seed": {s: {"iteration": p["iteration"], "seconds": p["seconds"],
                                     "boundary_seconds": p["base_seconds"],
                                     "boundary_lead": statistics.fmean(after[s][g] - before[s][g] for g in games)}
                                 for s, p in per_seed.items()}}
    return out


def mean_or_none(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def arm_summary(runs: Mapping[int, Mapping], sft: Mapping[int, Mapping], split: str) -> dict | None:
    """One arm on one split, over the training seeds where both it and its SFT start were evaluated there."""
    seeds = sorted(s for s in runs.keys() & sft.keys()
                   if split in runs[s]["evaluations"] and split in sft[s]["evaluations"])
    if not seeds:
        return None
    held_out = [seed_success(runs[s]["evaluations"][split]) for s in seeds]
    mean, std = mean_std(held_out)
    timed = [runs[s]["time_per_iteration"] for s in seeds if runs[s].get("time_per_iteration")]
    gain = paired({s: runs[s] for s in seeds}, {s: sft[s] for s in seeds}, split)
    return {"seeds": seeds, "held_out_mean": mean, "held_out_std": std, "held_out_by_seed": held_out,
            "sft_mean": statistics.fmean(seed_success(sft[s]["evaluations"][split]) for s in seeds),
            "gain": gain["gain"] if gain else None, "gain_ci95": gain["ci95"] if gain else None,
            "episode_pairs": gain["episodes"] if gain else 0,
            "seconds_per_iteration": mean_or_none([t["iteration"] for t in timed]),
            "seconds_per_stage": {stage: statistics.fmean(t[stage] for t in timed) for stage in timed[0]} if timed else {},
            "wall_seconds": {part: statistics.fmean(runs[s]["seconds"][part] for s in seeds) for part in runs[seeds[0]]["seconds"]}}


def comparisons_of(arms: Iterable[str]) -> list[tuple[str, str, str]]:
    """(a, b, what a - b measures): boundary against each baseline, then the ablations not among those."""
    arms = list(arms)
    pairs = [("boundary", rival) for rival in arms if rival != "boundary"]
    pairs += [pair for pair in ABLATIONS if pair not in pairs]
    return [(a, b, ABLATIONS.get((a, b), "the method against a baseline")) for a, b in pairs if a in arms and b in arms]


def split_summary(results: StudyResults, split: str) -> dict:
    """summary.json's numbers for one held-out split."""
    sft = {s: r for s, r in results.sft.items() if split in r["evaluations"]}
    arms = {arm: summary for arm, by_seed in results.runs.items()
            if (summary := arm_summary(by_seed, sft, split)) is not None}
    starts = [seed_success(r["evaluations"][split]) for r in sft.values()]
    games = {r["evaluations"][split]["tasks_played"] for r in sft.values()}
    comparisons, categories = {}, sorted(categories_of(results, split))
    for a, b, why in comparisons_of(arms):
        gain = paired(results.runs[a], results.runs[b], split)
        if gain:
            by_category = {category: paired(results.runs[a], results.runs[b], split, category)
                           for category in categories}
            comparisons[f"{a} vs {b}"] = gain | {"a": a, "b": b, "measures": why, "by_category": by_category}
    for arm, summary in arms.items():
        if arm != "boundary" and "boundary" in arms:
            summary["time_vs_boundary"] = time_vs(results.runs[arm], results.runs["boundary"])
    primary = split == results.cfg.eval_splits[0]
    score = {"score": score_summary(results, split, sft, arms)} if results.cfg.score else {}
    return {"split": split, "games": max(games) if games else 0, **score,
            **({"equal_time": equal_time_summary(results.runs)} if primary else {}), "sft": {
        "seeds": sorted(sft), "held_out_mean": mean_or_none(starts),
        "held_out_std": mean_std(starts)[1] if starts else None, "held_out_by_seed": starts,
        "wall_seconds": {part: statistics.fmean(r["seconds"].get(part, 0.0) for r in sft.values())
                         for part in (next(iter(sft.values()))["seconds"] if sft else {})}},
        "arms": arms, "comparisons": comparisons}


def seed_score(evaluation: Mapping) -> float:
    """One checkpoint's mean episode score on a split (its eval seeds pooled, as seed_success)."""
    return statistics.fmean(run["score"] / 100 for run in evaluation["runs"])


def score_summary(results: StudyResults, split: str, sft: Mapping[int, Mapping], arms: Iterable[str]) -> dict:
    """The score beside success (StudyConfig.score), as a fraction of the full score: each arm's mean over seeds
    and its paired gain over its SFT start, and every comparison, each with both intervals."""
    def arm(name: str) -> dict:
        runs = results.runs[name]
        seeds = sorted(s for s in runs.keys() & sft.keys() if split in runs[s]["evaluations"])
        gain = paired({s: runs[s] for s in seeds}, {s: sft[s] for s in seeds}, split, metric="score")
        return {"seeds": seeds,
                "mean": statistics.fmean(seed_score(runs[s]["evaluations"][split]) for s in seeds),
                "sft_mean": statistics.fmean(seed_score(sft[s]["evaluations"][split]) for s in seeds),
                "gain": gain and {k: gain[k] for k in ("gain", "ci95", "seed_ci95", "per_seed") if k in gain}}

    comparisons = {f"{a} vs {b}": gain | {"a": a, "b": b} for a, b, _ in comparisons_of(arms)
                   if (gain := paired(results.runs[a], results.runs[b], split, metric="score"))}
    return {"sft_mean": mean_or_none([seed_score(r["evaluations"][split]) for r in sft.values()]),
            "arms": {name: arm(name) for name in arms}, "comparisons": comparisons}


def time_vs(runs: Mapping[int, Mapping], base: Mapping[int, Mapping]) -> dict | None:
    """An arm's time per iteration relative to `base`'s, seed by seed, then averaged: each seed's ratio is on one
    scale even where the two arms ran on different machines, once both recorded a reference step."""
    ratios = {seed: r for seed in sorted(runs.keys() & base.keys()) if (r := time_ratio(runs[seed], base[seed]))}
    if not ratios:
        return None
    normalized = [seed for seed in ratios if reference_step(runs[seed]) and reference_step(base[seed])]
    return {"ratio": statistics.fmean(ratios.values()), "by_seed": ratios, "normalized_seeds": normalized}


def categories_of(results: StudyResults, split: str) -> set[str]:
    return {o["category"] for by_seed in [results.sft, *results.runs.values()] for r in by_seed.values()
            if split in r["evaluations"] for run in r["evaluations"][split]["runs"] for o in run["outcomes"]}


def pooling_text() -> str:
    """How `paired` pools seeds, from its docstring (one text for summary.json and RESULTS.md)."""
    return paired.__doc__.split("\n\n", 1)[1].split("\n\n")[0].replace("\n    ", " ").strip().removeprefix("Pooling: ")


def study_summary(results: StudyResults, command: str) -> dict:
    """summary.json: the primary split's numbers at the top (per arm: held_out_mean and _std over training
    seeds, sft_mean, gain_ci95 [lo, hi] of the paired gain over the seed's SFT start, seconds_per_iteration),
    the paired comparisons between arms, and the other held-out splits under `other_splits`. Success is a
    fraction in [0, 1]; gains are differences of fractions."""
    cfg = results.cfg
    primary, *others = cfg.eval_splits
    return {"generated_by": command, "env": cfg.env, "eval_seeds": list(cfg.eval_seeds),
            "seeds": finished_seeds(results), "seeds_planned": list(cfg.seeds), "iterations": cfg.rl.iterations,
            "episodes_per_iteration": cfg.rl.episodes_per_iteration,
            "pooling": pooling_text(),
            **split_summary(results, primary),
            "other_splits": {split: split_summary(results, split) for split in others}}
