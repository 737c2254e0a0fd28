"""Build a tiny random-init Qwen2ForCausalLM checkpoint with a tokenizer trained on the given texts.

The CPU default for the demo and tests (docs/DESIGN.md#cpu-compute): hidden 128, 2 layers, ~0.6-0.75M
parameters depending on the tokenizer's size. It loads through the same `Policy.load` as Qwen2.5.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from trainer_client.policy.model import padded_vocab_rows
from trainer_client.policy.tokenizer import train_tokenizer


@dataclass(frozen=True)
class TinySize:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int


TINY_SIZES = {
    "micro": TinySize(64, 1, 4, 2, 256),    # unit tests
    "tiny": TinySize(128, 2, 4, 2, 512),    # the CPU default: two layers is the least that copies tokens
    "small": TinySize(128, 4, 4, 2, 512),   # ~1.25M: about twice the time of "tiny"
}


def tiny_config(size: str, tokenizer, max_position_embeddings: int = 2048) -> Qwen2Config:
    """Tied embeddings, and output rows for the tokenizer plus the two value ids (multiple of 64)."""
    if size not in TINY_SIZES:
        raise ValueError(f"unknown tiny size {size!r}; known: {sorted(TINY_SIZES)}")
    return Qwen2Config(
        **asdict(TINY_SIZES[size]),
        vocab_size=padded_vocab_rows(len(tokenizer)),
        tie_word_embeddings=True,
        max_position_embeddings=max_position_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_tiny_checkpoint(texts: Iterable[str], out_dir: str | Path, size: str = "tiny",
                          vocab_size: int = 2048, seed: int = 0, whole_words: Iterable[str] = ()) -> Path:
    """Train a tokenizer on `texts` (`whole_words` as single tokens), build a random-init model of `size`, save
    both to `out_dir`."""
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size, whole_words=whole_words)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(tiny_config(size, tokenizer))
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
