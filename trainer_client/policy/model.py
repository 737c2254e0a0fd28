"""The policy: a causal LM whose two spare output rows are read as values at the turn boundaries.

V(s_t) is the logit of id_V at the last prompt token, Q(s_t, a_t) the logit of id_Q at the last
response token (docs/DESIGN.md#the-method). The two rows live in a separate fp32 parameter with its
own learning rate and are written back into the output layer on save, so a checkpoint stays plain HF.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.masking_utils import create_causal_mask

from trainer_client.policy.lora import (
    LoraConfig, adapter_state, adapters_disabled, add_adapters, decoder_layers, first_trainable_layer,
    freeze_below, has_adapters, merged_state_dict,
)
from trainer_client.policy.token_batch import TokenBatch
from trainer_client.policy.logits import entropy_from_log_probs, policy_log_probs

VALUE_IDS_CONFIG_KEY = "limen_value_ids"  # in config.json: the checkpoint's output rows hold trained values
ADAPTERS_FILE = "adapters.safetensors"    # beside a LoRA policy's merged weights: what resuming it needs
ROWS_MULTIPLE = 64


def choose_value_ids(n_policy_tokens: int, n_output_rows: int) -> tuple[int, int] | None:
    """(id_V, id_Q): the first two output rows no token uses, or None when fewer than two are spare."""
    if n_output_rows - n_policy_tokens < 2:
        return None
    return n_policy_tokens, n_policy_tokens + 1


def padded_vocab_rows(n_policy_tokens: int) -> int:
    """Output rows for a vocabulary plus the two value ids, rounded up to a multiple of 64."""
    return math.ceil((n_policy_tokens + 2) / ROWS_MULTIPLE) * ROWS_MULTIPLE


def add_value_rows(model: PreTrainedModel, n_policy_tokens: int) -> None:
    """Grow the embedding and output layer (tied or not) to `padded_vocab_rows`, the new rows zero.

    For a model whose vocabulary fills its output layer (SmolLM2: 49,152 of 49,152). Zero rows make the
    reserved logits equal the initial V = Q = 0 from the start, where mean-resizing would put random rows there.
    """
    model.resize_token_embeddings(padded_vocab_rows(n_policy_tokens), mean_resizing=False)
    with torch.no_grad():
        model.get_input_embeddings().weight[n_policy_tokens:] = 0
        model.get_output_embeddings().weight[n_policy_tokens:] = 0


def expand_user(name_or_path: str | Path) -> str | Path:
    """A leading `~` expanded (presets name the model cache as ~/.cache/limen/models/...); hub names unchanged."""
    return os.path.expanduser(name_or_path) if str(name_or_path).startswith("~") else name_or_path


def bf16_autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast for the backbone (1.5-1.9x on this CPU's avx512_bf16); fp32 master weights stay."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def prepare_backbone(model: PreTrainedModel, device: str | torch.device, gradient_checkpointing: bool) -> None:
    """Move to device; optionally recompute activations in backward to trade compute for memory."""
    model.to(device)
    if gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:  # transformers 5.17-5.19 (vLLM 0.32's pin) has only the older name
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def final_hidden_states(backbone: nn.Module, batch: TokenBatch) -> Tensor:
    """[N, T, H]: the last (post-norm) hidden states; no vocabulary projection."""
    return backbone(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).last_hidden_state


def run_decoder_layers(backbone: nn.Module, hidden: Tensor, attention_mask: Tensor, first: int,
                       last: int | None = None) -> Tensor:
    """Decoder layers first..last-1 of a Llama/Qwen2 backbone on hidden states [N, T, H] of a right-padded batch,
    as the backbone's own forward runs them (positions 0..T-1, causal mask with padding). Split in two at any
    layer, trunk then top gives what the whole forward gives (tests/unit/test_lora.py)."""
    if getattr(backbone, "has_sliding_layers", False):
        raise ValueError("trainable_layers does not support sliding-window attention layers")
    position_ids = torch.arange(hidden.shape[1], device=hidden.device)[None]
    mask = create_causal_mask(backbone.config, hidden, attention_mask, None, position_ids=position_ids)
    position_embeddings = backbone.rotary_emb(hidden, position_ids)
    for layer in list(backbone.layers)[first:last]:
        hidden = layer(hidden, attention_mask=mask, position_embeddings=position_embeddings,
                       position_ids=position_ids, use_cache=False)
    return hidden


def gather_positions(hidden: Tensor, positions: Tensor) -> Tensor:
    """hidden [N, T, H], positions [N, K] -> [N, K, H]."""
    rows = torch.arange(hidden.shape[0], device=hidden.device)[:, None]
    return hidden[rows, positions]


@dataclass(frozen=True)
class PolicyOutput:
    """What one forward over a TokenBatch gives (N samples, L = longest response)."""
    log_probs: Tensor      # [N, L] fp32: log pi(token | prefix) of each response token, 0 on padding
    entropy: Tensor        # [N, L] fp32: entropy of pi at each response token, 0 on padding
    response_mask: Tensor  # [N, L] bool: True on real response tokens
    values: Tensor         # [N] fp32: V(s_t), read at the last prompt token
    q_values: Tensor       # [N] fp32: Q(s_t, a_t), read at the last response token


class Policy(nn.Module):
    """A causal LM (Qwen2 family, or any with a bias-free output layer) plus its two value rows.

    Parameters: `model` (backbone and output layer, trained at the policy lr) and `value_rows`
    ([2, H] fp32: row 0 reads V, row 1 reads Q; their own lr). Ids >= len(tokenizer) are outside
    the policy's vocabulary everywhere: never sampled, out of every log-prob and entropy.
    """

    def __init__(self, model: PreTrainedModel, tokenizer, value_ids: tuple[int, int], value_rows: Tensor,
                 use_bf16_autocast: bool = False, trunk_layers: int = 0) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.n_policy_tokens = len(tokenizer)
        if min(value_ids) < self.n_policy_tokens:
            raise ValueError(f"value ids {value_ids} collide with the tokenizer's {self.n_policy_tokens} ids")
        self.value_ids = value_ids
        self.value_rows = nn.Parameter(value_rows.detach().to(torch.float32).clone())
        self.use_bf16_autocast = use_bf16_autocast
        self.trunk_layers = trunk_layers
        """Decoder layers at the bottom that never train: their output for a sample can be computed once
        (`trunk_features`) and fed to later passes in TokenBatch.trunk. 0: the whole model trains."""

    @classmethod
    def load(cls, name_or_path: str | Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
             use_bf16_autocast: bool = False, gradient_checkpointing: bool = False,
             chat_template: str | None = None, tokenizer=None, lora: LoraConfig = LoraConfig(),
             trainable_layers: int = 0, adapters_from: str | Path | None = None) -> Policy:
        """Load a checkpoint (hub name or local dir) with its tokenizer and chat template.

        A checkpoint saved by `Policy.save` carries its value ids in config.json and its trained
        rows in the output layer; any other starts with V = Q = 0 (zero rows) on the first two
        spare output rows, resizing the embedding only when fewer than two are spare.
        Pass `tokenizer` to reuse one already loaded (Qwen2.5's takes seconds to parse).

        `lora` adds adapters (to the top `trainable_layers` decoder layers, or to all with 0) and freezes the
        rest; without LoRA, `trainable_layers` > 0 freezes all but the top layers. `adapters_from`: a LoRA
        policy folder saved by `save` whose adapters and value rows replace the fresh ones (resuming a run
        from its base checkpoint, exactly).
        """
        name_or_path = expand_user(name_or_path)
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        if not tokenizer.chat_template:
            raise ValueError(f"{name_or_path} has no chat template; pass chat_template= (e.g. QWEN25_CHAT_TEMPLATE)")
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype)
        output_layer = model.get_output_embeddings()
        if output_layer is None or getattr(output_layer, "bias", None) is not None:
            raise ValueError(f"{type(model).__name__} needs a bias-free output layer for the value readout")

        saved_ids = getattr(model.config, VALUE_IDS_CONFIG_KEY, None)
        if saved_ids is not None:
            value_ids = (int(saved_ids[0]), int(saved_ids[1]))
            value_rows = output_layer.weight[list(value_ids)]
        else:
            value_ids = choose_value_ids(len(tokenizer), output_layer.weight.shape[0])
            if value_ids is None:
                add_value_rows(model, len(tokenizer))
                value_ids = (len(tokenizer), len(tokenizer) + 1)
            value_rows = torch.zeros(2, output_layer.weight.shape[1])
        model.config.update({VALUE_IDS_CONFIG_KEY: list(value_ids)})
        first_trained = first_trainable_layer(len(decoder_layers(model)), trainable_layers)
        if lora.enabled:
            model.requires_grad_(False)
            add_adapters(model, lora, first_trained)
        else:
            freeze_below(model, trainable_layers)
        if adapters_from is not None:
            value_rows = load_adapters(model, Path(expand_user(adapters_from)))
        prepare_backbone(model, device, gradient_checkpointing)
        return cls(model, tokenizer, value_ids, value_rows.to(device), use_bf16_autocast, first_trained)

    @property
    def device(self) -> torch.device:
        return self.value_rows.device

    @property
    def output_weight(self) -> Tensor:
        """[rows, H]: the output layer (tied to the input embedding in Qwen2.5-1.5B, not in 7B)."""
        return self.model.get_output_embeddings().weight

    def trainable_model_parameters(self) -> list[nn.Parameter]:
        """What learns at the policy lr: every model parameter, or the adapters / top layers alone."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def parameter_groups(self, lr: float, value_lr: float, weight_decay: float = 0.0) -> list[dict]:
        """Optimizer groups: the model at `lr`, the two value rows at `value_lr`, no decay on the rows.

        A separate group is what gives the rows their own step size under Adam (scaling their
        gradient inside the shared output layer would cancel out).
        """
        return [
            {"name": "backbone", "params": self.trainable_model_parameters(), "lr": lr,
             "weight_decay": weight_decay},
            {"name": "value_rows", "params": [self.value_rows], "lr": value_lr, "weight_decay": 0.0},
        ]

    @torch.no_grad()
    def trunk_features(self, batch: TokenBatch) -> Tensor:
        """[N, T, H]: the output of the frozen bottom `trunk_layers` (the residual stream's dtype: fp32 with fp32
        weights, under autocast too), which a later forward takes in `batch.trunk` instead of recomputing it."""
        if not self.trunk_layers:
            raise ValueError("this policy trains every layer: it has no frozen trunk to cache")
        batch = batch.to(self.device)
        backbone = self.model.base_model
        with bf16_autocast(self.device, self.use_bf16_autocast):
            return run_decoder_layers(backbone, backbone.embed_tokens(batch.input_ids), batch.attention_mask,
                                      0, self.trunk_layers)

    def hidden_states(self, batch: TokenBatch) -> Tensor:
        """[N, T, H] final (post-norm) hidden states: the whole backbone, or its top layers from batch.trunk."""
        backbone = self.model.base_model
        if batch.trunk is None:
            return final_hidden_states(backbone, batch)
        if not self.trunk_layers:
            raise ValueError("a batch with trunk features for a policy that trains every layer")
        return backbone.norm(run_decoder_layers(backbone, batch.trunk, batch.attention_mask, self.trunk_layers))

    def forward(self, batch: TokenBatch, temperature: float = 1.0, detach_readout: bool = False) -> PolicyOutput:
        """One forward over a micro-batch: log-probs and entropy of the responses, V and Q.

        The output layer is applied only at the positions that predict response tokens, and only
        over the policy's ids; the readout touches only the two value rows, in fp32. With
        `detach_readout`, V and Q see the hidden states as constants: a value loss trains the rows only.
        """
        batch = batch.to(self.device)
        mask = batch.response_mask                                     # [N, L]
        targets = batch.response_ids[mask]                             # [M]
        if int(targets.max()) >= self.n_policy_tokens:
            raise ValueError("a response holds an id outside the policy's vocabulary (a value id?)")
        with bf16_autocast(self.device, self.use_bf16_autocast):
            hidden = self.hidden_states(batch)                                          # [N, T, H]
            predicting = gather_positions(hidden, batch.predicting_positions)[mask]      # [M, H]
            logits = F.linear(predicting, self.output_weight[:self.n_policy_tokens])    # [M, n]
        log_probs = policy_log_probs(logits, self.n_policy_tokens, temperature)         # [M, n] fp32
        token_log_probs = log_probs.gather(-1, targets[:, None]).squeeze(-1)
        boundaries = torch.stack([batch.v_positions, batch.q_positions], dim=1)
        boundary_hidden = gather_positions(hidden, boundaries).float()                   # [N, 2, H]
        if detach_readout:
            boundary_hidden = boundary_hidden.detach()
        readout = (boundary_hidden * self.value_rows).sum(-1)                            # [N, 2]
        zeros = torch.zeros(mask.shape, device=self.device)
        return PolicyOutput(
            log_probs=zeros.masked_scatter(mask, token_log_probs),
            entropy=zeros.masked_scatter(mask, entropy_from_log_probs(log_probs)),
            response_mask=mask,
            values=readout[:, 0],
            q_values=readout[:, 1],
        )

    @torch.no_grad()
    def write_value_rows(self) -> None:
        """Copy the trained rows into the output layer, so its reserved logits ARE the values."""
        self.output_weight[list(self.value_ids)] = self.value_rows.to(self.output_weight.dtype)

    def plain_state_dict(self) -> dict[str, Tensor]:
        """The weights as a plain HF model of this architecture holds them: adapters merged in, value rows
        written into the output layer (what a checkpoint, the sampler's copy and vLLM receive)."""
        self.write_value_rows()
        return merged_state_dict(self.model) if has_adapters(self.model) else self.model.state_dict()

    def save(self, out_dir: str | Path) -> Path:
        """A plain HF checkpoint (model, tokenizer, chat template); `Policy.load` restores it exactly
        (with bf16 weights, the fp32 rows are rounded to bf16 on the way into the output layer).

        With adapters, the weights are merged (any HF loader reads the folder), and ADAPTERS_FILE beside them
        keeps the adapters and value rows unmerged, so a run resumes from its base exactly (`adapters_from`)."""
        out_dir = Path(out_dir)
        adapted = has_adapters(self.model)
        self.write_value_rows()
        self.model.save_pretrained(out_dir, state_dict=self.plain_state_dict() if adapted else None)
        if adapted:
            from safetensors.torch import save_file
            save_file({**adapter_state(self.model), "value_rows": self.value_rows.detach().clone()},
                      out_dir / ADAPTERS_FILE)
        self.tokenizer.save_pretrained(out_dir)
        return out_dir


class AdaptersOff:
    """The reference policy of a LoRA run: the policy itself with its adapters switched off (its base, the
    run's starting point), so no second copy of the model is held."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.tokenizer = policy.tokenizer

    @torch.no_grad()
    def __call__(self, batch: TokenBatch, temperature: float = 1.0) -> PolicyOutput:
        with adapters_disabled(self.policy.model):
            return self.policy(batch, temperature)


def load_adapters(model: nn.Module, folder: Path) -> Tensor:
    """Put a saved LoRA policy's adapters into `model` (which has the same adapters); returns its value rows."""
    from safetensors.torch import load_file
    path = folder / ADAPTERS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} holds no {ADAPTERS_FILE}: it was not saved from a LoRA policy")
    saved = load_file(path)
    value_rows = saved.pop("value_rows")
    params = dict(model.named_parameters())
    unknown = sorted(set(saved) - set(params))
    missing = sorted(set(adapter_state(model)) - set(saved))
    misshapen = sorted(n for n in set(saved) & set(params) if saved[n].shape != params[n].shape)
    if unknown or missing or misshapen:
        raise ValueError(f"{path} does not fit this model's adapters (unknown {unknown[:3]}, missing {missing[:3]}, "
                         f"other shapes {misshapen[:3]}): "
                         "was it saved with other lora settings?")
    with torch.no_grad():
        for name, tensor in saved.items():
            params[name].copy_(tensor)
    return value_rows
