"""Look inside one update of the toy learning test (tests/e2e/test_toy_learning.py): how a run that breaks down
was found to break (docs/measurements/toy_learning_settings.json, `truncated_replies`).

    OMP_NUM_THREADS=1 python benchmarks/toy_update_probe.py run SEED 'CHANGES as JSON' OUT   # the test's run, kept
    OMP_NUM_THREADS=1 python benchmarks/toy_update_probe.py redo OUT/rl K NAME [key=value ...]
    OMP_NUM_THREADS=1 python benchmarks/toy_update_probe.py samples OUT/rl K

`run` is the test's learning run with a checkpoint after every iteration, kept in OUT. `redo` plays iteration K
again from checkpoint K-1 (the same rollout: each iteration reseeds from (seed, K)) with the overrides given, and
prints K's and K+1's metrics, with the gradient each loss sends into the backbone. `samples` redoes iteration K
and prints, for its first update step, the norm of the actor-loss gradient each turn sample alone sends, largest
first, beside its advantage and reply.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import shutil
import sys
from pathlib import Path

import torch
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))
import test_toy_learning as toy  # noqa: E402

from trainer_client import config, learner as learner_module  # noqa: E402
from trainer_client.algorithms.losses import policy_objective  # noqa: E402
from trainer_client.policy import TokenBatch  # noqa: E402
from trainer_client.train import train  # noqa: E402
from trainer_client.train_config import TrainConfig  # noqa: E402

SHOWN = ("rollout/success", "rollout/valid_action_ratio", "rollout/response_tokens", "rollout/cut_replies", "loss/kl",
         "policy/approx_kl", "policy/grad_norm", "policy/update_steps", "grad/backbone_from_policy_loss",
         "grad/backbone_from_value_loss")


def keep_run(seed: int, changes: dict, out: Path) -> None:
    every_iteration = toy.rl_config
    toy.rl_config = lambda *args: dataclasses.replace(every_iteration(*args), save_every=1)
    out.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(toy.learning_run(dataclasses.replace(toy.ToyLearning(), **changes), seed, out))
    print(json.dumps({"seed": seed, "changes": changes, "gain": result.gain.gain, "lo": result.gain.lo,
                      "hi": result.gain.hi, "valid_ratio": result.valid_ratio}))


def redo(run_dir: Path, k: int, out: Path, overrides: list[str]) -> Path:
    """Iteration k (and k + 1) again in `out`, from run_dir's checkpoint k - 1."""
    if k < 1:
        raise SystemExit("K must be >= 1: iteration K is redone from checkpoint K-1")
    start = f"iter_{k - 1:06d}"
    shutil.rmtree(out, ignore_errors=True)
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(run_dir / "checkpoints" / start, out / "checkpoints" / start)
    (out / "checkpoints" / "latest").write_text(start)
    shutil.copy(run_dir / "metrics.jsonl", out / "metrics.jsonl")
    cfg = config.load(TrainConfig, run_dir / "config.yaml", [
        f"run_dir={out}", "env.servers=[]", "save_every=1000", "optim.grad_sources_every=1", f"iterations={k + 2}",
        *overrides])
    asyncio.run(train(cfg, resume=True, console=Console(quiet=True)))
    return out


def sample_gradients(captured: dict) -> list[tuple[float, float, int, str]]:
    """(gradient norm, advantage, tokens, reply) per sample of the captured update, from its weights before it."""
    policy, samples, targets = captured["policy"], captured["samples"], captured["targets"]
    policy.model.load_state_dict(captured["weights_before"])
    params = [p for p in policy.model.parameters() if p.requires_grad]
    rows = []
    for i, sample in enumerate(samples):
        out = policy(TokenBatch.from_samples([sample], captured["pad_id"]), captured["temperature"])
        width = out.log_probs.shape[1]
        mask = targets.response_mask[[i], :width]
        pick = lambda x: None if x is None else x[[i], :width]  # noqa: E731
        loss = policy_objective(captured["loss_cfg"], out.log_probs, pick(targets.old_log_probs),
                                pick(targets.advantages), mask, pick(targets.ref_log_probs), out.entropy).loss
        if not mask.any():
            rows.append((0.0, 0.0, 0, policy.tokenizer.decode(list(sample.response_ids))))
            continue
        grads = [g for g in torch.autograd.grad(loss, params, allow_unused=True) if g is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        rows.append((norm, float(targets.advantages[i, :width][mask[0]][0]), int(mask.sum()),
                     policy.tokenizer.decode(list(sample.response_ids))))
    return sorted(rows, key=lambda row: -row[0])


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    if len(argv) == 4 and argv[0] == "run":
        keep_run(int(argv[1]), json.loads(argv[2]), Path(argv[3]))
    elif len(argv) >= 4 and argv[0] == "redo":
        run_dir, k, name = Path(argv[1]), int(argv[2]), argv[3]
        out = redo(run_dir, k, run_dir.parent / f"redo_{k}_{name}", argv[4:])
        for line in (out / "metrics.jsonl").read_text().splitlines()[k:k + 2]:
            row = json.loads(line)
            print(name, row["iteration"], " ".join(f"{key.split('/')[-1]}={row.get(key, float('nan')):.3f}"
                                                   for key in SHOWN))
    elif len(argv) == 3 and argv[0] == "samples":
        run_dir, k, captured = Path(argv[1]), int(argv[2]), {}
        update = learner_module.ppo_policy_update

        def capturing(policy, optimizer, samples, targets, loss_cfg, **kw):
            captured.update(policy=policy, samples=samples, targets=targets, loss_cfg=loss_cfg, pad_id=kw["pad_id"],
                            temperature=kw["temperature"], weights_before=copy.deepcopy(policy.model.state_dict()))
            return update(policy, optimizer, samples, targets, loss_cfg, **kw)

        learner_module.ppo_policy_update = capturing
        try:
            redo(run_dir, k, run_dir.parent / f"samples_{k}", [f"iterations={k + 1}"])
        finally:
            learner_module.ppo_policy_update = update
        rows = sample_gradients(captured)
        print(f"{len(rows)} samples, median gradient norm {rows[len(rows) // 2][0]:.3f}")
        for norm, advantage, tokens, reply in rows[:15]:
            print(f"{norm:8.3f}  advantage {advantage:+.2f}  tokens {tokens:2d}  {reply!r}")
    else:
        raise SystemExit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
