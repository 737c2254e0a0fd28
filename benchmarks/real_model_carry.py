"""How `make real-model` (benchmarks/real_model.py) goes on from a fresh machine: its products packed small enough
to commit (benchmarks/run_carry.py), and taken up again.

A session here may end on a machine that holds only what was committed, while the run takes many sessions. So the
SFT start and every carry_every-th RL checkpoint are packed into `carry_dir` (by default inside the measurements,
committed with them) as LoRA adapters rounded to bf16, a few MB each, whose merge into their base is the same on
any machine (trainer_client.policy.lora.LoraLinear.merged_weight). What a carry does not hold:
- Adam's moments: an RL run taken up from a carry starts them afresh (stages.json `rl.carried` lists where);
- the fp32 digits of the RL adapters below bf16's: the carried checkpoint is the rounded one (its digest records
  the rounded weights). On the machine that made it, a run resumes from its own checkpoints exactly.
A full-weight SFT start (lora.r = 0) is packed as its changed weights (57 MB for 8 SmolLM2 layers): too large to
commit, so such a run carries only to a `carry_dir` outside the repository that outlives the machine.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from benchlib import kernel_identity
from real_model_results import curve_points
from run_carry import pack, unpack
from trainer_client.checkpoints import checkpoint_index
from trainer_client.policy import Policy
from trainer_client.policy.lora import LoraConfig
from trainer_client.policy.model import ADAPTERS_FILE

RL_PACKS = "rl"
LATEST = "latest"


def merge_from(base: Path, lora: LoraConfig, trainable_layers: int, dtype: torch.dtype) -> Callable[[Path], None]:
    """Writes a LoRA policy folder's merged weights from `base` and the adapters saved in that folder."""
    def derive(folder: Path) -> None:
        Policy.load(base, lora=lora, trainable_layers=trainable_layers, adapters_from=folder, dtype=dtype).save(folder)
    return derive


def round_adapters_file(folder: Path) -> None:
    """The folder's saved adapters and value rows rounded to bf16 (kept in their dtype)."""
    path = folder / ADAPTERS_FILE
    tensors = load_file(path)
    save_file({n: t.to(torch.bfloat16).to(t.dtype) for n, t in tensors.items()}, path, metadata={"format": "pt"})


def carried_packs(packs: Path) -> list[Path]:
    """The RL checkpoints packed in `packs` (iter_NNNNNN folders; not one a kill left half-written)."""
    return sorted(p for p in packs.iterdir() if p.is_dir() and p.name.removeprefix("iter_").isdigit())


def kept_packs(iterations: Sequence[int], latest: int, curve_every: int) -> list[int]:
    """The carried RL iterations worth keeping: the latest and those the held-out curve reads."""
    points = curve_points([(0, None)] + [(i, None) for i in sorted(set(iterations) | {latest})], curve_every)
    return sorted({i for i, _ in points if i} | {latest})


class CarriedStages:
    """Run's carrying half (it holds cfg, rl_cfg, out, stages, carry, model_dir and the stage bookkeeping)."""

    def sft_merge(self) -> Callable[[Path], None] | None:
        settings = self.cfg.sft
        return (merge_from(self.model_dir, settings.lora, settings.trainable_layers, torch.float32)
                if settings.lora.enabled else None)

    def rl_merge(self) -> Callable[[Path], None]:
        model = self.rl_cfg.model
        return merge_from(self.out / "sft", model.lora, model.trainable_layers, getattr(torch, model.dtype))

    def carry_sft(self) -> None:
        """Pack the SFT start; unpack it here at once, so a pack that would not rebuild it fails now."""
        if self.carry is None:
            return
        pack(self.out / "sft", self.model_dir, self.carry / "sft", keep_weights=not self.cfg.sft.lora.enabled)
        check = self.out / "sft_unpacked"
        unpack(self.carry / "sft", self.model_dir, check, derive_weights=self.sft_merge())
        shutil.rmtree(check)

    def restore(self) -> None:
        """On a machine holding none of this run (a new session's), take up the committed stage clock and outcomes,
        and from carry_dir the SFT start and the carried RL checkpoints. A finished stage whose product
        was not carried runs again (train_sft checks that it makes the same model)."""
        measured = self.repo / self.cfg.measurements_dir
        if self.stages_file.exists() or not (measured / "stages.json").exists():
            return
        self.stages = json.loads((measured / "stages.json").read_text())
        for source in sorted((measured / "outcomes").glob("*.jsonl")):
            self.outcomes_file(source.stem).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, self.outcomes_file(source.stem))
        if self.carry and (self.carry / "sft").is_dir():
            unpack(self.carry / "sft", self.model_dir, self.out / "sft", derive_weights=self.sft_merge())
            self.note(f"restored the SFT start from {self.carry / 'sft'}")
        elif self.done("sft"):
            self.stages["lost"] = {stage: self.stages.pop(stage) for stage in ("expert", "sft")}
            self.note("[yellow]the SFT start was not carried to this machine: expert play and SFT run again")
        packs = self.carry / RL_PACKS if self.carry else None
        if packs and (packs / LATEST).is_file() and "lost" not in self.stages:
            latest = (packs / LATEST).read_text().strip()
            for folder in carried_packs(packs):
                self.unpack_rl(folder, latest=folder.name == latest)
        self.save_stages()

    def check_redone_sft(self, losses: Sequence[float]) -> None:
        """SFT ran again after its product was lost: the evaluation of the lost start stands only if the new
        start is the same model (its first loss and last-ten mean equal, to the last bit); otherwise it is set aside and runs again."""
        lost = self.stages.pop("lost", {}).get("sft")
        if lost is None:
            return
        same = lost["loss_first"] == losses[0] and lost["loss_last"] == sum(losses[-10:]) / len(losses[-10:])
        # Same code and data on another machine of the same kind has come out different in the last bits.
        machine = "unknown" if "machine" not in lost else "same" if lost["machine"] == kernel_identity() else "another"
        self.stages["sft"]["redone"] = {"same_losses": same, "lost_seconds": lost["seconds"], "machine": machine}
        if not same and self.outcomes_file("sft").exists():
            self.outcomes_file("sft").rename(self.outcomes_file("sft_of_lost_start"))
            committed = self.repo / self.cfg.measurements_dir / "outcomes" / "sft.jsonl"
            if committed.exists():   # else a fresh machine would take up the lost start's outcomes
                committed.unlink()
                self.removed.append(committed)
            self.stages.pop("eval_sft", None)
        self.note(f"SFT ran again: {'the same' if same else '[yellow]a different'} model "
                  f"(loss {losses[0]} vs {lost['loss_first']}; the lost start's machine: {machine})")
        self.save_stages()

    def carry_rl(self, checkpoint: Path, now: bool = False) -> None:
        """Pack an RL checkpoint (its adapters rounded to bf16, where its sampler stands and the run's logs; the
        merged weights are made again from the SFT start) into carry_dir/rl: every carry_every-th iteration, the
        last, or `now`; then publish, which commits it with the measurements."""
        iteration = checkpoint_index(checkpoint)
        if not now:
            clock = time.perf_counter()
            self.add_time("rl", clock - self.rl_clock)
            self.rl_clock = clock
        due = now or (iteration + 1) % self.cfg.carry_every == 0 or iteration + 1 == self.rl_cfg.iterations
        if self.carry is None or not due:
            return
        if not self.rl_cfg.model.lora.enabled:
            raise ValueError("carrying RL needs model.lora in the RL preset (a full-weight checkpoint is too large)")
        packs = self.carry / RL_PACKS
        staged = packs / f"{checkpoint.name}.tmp"
        shutil.rmtree(staged, ignore_errors=True)
        rounded = self.out / "rl_carry_rounded"
        shutil.rmtree(rounded, ignore_errors=True)
        shutil.copytree(checkpoint / "policy", rounded)
        round_adapters_file(rounded)
        self.rl_merge()(rounded)
        pack(rounded, self.out / "sft", staged / "policy", keep_weights=False)
        shutil.rmtree(rounded)
        state = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
        torch.save({k: state[k] for k in ("iteration", "sampler_position", "sampler_readout_exact")},
                   staged / "trainer_state.pt")
        (staged / "run").mkdir()
        for path in checkpoint.parents[1].iterdir():
            if path.is_file() and path.suffix != ".log":
                shutil.copy2(path, staged / "run" / path.name)
        shutil.rmtree(packs / checkpoint.name, ignore_errors=True)
        staged.rename(packs / checkpoint.name)
        (packs / LATEST).write_text(checkpoint.name)
        carried = {checkpoint_index(p): p for p in carried_packs(packs)}
        for old in set(carried) - set(kept_packs(list(carried), iteration, self.cfg.curve_every)):
            self.removed.extend(p for p in carried[old].rglob("*") if p.is_file())
            shutil.rmtree(carried[old])
        self.note(f"RL iteration {iteration + 1} carried to {packs / checkpoint.name}")
        self.publish(f"Real model (issue 34): RL iteration {iteration + 1} carried")

    def unpack_rl(self, packed: Path, latest: bool) -> Path:
        """A carried RL checkpoint into the run dir; the latest also brings the sampler's place and the logs."""
        run_dir = self.out / "rl"
        checkpoint = run_dir / "checkpoints" / packed.name
        checkpoint.mkdir(parents=True, exist_ok=True)
        unpack(packed / "policy", self.out / "sft", checkpoint / "policy", derive_weights=self.rl_merge())
        if latest:
            for path in (packed / "run").iterdir():
                shutil.copy2(path, run_dir / path.name)
            shutil.copy2(packed / "trainer_state.pt", checkpoint / "trainer_state.pt")
            (run_dir / "checkpoints" / LATEST).write_text(checkpoint.name)
            iteration = checkpoint_index(packed)
            self.stages.setdefault("rl", {"seconds": 0.0}).setdefault("carried", []).append(
                {"from_iteration": iteration + 1, "adam_moments": "fresh", "machine": kernel_identity()["cpu"]})
            self.note(f"restored RL checkpoint {packed.name} from {packed.parent} (Adam's moments start afresh)")
        return checkpoint
