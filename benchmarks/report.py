"""`make bench`: run every benchmark in benchmarks/ with JSON output, then write docs/BENCHMARKS.md from that
JSON alone: the machine, one section per benchmark with the exact command that produced it.

    .venv/bin/python benchmarks/report.py [--run default|all|none|NAME,...] [--results artifacts/bench]
                                          [--out docs/BENCHMARKS.md]

`--run none` re-renders from the last results. Every figure is a ratio measured side by side in one run,
or a median [min, max] over >= 5 runs (repeated here, or inside the benchmark). The soak (`make soak`,
~10 min) runs only with `--run all` or `--run soak`, and the GPU measurement only on the GPU machine
(`make gpu-check`); both are rendered from their last artifact, labelled as such.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import report_sections as sections
from benchlib import cpu_model

ROOT = Path(__file__).resolve().parents[1]
Renderer = Callable[[list[dict]], str]
Headlines = Callable[[list[dict]], list[tuple[str, str]]]


# ---- the benchmarks ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str
    args: tuple[str, ...]
    """Command after the Python executable; "{json}" stands for the output path. Empty: never run here."""
    render: Renderer
    repeats: int = 1
    """Runs of the command (figures that are not ratios need >= 5: median [min, max])."""
    in_default_run: bool = True
    output: str = ""
    """A fixed output path (relative to the repo) instead of {results}/{name}.{i}.json."""
    note: str = ""
    headlines: Headlines | None = None
    """The figures the summary table at the top repeats."""
    where: str = "this CPU"

    def output_paths(self, results: Path) -> list[Path]:
        if self.output:
            return [ROOT / self.output]
        return [results / f"{self.name}.{i}.json" for i in range(1, self.repeats + 1)]


BENCHMARKS = (
    Benchmark("wire", "Wire overhead: in-process vs unary vs stream",
              ("benchmarks/wire.py", "--concurrency", "1,16,256", "--seconds", "1.5", "--rounds", "2", "--json", "{json}"),
              sections.render_wire, repeats=5, headlines=sections.wire_headlines),
    Benchmark("alfworld_speed_official", "ALFWorld reset and step, ours vs upstream: official games",
              ("benchmarks/alfworld_speed.py", "--json", "{json}"),
              sections.render_alfworld, headlines=sections.alfworld_headlines,
              note="Official valid_seen/valid_unseen games when ALFWORLD_DATA has them, else generated full-size ones."),
    Benchmark("alfworld_speed_small", "ALFWorld reset and step, ours vs upstream: small generated games",
              ("benchmarks/alfworld_speed.py", "--generated", "small", "--json", "{json}"),
              sections.render_alfworld, headlines=sections.alfworld_headlines),
    Benchmark("webshop_speed", "WebShop search latency and index build",
              ("benchmarks/webshop_speed.py", "--episodes", "500", "--products", "50000", "--json", "{json}"),
              sections.render_webshop, repeats=5, headlines=sections.webshop_headlines),
    Benchmark("webshop_tagger", "WebShop reward: heuristic noun tagger vs spaCy",
              ("benchmarks/webshop_tagger_agreement.py", "--json", "{json}"), sections.render_tagger),
    Benchmark("sessions", "Sessions per server process at p99 step latency",
              ("benchmarks/sessions_capacity.py", "--envs", "toy,webshop", "--sessions", "16,64,128,256,512",
               "--seconds", "2", "--repeats", "5", "--json", "{json}"),
              sections.render_sessions, headlines=sections.sessions_headlines),
    Benchmark("rollout", "Rollout: time waiting on envs, async vs lock-step",
              ("benchmarks/rollout_overlap.py", "--episodes", "64", "--rounds", "5", "--json", "{json}"),
              sections.render_rollout, headlines=sections.rollout_headlines),
    Benchmark("iteration_cost_synthetic", "Iteration time, boundary vs ppo_critic: synthetic episodes (this CPU)",
              ("benchmarks/iteration_cost.py", "--iterations", "5", "--json", "{json}"),
              sections.render_iteration_cost, headlines=sections.iteration_headlines),
    Benchmark("iteration_cost_rollout", "Iteration time, boundary vs ppo_critic: toy-env rollouts (this CPU)",
              ("benchmarks/iteration_cost.py", "--mode", "rollout", "--iterations", "5", "--json", "{json}"),
              sections.render_iteration_cost, headlines=sections.iteration_headlines),
    Benchmark("iteration_cost_gpu", "Iteration time, boundary vs ppo_critic: Qwen2.5-1.5B shape on a GPU",
              (), sections.render_gpu, output="docs/measurements/gpu_check_h200.json",
              headlines=sections.iteration_headlines, where="a GPU (NVIDIA H200)",
              note="Not run by `make bench`: `make gpu-wheels` here, then `make gpu-check` on the GPU machine "
                   "(benchmarks/gpu_check.py), whose JSON is committed here."),
    Benchmark("policy", "Policy compute: response-only logits and the two-row readout",
              ("benchmarks/bench_policy.py", "--threads", "2", "--repeats", "5", "--out", "{json}"),
              sections.render_policy),
    Benchmark("soak", "Soak: memory over many episodes through one server",
              ("benchmarks/soak.py", "--out", "artifacts/soak"), sections.render_soak, in_default_run=False,
              output="artifacts/soak/soak.json",
              note="About 10 minutes, so `make bench` leaves it out (`make soak`, or `benchmarks/report.py --run soak`); "
                   "shown from its last run on this machine."),
)


def display_command(bench: Benchmark, path: Path) -> str:
    args = [a.replace("{json}", os.path.relpath(path, ROOT)) for a in bench.args]
    return "OMP_WAIT_POLICY=PASSIVE .venv/bin/python " + shlex.join(args)


# ---- the machine, and running ------------------------------------------------------------------------------


def machine() -> dict:
    """What the numbers depend on, read when the run starts (the load average especially)."""
    import psutil
    import torch

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {
        "cpu": cpu_model(), "logical_cpus": os.cpu_count(), "usable_cpus": usable,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average_at_start": load_average(),
        "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
        "torch_default_threads": torch.get_num_threads(),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
        "data": {name: os.environ.get(name) or "(unset)" for name in ("ALFWORLD_DATA", "WEBSHOP_DATA")},
        "git": f"{commit}{' + uncommitted changes' if dirty else ''}",
        "started_at": now(),
    }


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_benchmark(bench: Benchmark, results: Path, timeout_s: float) -> dict:
    """Run the command once per repeat; returns the manifest record (never raises on a failed benchmark)."""
    env = os.environ | {"OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    log_path = results / f"{bench.name}.log"
    load_before, started, returncode = load_average(), time.perf_counter(), 0
    with log_path.open("w") as log:
        for path in bench.output_paths(results):
            path.unlink(missing_ok=True)
            command = [sys.executable, *(a.replace("{json}", str(path)) for a in bench.args)]
            print(f"[bench] {bench.name}: {display_command(bench, path)}", flush=True)
            try:
                returncode = subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            timeout=timeout_s).returncode
            except subprocess.TimeoutExpired:
                returncode = -1
                log.write(f"\n[bench] killed after {timeout_s:.0f} s\n")
            if returncode != 0:
                break
    seconds = time.perf_counter() - started
    print(f"[bench] {bench.name}: exit {returncode} after {seconds:.0f} s", flush=True)
    return {"returncode": returncode, "seconds": round(seconds, 1),
            "load_average_before": load_before, "load_average_after": load_average(),
            "finished_at": now(),
            "log": os.path.relpath(log_path, ROOT)}


def load_outputs(bench: Benchmark, results: Path) -> list[dict] | None:
    """Every repeat's JSON, or None when any is missing (wire.py writes a bare list: wrapped as cells)."""
    paths = bench.output_paths(results)
    if not all(p.is_file() for p in paths):
        return None
    loaded = [json.loads(p.read_text()) for p in paths]
    return [{"cells": data} if isinstance(data, list) else data for data in loaded]


# ---- the document (pure) ------------------------------------------------------------------------------------


def load_cell(averages: Sequence[float] | None) -> str:
    return ", ".join(str(x) for x in averages) if averages else "not recorded"


def load_note(info: Mapping) -> str:
    """Whether the machine was busy with other work while the benchmarks ran, from the 1-minute load
    average before the first and after the last benchmark (the benchmarks themselves add about one)."""
    loads = [info[key][0] for key in ("load_average_at_start", "load_average_at_end") if info.get(key)]
    busiest = max(loads)
    if busiest >= 0.5 * info["usable_cpus"]:
        return (f"**Measured under load**: the 1-minute load average was {load_cell(loads)} (start, end) on "
                f"{info['usable_cpus']} usable CPUs, so other processes competed for the cores; absolute "
                f"times are pessimistic and noisier than on an idle machine, while side-by-side ratios "
                f"(whose modes take turns) are less affected. Each section gives the load around its run.")
    return (f"The machine was close to idle: 1-minute load average {load_cell(loads)} (start, end) on "
            f"{info['usable_cpus']} usable CPUs.")


def render_machine(info: Mapping) -> str:
    data = info.get("data", {})
    rows = [["CPU", f"{info['cpu']}, {info['logical_cpus']} logical CPUs ({info['usable_cpus']} usable)"],
            ["memory", f"{info['memory_gib']} GiB"],
            ["load average at start (1, 5, 15 min)", load_cell(info["load_average_at_start"])],
            ["load average at end (1, 5, 15 min)", load_cell(info.get("load_average_at_end"))],
            ["OS", info["platform"]], ["Python / torch", f"{info['python']} / {info['torch']}"],
            ["threads", f"OMP_WAIT_POLICY={info['OMP_WAIT_POLICY']}; each benchmark fixes its own torch/BLAS "
                        f"threads (1 unless its command says --threads); torch's default here: "
                        f"{info['torch_default_threads']}"],
            # The variables, not this machine's paths: docs/DATA.md says where the data comes from.
            ["data", ", ".join(f"${name}" if value != "(unset)" else f"{name} unset" for name, value in data.items())
             or "not recorded"],
            ["code", info["git"]], ["run started", info["started_at"]],
            ["run finished", info.get("finished_at", "not recorded")]]
    if info.get("reruns"):
        rows.append(["re-run afterwards", "; ".join(info["reruns"])])
    return sections.markdown_table(["", "this machine"], rows) + "\n\n" + load_note(info)


def render_section(bench: Benchmark, outputs: list[dict] | None, record: Mapping | None, results: Path) -> str:
    paths = bench.output_paths(results)
    command = display_command(bench, paths[0]) if bench.args else "(not run here)"
    repeats = f" ({bench.repeats} runs)" if bench.repeats > 1 else ""
    lines = [f"## {bench.title}", ""]
    if bench.note:
        lines += [bench.note, ""]
    lines += [f"Command{repeats}: `{command}`", ""]
    if record is not None and record["returncode"] != 0:
        lines += [f"**Not measured**: the command exited with code {record['returncode']} "
                  f"(log: `{record['log']}`).", ""]
    elif outputs is None:
        lines += ["**Not measured**: no results file yet (`" + os.path.relpath(paths[0], ROOT) + "`).", ""]
    else:
        load = (f"; 1-minute load average {record['load_average_before'][0]} before, "
                f"{record['load_average_after'][0]} after" if record and "load_average_before" in record else "")
        when = f"measured {record['finished_at']} in {record['seconds']:.0f} s{load}" if record else \
            f"from `{os.path.relpath(paths[0], ROOT)}` (file modified {file_date(paths[0])})"
        lines += [f"_{when}_", "", bench.render(outputs), ""]
    return "\n".join(lines)


def file_date(path: Path) -> str:
    stamp = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc)
    return stamp.isoformat(timespec="seconds")


def anchor(title: str) -> str:
    """GitHub's heading anchor: lowercase, punctuation dropped, spaces as hyphens."""
    kept = "".join(ch for ch in title.lower() if ch.isalnum() or ch in " -_")
    return "#" + kept.replace(" ", "-")


def render_summary(outputs: Mapping[str, list[dict] | None], benchmarks: Sequence[Benchmark]) -> str:
    rows = [[figure, value, bench.where, f"[{bench.name}]({anchor(bench.title)})"]
            for bench in benchmarks if bench.headlines and outputs.get(bench.name)
            for figure, value in bench.headlines(outputs[bench.name])]
    return sections.markdown_table(["figure", "value", "measured on", "section"], rows)


def render_document(manifest: Mapping, outputs: Mapping[str, list[dict] | None], results: Path,
                    benchmarks: Sequence[Benchmark] = BENCHMARKS) -> str:
    header = ["# Benchmarks", "",
              "Generated by `make bench` (`benchmarks/report.py`) from the benchmarks' JSON output; do not edit by "
              "hand. Each figure is a ratio measured side by side in one run, or a median [min, max] over >= 5 "
              "runs. The machine is shared and small, so absolute times are this machine's; ratios travel better.",
              "", render_machine(manifest["machine"]), "", "## Summary", "",
              "Median [min, max] where a figure was measured in several runs; each section below gives the command.",
              "", render_summary(outputs, benchmarks), ""]
    sections = [render_section(b, outputs.get(b.name), manifest["runs"].get(b.name), results) for b in benchmarks]
    return "\n".join(header + sections).rstrip() + "\n"


# ---- CLI --------------------------------------------------------------------------------------------------


def selected(spec: str) -> list[Benchmark]:
    runnable = [b for b in BENCHMARKS if b.args]
    if spec == "none":
        return []
    if spec == "default":
        return [b for b in runnable if b.in_default_run]
    if spec == "all":
        return runnable
    names = spec.split(",")
    unknown = sorted(set(names) - {b.name for b in runnable})
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {unknown}; runnable here: {[b.name for b in runnable]}")
    return [b for b in runnable if b.name in names]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default="default", help="default | all | none | NAME,... (see BENCHMARKS)")
    parser.add_argument("--results", type=Path, default=ROOT / "artifacts" / "bench", help="JSON, logs, manifest")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    parser.add_argument("--timeout-s", type=float, default=1200.0, help="per command")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.results.mkdir(parents=True, exist_ok=True)
    manifest_path = args.results / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {"runs": {}}
    to_run = selected(args.run)
    # A full run describes the machine afresh; re-running a few benchmarks later keeps that description
    # and notes the re-run (each section gives its own date and load).
    if args.run in ("default", "all") or "machine" not in manifest:
        manifest["machine"] = machine()
    elif to_run:
        manifest["machine"].setdefault("reruns", []).append(f"{','.join(b.name for b in to_run)} at {now()}")
    for bench in to_run:
        manifest["runs"][bench.name] = run_benchmark(bench, args.results, args.timeout_s) | {
            "command": display_command(bench, bench.output_paths(args.results)[0])}
        manifest_path.write_text(json.dumps(manifest, indent=2))
    if args.run in ("default", "all"):
        manifest["machine"] |= {"load_average_at_end": load_average(), "finished_at": now()}
    manifest_path.write_text(json.dumps(manifest, indent=2))
    outputs = {b.name: load_outputs(b, args.results) for b in BENCHMARKS}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render_document(manifest, outputs, args.results))
    print(f"[bench] wrote {args.out}")
    return 0 if all(manifest["runs"][b.name]["returncode"] == 0 for b in to_run) else 1


if __name__ == "__main__":
    sys.exit(main())
