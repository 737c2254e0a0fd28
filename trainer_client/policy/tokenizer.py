"""Train a small byte-level BPE tokenizer on environment text, wrapped as a transformers tokenizer.

It keeps Qwen2.5's special-token names and ChatML format, so the tiny model runs the same code path
as a real Qwen2.5 checkpoint; only the vocabulary is small (hundreds of ids instead of 151,665).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from trainer_client.policy.chat import ENDOFTEXT, IM_END, IM_START, ROLES, chatml_template

SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)


def words_matching(texts: Iterable[str], pattern: str) -> set[str]:
    """Every match of the regex `pattern` in `texts` (none for ""): the `whole_words` a preset names by pattern."""
    return {word for text in texts for word in re.findall(pattern, text)} if pattern else set()


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048, min_frequency: int = 2,
                    whole_words: Iterable[str] = ()) -> PreTrainedTokenizerFast:
    """A byte-level BPE over `texts` (any text encodes: all 256 bytes are in the alphabet).

    Each of `whole_words` becomes one added token, matched before the digit-splitting pre-tokenizer: a product
    id such as `s000000583` is otherwise ten pieces that share every prefix with the other ids on the page, and a
    tiny model copying it digit by digit has nothing to tell which id it is copying.

    The vocabulary stops growing before `vocab_size` once no pair occurs `min_frequency` times,
    so size the model by `len(tokenizer)`, not by `vocab_size`. eos is `<|im_end|>` and pad is
    `<|endoftext|>`, as in Qwen2.5-Instruct.
    """
    texts = list(texts)
    if not any(texts):
        raise ValueError("train_tokenizer needs at least one non-empty text")
    bpe = Tokenizer(models.BPE())
    # Qwen2's own pre-tokenization (one digit per piece, as Qwen2.5 splits numbers): a checkpoint with
    # model_type qwen2 loads as Qwen2Tokenizer, which applies it, so merges must be learned under it too.
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The chat template's role names ride along, so every message header tokenizes compactly.
    bpe.train_from_iterator(texts + ["\n".join(ROLES)] * min_frequency, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START],
        chat_template=chatml_template(default_system_prompt=None),
    )
    tokenizer.add_tokens(sorted(set(whole_words)))
    return tokenizer
