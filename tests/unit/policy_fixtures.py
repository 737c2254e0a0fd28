"""Shared set-up of the policy, generation and critic tests: toy-env text, a micro checkpoint, turn samples."""

from __future__ import annotations

import pytest
import torch

from env_server.envs.toy import ToyEnv
from trainer_client.policy import Policy, TokenBatch, TurnSample, build_tiny_checkpoint

torch.set_num_threads(2)


def toy_turns(n_tasks: int = 12) -> list[tuple[str, str]]:
    """(observation, expert action) pairs from expert episodes of the toy env."""
    env, turns = ToyEnv(), []
    for task in env.splits()["train"].tasks[:n_tasks]:
        result = env.reset("train", task.task_id)
        while not result.done:
            action = result.info["expert_action"]
            turns.append((f"Your task is to: {result.instruction}. {result.observation}", action))
            result = env.step(action)
    return turns


def tiny_toy_policy(out_dir) -> Policy:
    """The CPU default ("tiny") model, its tokenizer trained on toy-env turns, loaded from a checkpoint in out_dir."""
    checkpoint = build_tiny_checkpoint([text for turn in toy_turns() for text in turn], out_dir, size="tiny")
    torch.manual_seed(0)
    return Policy.load(checkpoint)


def turn_samples(policy: Policy, n: int) -> list[TurnSample]:
    """Step-layout samples: the chat prompt of one observation, the action text + <|im_end|>."""
    tokenizer = policy.tokenizer
    samples = []
    for observation, action in toy_turns()[:n]:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": observation}],
                                               add_generation_prompt=True, return_dict=False)
        response = tokenizer.encode(f"<action>{action}</action>", add_special_tokens=False) + [tokenizer.eos_token_id]
        samples.append(TurnSample(prompt, response))
    return samples


@pytest.fixture(scope="session")
def micro_checkpoint(tmp_path_factory):
    texts = [text for turn in toy_turns() for text in turn]
    return build_tiny_checkpoint(texts, tmp_path_factory.mktemp("micro"), size="micro")


@pytest.fixture
def policy(micro_checkpoint) -> Policy:
    torch.manual_seed(0)
    return Policy.load(micro_checkpoint)


def train_value_rows(policy: Policy, samples: list[TurnSample], target: float, steps: int = 30) -> None:
    """Fit V and Q towards `target` with large Adam steps on the rows alone, then write them back
    into the output layer: the reserved logits become large wherever the hidden states look alike."""
    batch = TokenBatch.from_samples(samples, policy.tokenizer.pad_token_id)
    optimizer = torch.optim.Adam([policy.value_rows], lr=1.0)
    for _ in range(steps):
        out = policy(batch)
        loss = ((out.values - target) ** 2).mean() + ((out.q_values - target) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    policy.write_value_rows()
