"""Per-request seeds in TransformersBackend: what they cost, and how often batching still flips a token.

1. Overhead: `generate` with one seed per row (each row's uniforms from its own CPU generator, drawn once
   per call) against unseeded (one draw for the whole batch from torch's global generator); that set-up
   alone (on a loaded machine the whole-call timings are noisier than the difference); and the sampling
   step alone: inverse CDF (what generate uses) against torch.multinomial, at the tiny model's
   vocabulary and at Qwen2.5's 151,665.
2. Padding noise: the same prompts and seeds generated as one batch and again in shuffled batches of 8
   (other neighbours, other left padding). Tokens are compared up to each row's first difference; the
   log-prob gap says how large the float rounding of the batched forward is.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/seeded_sampling.py [--rows 128] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402  (after the OpenMP setting)

from trainer_client.policy import Policy, SamplingConfig, TransformersBackend, build_tiny_checkpoint  # noqa: E402
from trainer_client.policy.generation.base import derive_seed  # noqa: E402
from trainer_client.policy.generation.transformers_backend import inverse_cdf, uniforms_for  # noqa: E402
from trainer_client.policy.logits import policy_log_probs  # noqa: E402


def toy_prompts(policy: Policy, n: int) -> list[tuple[int, ...]]:
    """Chat prompts of toy-env states, of varied length (so a batch is left-padded)."""
    from env_server.envs.toy import ToyEnv
    from trainer_client.prompts import build_prompt

    env, prompts = ToyEnv(), []
    tasks = env.splits()["train"].tasks
    while len(prompts) < n:
        task = tasks[len(prompts) % len(tasks)]
        step = env.reset("train", task.task_id, seed=len(prompts))
        text = build_prompt("toy", step.instruction, step.observation, step.admissible_actions, [], 0)
        text += " " * (len(prompts) % 7)        # more length variety
        prompts.append(tuple(policy.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                                  add_generation_prompt=True, return_dict=False)))
    return prompts


def best_of(fns, repeats: int) -> list[float]:
    """The fastest of `repeats` timings of each function, taken in turns (a shared machine's load hits all)."""
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, kept in zip(fns, times):
            started = time.perf_counter()
            fn()
            kept.append(time.perf_counter() - started)
    return [min(t) for t in times]


def overhead(backend: TransformersBackend, prompts, tokens: int, repeats: int) -> dict:
    # A cut-off no row reaches: every row samples `tokens` tokens in both arms (same forward work).
    never_stops = TransformersBackend(backend.model, backend.n_policy_tokens, stop_ids=(), pad_id=backend.pad_id)
    sampling = SamplingConfig(max_new_tokens=tokens, temperature=1.0)
    seeds = [derive_seed("bench", i) for i in range(len(prompts))]
    never_stops.generate(prompts, sampling)                       # warm-up
    seeded, unseeded = best_of([lambda: never_stops.generate(prompts, sampling, seeds=seeds),
                                lambda: never_stops.generate(prompts, sampling)], repeats)
    return {"rows": len(prompts), "max_new_tokens": tokens, "seeded_s": seeded, "unseeded_s": unseeded,
            "overhead": seeded / unseeded - 1}


def seed_setup(rows: int, steps: int, repeats: int) -> dict:
    """All that seeding adds to a generate call: a generator and a draw per row instead of one draw."""
    seeds = [derive_seed("bench", i) for i in range(rows)]
    seeded, unseeded = best_of([lambda: uniforms_for(rows, steps, seeds), lambda: uniforms_for(rows, steps, None)],
                               repeats * 4)
    return {"rows": rows, "max_new_tokens": steps, "seeded_ms": 1e3 * seeded, "unseeded_ms": 1e3 * unseeded}


def sampling_step(rows: int, vocab: int, repeats: int) -> dict:
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 3
    uniforms = torch.rand(rows, dtype=torch.float64)

    def with_inverse_cdf():
        inverse_cdf(policy_log_probs(logits, vocab).exp(), uniforms)

    def with_multinomial():
        torch.multinomial(policy_log_probs(logits, vocab).exp(), 1)

    inverse, multinomial = best_of([with_inverse_cdf, with_multinomial], repeats)
    return {"rows": rows, "vocab": vocab, "inverse_cdf_ms": 1e3 * inverse, "multinomial_ms": 1e3 * multinomial}


def padding_noise(backend: TransformersBackend, prompts, tokens: int, batch: int) -> dict:
    sampling = SamplingConfig(max_new_tokens=tokens, temperature=1.0)
    seeds = [derive_seed("noise", i) for i in range(len(prompts))]
    together = backend.generate(prompts, sampling, seeds=seeds)
    order = list(range(len(prompts)))
    random.Random(0).shuffle(order)
    apart = {}
    for start in range(0, len(order), batch):
        rows = order[start:start + batch]
        for row, completion in zip(rows, backend.generate([prompts[r] for r in rows], sampling,
                                                          seeds=[seeds[r] for r in rows])):
            apart[row] = completion
    compared, flipped_rows, gap = 0, 0, 0.0
    for row, a in enumerate(together):
        b = apart[row]
        same = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), None)
        length = min(len(a.token_ids), len(b.token_ids)) if same is None else same + 1
        compared += length
        flipped_rows += same is not None or a.token_ids != b.token_ids
        upto = length if same is None else same
        gap = max([gap, *(abs(x - y) for x, y in zip(a.log_probs[:upto], b.log_probs[:upto]))])
    return {"rows": len(prompts), "batch_apart": batch, "tokens_compared": compared, "rows_flipped": flipped_rows,
            "max_log_prob_gap": gap}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="tiny", help="tiny model size: micro, tiny, small")
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--noise-rows", type=int, default=256)
    parser.add_argument("--noise-tokens", type=int, default=64)
    parser.add_argument("--dtype", choices=("float32", "float64", "bfloat16"), default="float32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("LIMEN_BENCH_THREADS", "2")))

    with tempfile.TemporaryDirectory() as tmp:
        from env_server.envs.toy import ToyEnv
        from trainer_client.prompts import build_prompt
        env, texts = ToyEnv(), []
        for task in env.splits()["train"].tasks[:40]:
            step = env.reset("train", task.task_id)
            texts.append(build_prompt("toy", step.instruction, step.observation, step.admissible_actions, [], 0))
        policy = Policy.load(build_tiny_checkpoint(texts, Path(tmp), size=args.size))
    backend = TransformersBackend.from_policy(policy, dtype=getattr(torch, args.dtype))
    prompts = toy_prompts(policy, max(args.rows, args.noise_rows))
    result = {
        "model": f"{args.size} ({sum(p.numel() for p in policy.model.parameters()):,} parameters, "
                 f"vocab {policy.n_policy_tokens}), {args.dtype}, {torch.get_num_threads()} threads",
        "generate": [overhead(backend, prompts[:n], args.tokens, args.repeats) for n in (1, 32, args.rows)],
        "seed_setup": [seed_setup(rows, steps, args.repeats) for rows in (1, 32, 256) for steps in (24, 512)],
        "sampling_step": [sampling_step(rows, vocab, args.repeats) for rows in (32, 256)
                          for vocab in (policy.n_policy_tokens, 151_665)],
        "padding_noise": [padding_noise(backend, prompts[:args.noise_rows], args.noise_tokens, batch)
                          for batch in (1, 8)],
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
