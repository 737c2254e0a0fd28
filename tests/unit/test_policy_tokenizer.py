"""The trained tokenizer, our ChatML template, boundary finding, and the tiny checkpoint's size."""

from __future__ import annotations

import pytest
import torch
from jinja2.exceptions import TemplateError
from policy_fixtures import toy_turns
from transformers import AutoTokenizer, Qwen2ForCausalLM

from trainer_client.policy import Policy, assistant_turns, build_tiny_checkpoint, stop_token_ids, train_tokenizer
from trainer_client.policy.chat import find_assistant_turns
from trainer_client.policy.model import padded_vocab_rows
from trainer_client.policy.tiny import TINY_SIZES
from trainer_client.policy.tokenizer import words_matching

TEXTS = [text for turn in toy_turns() for text in turn]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS)


def test_special_tokens_are_single_ids_with_qwen_names(tokenizer):
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|><|endoftext|>", add_special_tokens=False)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in ids and tokenizer.pad_token_id in ids
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert stop_token_ids(tokenizer) == (tokenizer.convert_tokens_to_ids("<|im_end|>"),)


def test_any_text_round_trips(tokenizer):
    text = "Unseen wörds: 42 × ☃ <action>go to cellar</action>"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_template_renders_chatml_without_a_default_system_prompt(tokenizer):
    messages = [{"role": "user", "content": "look"}, {"role": "assistant", "content": "go north"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == (
        "<|im_start|>user\nlook<|im_end|>\n<|im_start|>assistant\ngo north<|im_end|>\n")
    with_system = [{"role": "system", "content": "Be brief."}, messages[0]]
    assert tokenizer.apply_chat_template(with_system, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nlook<|im_end|>\n<|im_start|>assistant\n")


def test_template_refuses_what_it_cannot_render(tokenizer):
    with pytest.raises(TemplateError, match="unsupported chat role"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)
    with pytest.raises(TemplateError, match="tools"):
        tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tools=[{"name": "f"}], tokenize=False)


def test_tokenizer_and_template_survive_save_and_reload(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(reloaded) == len(tokenizer) and reloaded.chat_template == tokenizer.chat_template
    assert reloaded.encode(TEXTS[0]) == tokenizer.encode(TEXTS[0])


def test_find_assistant_turns_hand_case():
    header, end = [7, 8], 9
    ids = [1, 2, 9, 7, 8, 5, 5, 9, 3, 9, 7, 8, 6, 9, 7, 8]   # two turns, then a generation prompt
    assert find_assistant_turns(ids, header, end) == [(4, 7), (11, 13)]
    assert find_assistant_turns([7, 8, 5, 5], header, end) == [(1, 3)]   # a cut response ends at the last token
    assert find_assistant_turns([1, 2, 3], header, end) == []


def test_assistant_turns_through_the_template(tokenizer):
    messages = [{"role": "user", "content": "look"}, {"role": "assistant", "content": "go north"},
                {"role": "user", "content": "You arrive."}, {"role": "assistant", "content": "take key"}]
    ids = tokenizer.apply_chat_template(messages, return_dict=False)
    turns = assistant_turns(ids, tokenizer)
    assert len(turns) == 2
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for (v, q), reply in zip(turns, ("go north", "take key")):
        assert tokenizer.decode(ids[:v + 1]).endswith("<|im_start|>assistant\n")
        assert ids[q] == im_end
        assert tokenizer.decode(ids[v + 1:q]) == reply


def test_tiny_checkpoint_size_and_loading(tmp_path):
    out = build_tiny_checkpoint(TEXTS, tmp_path, size="tiny")
    model = Qwen2ForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    size = TINY_SIZES["tiny"]
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (size.hidden_size, size.num_hidden_layers)
    assert model.config.tie_word_embeddings and model.config.vocab_size == padded_vocab_rows(len(tokenizer))
    n_params = sum(p.numel() for p in model.parameters())
    n_embedding = model.config.vocab_size * size.hidden_size
    # 0.49M in the two layers plus the (tied) embedding; ~0.75M at a 2,048-token vocabulary.
    assert n_params - n_embedding == 492_672
    assert 0.5e6 < n_params < 1.0e6
    policy = Policy.load(out)
    assert policy.value_ids == (len(tokenizer), len(tokenizer) + 1)
    assert torch.equal(policy.value_rows, torch.zeros(2, size.hidden_size))


def test_a_saved_tiny_checkpoint_tokenizes_exactly_as_trained(tmp_path):
    """The checkpoint loads as Qwen2Tokenizer, which applies Qwen2's pre-tokenization: merges learned under
    any other would go unused (digits and words would fall apart into single bytes)."""
    trained = train_tokenizer(TEXTS)
    loaded = Policy.load(build_tiny_checkpoint(TEXTS, tmp_path / "ckpt", size="micro")).tokenizer
    header = "<|im_start|>assistant\n"
    for text in [*TEXTS[:20], "go to cabinet 12, then the countertop 3.", header]:
        assert loaded.encode(text, add_special_tokens=False) == trained.encode(text, add_special_tokens=False)
    assert len(trained.tokenize("assistant")) == 1   # the template's role names are whole tokens


def test_whole_words_are_single_tokens_after_a_save_and_load(tmp_path):
    texts = ["back to search | s000000583 | lumen pillow | s000000584 | orchard pillow", "click[s000000583]"] * 4
    whole_words = words_matching(texts, r"\bs\d{9}\b")   # the WebShop presets' whole_word_pattern
    assert whole_words == {"s000000583", "s000000584"} and words_matching(texts, "") == set()
    loaded = Policy.load(build_tiny_checkpoint(texts, tmp_path / "ckpt", size="micro", whole_words=whole_words)).tokenizer
    reply = loaded.encode("click[s000000584]", add_special_tokens=False)
    assert loaded.convert_ids_to_tokens(reply) == ["click", "[", "s000000584", "]"]
    assert loaded.decode(reply) == "click[s000000584]"
    # Without them, an id is a letter and nine digits, each its own piece.
    assert len(train_tokenizer(texts).tokenize("s000000584")) == 10
