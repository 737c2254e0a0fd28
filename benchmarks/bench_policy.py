"""Policy compute, side by side in one run: what the output layer only at response positions, the two-row
readout and bf16 autocast buy over the plain full-logits way (docs/DESIGN.md#cpu-compute).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/bench_policy.py [--device cuda] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402  (after the OpenMP setting)

from trainer_client.policy import Policy, TokenBatch, TurnSample, build_tiny_checkpoint  # noqa: E402
from trainer_client.policy.qwen import QWEN25_TOKENIZER_SIZE, build_random_qwen25_checkpoint  # noqa: E402


def full_logits_way(policy: Policy, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain way: logits at every position over every row; V read from them, then mask, log_softmax
    and gather."""
    logits = policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    rows = torch.arange(len(logits), device=logits.device)
    values = logits[rows, batch.v_positions, policy.value_ids[0]]
    log_probs = torch.log_softmax(logits.masked_fill(policy_mask(policy, logits), float("-inf")), -1)
    token_log_probs = log_probs[rows[:, None], batch.predicting_positions].gather(-1, batch.response_ids[..., None])
    return token_log_probs.squeeze(-1) * batch.response_mask, values


def policy_mask(policy: Policy, logits: torch.Tensor) -> torch.Tensor:
    """[V] bool, True on the ids outside the policy's vocabulary."""
    return torch.arange(logits.shape[-1], device=logits.device) >= policy.n_policy_tokens


def policy_way(policy: Policy, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
    out = policy(batch)
    return out.log_probs, out.values


def seconds(step, repeats: int) -> float:
    step()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def train_step(way, policy: Policy, batch: TokenBatch):
    def step():
        log_probs, values = way(policy, batch)
        (log_probs.sum() + values.sum()).backward()
        policy.zero_grad(set_to_none=True)
    return step


def readout_step(way, policy: Policy, batch: TokenBatch):
    def step():
        with torch.no_grad():
            way(policy, batch)
    return step


def random_batch(n: int, prompt_len: int, response_len: int, n_tokens: int, seed: int = 0) -> TokenBatch:
    g = torch.Generator().manual_seed(seed)
    samples = [TurnSample(torch.randint(3, n_tokens, (prompt_len,), generator=g).tolist(),
                          torch.randint(3, n_tokens, (response_len,), generator=g).tolist()) for _ in range(n)]
    return TokenBatch.from_samples(samples, pad_id=0)


def models(device: str, workdir: str) -> dict[str, tuple[Policy, TokenBatch]]:
    """The tiny CPU default (h128 L2) and a Qwen2.5-vocabulary model (151,936 rows) at h64 L1."""
    words = "you are in the kitchen go to desk take mug from shelf put it in drawer open close".split()
    texts = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 20
    tiny = Policy.load(build_tiny_checkpoint(texts, f"{workdir}/tiny", size="tiny"), device=device)
    qwen_dir = build_random_qwen25_checkpoint(f"{workdir}/qwen", "1.5b", hidden_size=64, num_hidden_layers=1,
                                              num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
    qwen = Policy.load(qwen_dir, device=device)
    return {
        "tiny h128L2 (16 x 200+16 tok)": (tiny, random_batch(16, 200, 16, len(tiny.tokenizer)).to(device)),
        "qwen-vocab h64L1 (8 x 120+16 tok)": (qwen, random_batch(8, 120, 16, QWEN25_TOKENIZER_SIZE).to(device)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        for name, (policy, batch) in models(args.device, workdir).items():
            plain = seconds(train_step(full_logits_way, policy, batch), args.repeats)
            ours = seconds(train_step(policy_way, policy, batch), args.repeats)
            plain_readout = seconds(readout_step(full_logits_way, policy, batch), args.repeats)
            ours_readout = seconds(readout_step(policy_way, policy, batch), args.repeats)
            policy.use_bf16_autocast = True
            ours_bf16 = seconds(train_step(policy_way, policy, batch), args.repeats)
            policy.use_bf16_autocast = False
            results[name] = {
                "fwd+bwd full logits s": plain, "fwd+bwd response-only s": ours,
                "fwd+bwd response-only bf16 s": ours_bf16,
                "no-grad full logits s": plain_readout, "no-grad response-only s": ours_readout,
                "speed-up response-only": plain / ours, "speed-up bf16 autocast": ours / ours_bf16,
                "speed-up no-grad": plain_readout / ours_readout,
            }
    for name, row in results.items():
        print(name)
        for key, value in row.items():
            print(f"  {key:32s} {value:8.3f}")
    print(json.dumps({"device": args.device, "threads": args.threads, "results": results}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
