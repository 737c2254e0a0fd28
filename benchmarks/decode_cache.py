"""The sampler's KV cache, side by side in one run: written in place into room for the whole reply
(PreallocatedLayer, the default) against transformers' cache that concatenates anew each decode step.

A batch of prompts as long as the real model's ALFWorld prompts is sampled with both, alternating; prefill is timed
by asking for one token, a decode step as (24 tokens - 1 token) / 23, the best of --repeats. Stop ids are ignored, so
every row decodes every step. SmolLM2-135M-Instruct when it is cached (`limen-data fetch smollm2`), else the tiny model
(--model picks one).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/decode_cache.py [--repeats 3] [--json result.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402  (after the OpenMP setting)

from trainer_client.policy import Policy, SamplingConfig, TransformersBackend, build_tiny_checkpoint  # noqa: E402
from trainer_client.pretrained import PACKAGED_MODELS, default_dir, read_marker  # noqa: E402

STEPS = 24


def load_policy(tmp: str, model: str) -> tuple[Policy, str]:
    cached = default_dir(PACKAGED_MODELS["smollm2"])
    if model == "smollm2" and not read_marker(cached):
        raise SystemExit(f"SmolLM2 is not cached in {cached}: run `limen-data fetch smollm2` first")
    if model != "tiny" and read_marker(cached):
        return Policy.load(cached, use_bf16_autocast=True), "SmolLM2-135M-Instruct"
    texts = ["you are in the middle of a room. go to the kitchen and take the apple from the counter."] * 4
    return Policy.load(build_tiny_checkpoint(texts, Path(tmp) / "tiny")), "tiny model"


def seconds(backend: TransformersBackend, prompts: list[list[int]], tokens: int) -> float:
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=tokens)
    started = time.perf_counter()
    backend.generate(prompts, sampling, seeds=list(range(len(prompts))))
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/decode_cache.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=370, help="the shortest prompt; row i has i more")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", choices=("auto", "smollm2", "tiny"), default="auto")
    parser.add_argument("--json", default="", help="also write the result here")
    parser.add_argument("--dry-run", action="store_true", help="print the settings, time nothing")
    args = parser.parse_args(argv)
    if args.dry_run:
        print(json.dumps({k: v for k, v in vars(args).items() if k != "dry_run"}))
        return 0
    torch.set_num_threads(args.threads)
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        policy, model_name = load_policy(tmp, args.model)
        backend = TransformersBackend.from_policy(policy, dtype=torch.bfloat16 if policy.use_bf16_autocast else None)
        backend.stop_ids = ()                    # every row decodes every step
        backend.group_overhead_tokens = 10**9    # one batch
        generator = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, policy.n_policy_tokens, (args.prompt_tokens + i,), generator=generator).tolist()
                   for i in range(args.batch)]
        seconds(backend, prompts[:2], 2)   # warm-up
        best: dict[str, dict[int, float]] = {"preallocated": {}, "growing": {}}
        for _ in range(args.repeats):
            for kind in best:
                backend.preallocate_kv = kind == "preallocated"
                for tokens in (1, STEPS):
                    took = seconds(backend, prompts, tokens)
                    best[kind][tokens] = min(best[kind].get(tokens, took), took)
    rows = {kind: {"prefill_s": t[1], "decode_step_s": (t[STEPS] - t[1]) / (STEPS - 1), "generate_24_s": t[STEPS]}
            for kind, t in best.items()}
    result = {"model": model_name, "batch": args.batch, "prompt_tokens": [args.prompt_tokens, args.prompt_tokens +
              args.batch - 1], "threads": args.threads, "repeats": args.repeats,
              "load_average": {"start": load_at_start, "end": os.getloadavg()}, "rows": rows,
              "decode_step_ratio": rows["growing"]["decode_step_s"] / rows["preallocated"]["decode_step_s"],
              "generate_24_ratio": rows["growing"]["generate_24_s"] / rows["preallocated"]["generate_24_s"]}
    print(f"{model_name}, batch {args.batch}, prompts of {args.prompt_tokens}-{args.prompt_tokens + args.batch - 1} "
          f"tokens, {args.threads} threads, best of {args.repeats}")
    print(f"{'KV cache':<14}{'prefill s':>11}{'decode step s':>15}{'24 tokens s':>13}")
    for kind, row in rows.items():
        print(f"{kind:<14}{row['prefill_s']:>11.3f}{row['decode_step_s']:>15.4f}{row['generate_24_s']:>13.3f}")
    print(f"growing / preallocated: decode step {result['decode_step_ratio']:.2f}x, "
          f"24 tokens {result['generate_24_ratio']:.2f}x")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
