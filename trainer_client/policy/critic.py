"""The separate critic of the `ppo_critic` baseline: the policy's backbone, its own copy, and a scalar head.

As verl-agent runs PPO (docs/DESIGN.md#the-baselines-as-run): a second full model loaded from the same
checkpoint, trained by its own optimizer (lr 1e-5 there). The head starts at zero, so V = 0 at first,
as with the boundary readout.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import AutoModel, PreTrainedModel

from trainer_client.policy.token_batch import TokenBatch
from trainer_client.policy.model import bf16_autocast, final_hidden_states, gather_positions, prepare_backbone

VALUE_HEAD_FILE = "value_head.safetensors"


class Critic(nn.Module):
    """Backbone (no output layer) + `value_head` (H -> 1, fp32). Optimize it on its own, e.g.
    `torch.optim.AdamW(critic.parameters(), lr=1e-5)`."""

    def __init__(self, backbone: PreTrainedModel, value_head: nn.Linear, use_bf16_autocast: bool = False) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = value_head
        self.use_bf16_autocast = use_bf16_autocast

    @classmethod
    def load(cls, name_or_path: str | Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
             use_bf16_autocast: bool = False, gradient_checkpointing: bool = False) -> Critic:
        """The backbone of a causal-LM checkpoint (its output layer is not loaded), plus the value head
        saved beside it by `Critic.save`, or a zero head."""
        if Path(name_or_path).expanduser().exists():   # a local dir, `~` as Policy.load takes it
            name_or_path = Path(name_or_path).expanduser()
        backbone = AutoModel.from_pretrained(name_or_path, dtype=dtype)
        value_head = nn.Linear(backbone.get_input_embeddings().weight.shape[1], 1, dtype=torch.float32)
        head_file = Path(name_or_path) / VALUE_HEAD_FILE
        if head_file.is_file():
            value_head.load_state_dict(load_file(head_file))
        else:
            nn.init.zeros_(value_head.weight)
            nn.init.zeros_(value_head.bias)
        prepare_backbone(backbone, device, gradient_checkpointing)
        return cls(backbone, value_head.to(device), use_bf16_autocast)

    @property
    def device(self) -> torch.device:
        return self.value_head.weight.device

    def forward(self, batch: TokenBatch) -> Tensor:
        """[N, L] fp32: the value at each position that predicts a response token, 0 on padding.

        Column 0 is the turn-boundary value V(s_t) at the last prompt token; columns 0..R-1 are
        verl's token-level values (`values[:, -R-1:-1]`).
        """
        batch = batch.to(self.device)
        with bf16_autocast(self.device, self.use_bf16_autocast):
            hidden = final_hidden_states(self.backbone, batch)                       # [N, T, H]
        predicting = gather_positions(hidden, batch.predicting_positions).float()   # [N, L, H]
        return self.value_head(predicting).squeeze(-1) * batch.response_mask

    def save(self, out_dir: str | Path) -> Path:
        """The backbone as an HF base-model checkpoint, and the head in value_head.safetensors."""
        out_dir = Path(out_dir)
        self.backbone.save_pretrained(out_dir)
        save_file({k: v.contiguous() for k, v in self.value_head.state_dict().items()}, out_dir / VALUE_HEAD_FILE)
        return out_dir
