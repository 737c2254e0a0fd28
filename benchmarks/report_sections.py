"""The figures of docs/BENCHMARKS.md from each benchmark's JSON (pure): its section's table and prose, and the
headline figures the summary at the top repeats. benchmarks/report.py runs the benchmarks and assembles the page.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence

from benchlib import spread

from trainer_client.timing import ITERATION_STAGES

# ---- formatting (pure) ------------------------------------------------------------------------------------


def number(value: float | None, digits: int = 3) -> str:
    """`digits` significant digits, but never scientific notation and never rounding away integer digits."""
    if value is None or math.isnan(value):
        return "–"
    if value == 0 or math.isinf(value):
        return str(value) if value else "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def spread_cell(s: Mapping, digits: int = 3) -> str:
    """`median [min, max]` of a benchmarks.benchlib.spread; a single run shows its one value."""
    if s["runs"] == 1 or s["min"] == s["max"]:
        return number(s["median"], digits)
    return f"{number(s['median'], digits)} [{number(s['min'], digits)}, {number(s['max'], digits)}]"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


# ---- one renderer per benchmark's JSON (pure) ---------------------------------------------------------------


def render_wire(runs: list[dict]) -> str:
    """wire.py writes a list of cells per run; latencies and their ratio to in-process, over the runs."""
    cells: dict[tuple[str, int], list[dict]] = {}
    for run in runs:
        base = {c["concurrency"]: c for c in run["cells"] if c["mode"] == "in-process"}
        for c in run["cells"]:
            cells.setdefault((c["mode"], c["concurrency"]), []).append(
                c | {"p50_ratio": c["p50_ms"] / base[c["concurrency"]]["p50_ms"]})
    rows = []
    for (mode, concurrency), samples in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0] != "in-process", kv[0][0])):
        def s(key: str) -> str:
            return spread_cell(spread([c[key] for c in samples]))
        rows.append([str(concurrency), mode, s("steps_per_s"), s("p50_ms"), s("p99_ms"),
                     "1" if mode == "in-process" else s("p50_ratio")])
    return ("Toy env steps through one server process. *in-process* is the server's own call path (env worker "
            "round trip, no gRPC); *unary* is Reset/Step/Close, *stream* the Episode stream, both through "
            "`EnvPool`. The ratio is each run's p50 over in-process p50 at the same concurrency.\n\n"
            + markdown_table(["concurrency", "mode", "steps/s", "p50 ms", "p99 ms", "p50 / in-process"], rows))


def alfworld_table(medians: Mapping[str, Mapping], p90: Mapping[str, float]) -> str:
    rows = [[name, number(m["upstream_ms"]), number(m["limen_ms"]), number(m["ratio"], 2),
             f"<= {m['goal']}" if m.get("goal") else ""] for name, m in medians.items()]
    rows.append(["p90 step", number(p90["upstream_ms"]), number(p90["limen_ms"]),
                 number(p90["limen_ms"] / p90["upstream_ms"], 2), ""])
    return markdown_table(["", "upstream AlfredTWEnv", "limen AlfWorldEnv", "ratio", "goal"], rows)


def render_alfworld(runs: list[dict]) -> str:
    parts = []
    for run in runs:
        parts.append(f"{run['games']} {run['source']} games, {run['steps']} steps, the same actions in both "
                     f"(outputs checked equal); median wall time in ms:\n\n"
                     + alfworld_table(run["median"], run["p90_step_ms"]))
        if "median_cpu" in run:   # each side's own process CPU time: steadier than wall time on a shared machine
            parts.append("The same steps in CPU time of each side's own process (ms), less sensitive to other "
                         "jobs on the machine, since the two sides run one after the other:\n\n"
                         + alfworld_table(run["median_cpu"], run["p90_step_cpu_ms"]))
    return "\n\n".join(parts)


def render_webshop(runs: list[dict]) -> str:
    def row(label: str, pick: Callable[[dict], float], digits: int = 3) -> list[str]:
        return [label, spread_cell(spread([pick(r) for r in runs]), digits)]

    env, index = runs[0]["env"], runs[0]["index"]
    rows = [
        row("search p50 ms (BM25 top-50, uncached)", lambda r: r["env"]["search_ms"]["p50"]),
        row("search p99 ms", lambda r: r["env"]["search_ms"]["p99"]),
        row("reset p50 ms", lambda r: r["env"]["reset_ms"]["p50"]),
        row("step p50 ms (expert actions, text mode)", lambda r: r["env"]["step_ms"]["p50"]),
        row("step p99 ms", lambda r: r["env"]["step_ms"]["p99"]),
        row(f"index build s, synthetic {index['products']:,}-product catalog", lambda r: r["index"]["build_s"]),
        row("index mmap load s", lambda r: r["index"]["load_s"]),
        row("full 1.18M catalog build, extrapolated by tokens, min",
            lambda r: r.get("full_catalog_build_min_at_real_length", float("nan"))),
    ]
    catalog = env["catalog"] if env["catalog"].startswith("synthetic") else "$WEBSHOP_DATA"  # not a machine path
    return (f"Catalog `{catalog}` ({env['products']} products), {env['search_ms']['n']} goal queries and "
            f"{env['reset_ms']['n']} expert episodes ({env['step_ms']['n']} steps) per run; median [min, max] over "
            f"{len(runs)} runs.\n\n" + markdown_table(["figure", "value"], rows))


def render_tagger(runs: list[dict]) -> str:
    run = runs[0]
    rows = [[f"equal {name}", f"{100 * agree / run['pairs']:.2f}%"] for name, agree in run["equal"].items()]
    rows.insert(0, ["identical noun lists (titles)", f"{100 * run['same_noun_lists'] / run['titles']:.1f}%"])
    return (f"The reward with the heuristic noun tagger against spaCy's, side by side on {run['pairs']:,} "
            f"goal-product pairs ({run['goals']:,} goals x their target and top-{run['results_per_goal']} results):\n\n"
            + markdown_table(["agreement", "share"], rows))


def render_sessions(runs: list[dict]) -> str:
    run, parts = runs[0], []
    for result in run["results"]:
        rows = [[str(level["sessions"]), number(level.get("seconds_per_repeat")), str(level["steps"]),
                 spread_cell(level["p50_ms"]), spread_cell(level["p99_ms"]), spread_cell(level["steps_per_s"])]
                for level in result["levels"]]
        parts.append(f"**{result['env']}** ({result['workers']} worker processes): most sessions with p99 <= "
                     f"{run['bound_ms']:g} ms: **{result['max_sessions_under_bound']}**\n\n"
                     + markdown_table(["sessions", "s measured per repeat", "steps (all repeats)", "p50 ms",
                                       "p99 ms", "steps/s"], rows))
    least = f"At least {run['seconds']:g} s and about {run['min_steps']} steps" if "min_steps" in run else \
        f"{run['seconds']:g} s"
    return (f"Each session steps, then waits {run['think_s']:g} s (the policy's turn) before its next step. "
            f"{least} measured per level and repeat; p50 and p99 are median [min, max] over {run['repeats']} "
            f"repeats, the levels taking turns. The capacity is the largest level before the first whose median "
            f"p99 exceeds the bound. The client (one EnvPool process) shares the machine's cores with the "
            f"server.\n\n"
            + "\n\n".join(parts))


def render_rollout(runs: list[dict]) -> str:
    run = runs[0]
    setting = run["setting"]
    keys = (("wall_s", "wall s"), ("generation_s", "generation s"), ("env_wait_s", "env wait s"),
            ("env_wait_share", "env wait share"), ("generation_calls", "generation calls"))
    rows = [[mode] + [spread_cell(figures[key]) for key, _ in keys] for mode, figures in run["modes"].items()]
    ratio = run["ratio_async_over_lockstep"]
    rows.append(["ratio async / lock-step", spread_cell(ratio["wall_s"]), spread_cell(ratio["generation_s"]),
                 spread_cell(ratio["env_wait_s"]), "", ""])
    return (f"{setting['episodes']} concurrent episodes of {setting['env']}, at most {setting['max_turns']} turns, "
            f"{setting['max_new_tokens']} new tokens per reply; {setting['workers']} env worker process(es), "
            f"{setting['torch_threads']} torch thread(s), tiny random-init policy ({setting['model_size']}). *async* "
            f"is `rollout.collect` (GenerationBatcher, batch wait {setting['batch_wait_s']} s); *lock-step* "
            f"generates for every live episode, then steps them all. Median [min, max] over {setting['rounds']} "
            f"rounds, the modes alternating.\n\n" + markdown_table(["mode", *(title for _, title in keys)], rows))


def breakdown(seconds: Mapping[str, Mapping[str, float]], ratio: Mapping[str, float]) -> str:
    rows = [[stage, number(seconds["boundary"][stage]), number(seconds["ppo_critic"][stage]),
             number(ratio.get(stage), 3)] for stage in (*ITERATION_STAGES, "iteration")
            if stage in seconds["boundary"]]   # a stage newer than the measurement (e.g. trunk) is not shown
    rows[-1] = [f"**{cell}**" for cell in rows[-1]]
    return markdown_table(["stage (s per iteration)", "boundary", "ppo_critic", "ratio"], rows)


def render_iteration_cost(runs: list[dict]) -> str:
    run = runs[0]
    ratio = run["ratio"]
    return (f"Mode *{run['mode']}*, model {run['model']} on {run['device']} ({run['threads']} threads), "
            f"setting `{json.dumps(run['setting'], sort_keys=True)[:300]}`; mean over {run['iterations']} "
            f"iterations per algorithm, alternating in one process. Iteration ratio boundary / ppo_critic "
            f"**{number(ratio['iteration'])}** (learner stages only: {number(ratio['learner'])}; the seed claims "
            f"{number(run['claimed_ratio'])}).\n\n" + breakdown(run["seconds"], ratio))


def render_gpu(runs: list[dict]) -> str:
    run = runs[0]
    timing, env = run["timing"], run["environment"]
    ratio = timing["ratio_boundary_over_ppo_critic"]
    return (f"**Measured on {env['device']} by `make gpu-check`** (torch {env['torch']}, CUDA {env['cuda']}), not "
            f"on this machine: {timing['setting']['model']}, {timing['setting']['episodes']['episodes']} episodes x "
            f"{timing['setting']['episodes']['turns']} turns of {timing['setting']['episodes']['prompt_tokens']} + "
            f"{timing['setting']['episodes']['response_tokens']} tokens, bf16 autocast; mean over "
            f"{timing['setting']['iterations']} iterations. Iteration ratio **{number(ratio['iteration'])}** "
            f"(learner stages only: {number(ratio['learner'])}; claimed {number(timing['claimed_ratio'])}).\n\n"
            + breakdown(timing["seconds"], ratio))


def render_policy(runs: list[dict]) -> str:
    run = runs[0]
    keys = list(next(iter(run.values())))
    rows = [[key] + [number(values[key]) for values in run.values()] for key in keys]
    return ("Median of the command's --repeats timed calls per cell, side by side in one run: the output layer at "
            "response positions only and the two-row value readout, against full-vocabulary logits.\n\n"
            + markdown_table(["figure", *run], rows))


def render_soak(runs: list[dict]) -> str:
    run = runs[0]
    growth = run["rss_growth_after_warmup"]
    worst = max(growth, key=growth.get) if growth else None
    rows = [[env, str(count), str(run["failed"].get(env, 0)), number(run["seconds"].get(env)),
             number(run["episodes_per_s"].get(env)), json.dumps(run["worker_restarts"].get(env, {}))]
            for env, count in run["episodes"].items()]
    table = markdown_table(["env", "episodes", "failed", "seconds", "episodes/s", "worker restarts"], rows)
    growth_line = (f"worst RSS growth after warm-up: {worst} {100 * growth[worst]:+.1f}% (goal <= +10%)" if worst
                   else "too few memory samples to measure growth")
    return f"{table}\n\nOne run; {growth_line}; live sessions at the end: {run['live_sessions_at_end']}."


# ---- headline figures for the summary table (pure) -----------------------------------------------------------


def wire_headlines(runs: list[dict]) -> list[tuple[str, str]]:
    def ratio(mode: str, concurrency: int) -> str:
        per_run = []
        for run in runs:
            cells = {(c["mode"], c["concurrency"]): c for c in run["cells"]}
            per_run.append(cells[mode, concurrency]["p50_ms"] / cells["in-process", concurrency]["p50_ms"])
        return spread_cell(spread(per_run))

    return [(f"{mode} step p50 / in-process p50, {c} concurrent", ratio(mode, c))
            for mode in ("stream", "unary") for c in (1, 16, 256)]


def alfworld_headlines(runs: list[dict]) -> list[tuple[str, str]]:
    run = runs[0]
    clocks = [("wall", "median")] + ([("CPU", "median_cpu")] if "median_cpu" in run else [])
    return [(f"ALFWorld {key} {clock} time, ours / upstream ({run['source']} games)", number(run[field][key]["ratio"], 2))
            for clock, field in clocks for key in ("reset, first visit", "step")]


def webshop_headlines(runs: list[dict]) -> list[tuple[str, str]]:
    catalog = f"{runs[0]['env']['products']:,}-product catalog"
    return [(f"WebShop search {q} ms ({catalog})", spread_cell(spread([r["env"]["search_ms"][q] for r in runs])))
            for q in ("p50", "p99")] + [
        (f"WebShop index build s ({runs[0]['index']['products']:,} products)",
         spread_cell(spread([r["index"]["build_s"] for r in runs])))]


def sessions_headlines(runs: list[dict]) -> list[tuple[str, str]]:
    run = runs[0]
    return [(f"{r['env']} sessions per server process with p99 step <= {run['bound_ms']:g} ms "
             f"({run['think_s']:g} s between steps)", str(r["max_sessions_under_bound"])) for r in run["results"]]


def rollout_headlines(runs: list[dict]) -> list[tuple[str, str]]:
    modes = runs[0]["modes"]
    return [(f"share of rollout wall time waiting on envs, {mode}", spread_cell(modes[mode]["env_wait_share"]))
            for mode in modes] + [("rollout wall time, async / lock-step",
                                   spread_cell(runs[0]["ratio_async_over_lockstep"]["wall_s"]))]


def iteration_headlines(runs: list[dict]) -> list[tuple[str, str]]:
    """From iteration_cost.py's JSON, or gpu_check.py's (which nests it under "timing")."""
    run = runs[0]
    if "timing" in run:
        return [(f"iteration time, boundary / ppo_critic ({run['timing']['setting']['model']})",
                 number(run["timing"]["ratio_boundary_over_ppo_critic"]["iteration"]))]
    return [(f"iteration time, boundary / ppo_critic ({run['mode']} episodes, model {run['model']})",
             number(run["ratio"]["iteration"]))]
