"""One run of the toy learning test (tests/e2e/test_toy_learning.py) with some of its settings changed, printed as
one JSON line: how its settings are chosen, on the toy env's `valid` split, so that the test's tasks are looked at last.

    OMP_NUM_THREADS=1 python benchmarks/toy_learning_setting.py SEED '{"rl_changes": ["optim.target_kl=0.02"], "eval_split": "valid"}'

Results measured so far: docs/measurements/toy_learning_settings.json.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))
from test_toy_learning import ToyLearning, learning_run  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        raise SystemExit(__doc__)
    seed, changes = int(argv[0]), json.loads(argv[1])
    setting = dataclasses.replace(ToyLearning(), **changes)
    with tempfile.TemporaryDirectory() as out:
        result = asyncio.run(learning_run(setting, seed, Path(out)))
    gain = result.gain
    print(json.dumps({"seed": seed, "changes": changes, "split": setting.eval_split, "gain": gain.gain, "lo": gain.lo,
                      "hi": gain.hi, "before": gain.before, "after": gain.after,
                      "gains_at": {i: [g.gain, g.lo, g.hi] for i, g in result.gains_at.items()},
                      "train_success": result.train_success, "valid_ratio": result.valid_ratio,
                      "seconds": result.seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
