"""`make demo`'s job end to end at a toy scale: a real env server with freshly generated ALFWorld games,
expert play, tokenizer and tiny model, SFT (with the prompt loss), held-out evaluation, one RL iteration,
evaluation again, the PNG, and the last line the issue fixes. The full-size run is `make demo` itself.
Then benchmarks/rl_from_checkpoint.py continues RL from the demo's warm start."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from training_fixtures import load_benchmark

from trainer_client import config
from trainer_client.demo import DemoConfig, main

ROOT = Path(__file__).resolve().parents[2]
LAST_LINE = re.compile(r"^held-out success: sft=(\d\.\d{3}) rl=(\d\.\d{3}) games=(\d+)$")


def test_the_demo_config_loads():
    cfg = config.load(DemoConfig, str(ROOT / "configs" / "demo.yaml"), [])
    assert cfg.env == "alfworld" and cfg.rl.algo == "boundary"


def small(tmp_path: Path) -> list[str]:
    server_args = ("[--workers, '1', --env-option, alfworld.generated=true, --env-option, alfworld.gen_train_games=12, "
                   f"--env-option, alfworld.gen_test_games=6, --env-option, alfworld.cache_dir={tmp_path / 'games'}]")
    return [f"server_args={server_args}", "sft.episodes=12", "sft.epochs=1", "eval_episodes=6", "rl.iterations=1",
            "rl.episodes_per_iteration=4", "rl.save_every=1", "rl.rollout.max_turns=6", "model_size=micro"]


def test_a_small_demo_runs_end_to_end_and_rl_continues_from_its_warm_start(tmp_path, capsys):
    assert main(["--config", str(ROOT / "configs" / "demo.yaml"), f"out_dir={tmp_path / 'demo'}", *small(tmp_path)]) == 0

    last = capsys.readouterr().out.strip().splitlines()[-1]
    match = LAST_LINE.match(last)
    assert match, last
    results = json.loads((tmp_path / "demo" / "results.json").read_text())
    assert float(match[1]) == round(results["sft"]["success"], 3) and float(match[2]) == round(results["rl"]["success"], 3)
    assert int(match[3]) == results["rl"]["episodes"] == results["sft"]["episodes"] == 6
    assert (tmp_path / "demo" / "demo.png").stat().st_size > 10_000
    metrics = (tmp_path / "demo" / "rl" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in metrics] == [0]

    more = load_benchmark(ROOT / "benchmarks" / "rl_from_checkpoint.py")
    assert more.main(["--sft", str(tmp_path / "demo" / "sft"), "--out", str(tmp_path / "more"), "--iterations", "2",
                      "--save-every", "1", "--threads", "2", *small(tmp_path)]) == 0
    rows = json.loads((tmp_path / "more" / "held_out.json").read_text())
    assert [row["checkpoint"] for row in rows] == ["start", "iter_000000", "iter_000001"]
    assert all(row["episodes"] == 6 and 0.0 <= row["success"] <= 1.0 for row in rows)

    # The same checkpoints evaluated again, without RL: the same numbers (an evaluation is a pure function).
    (tmp_path / "more" / "held_out.json").unlink()
    assert more.main(["--sft", str(tmp_path / "demo" / "sft"), "--out", str(tmp_path / "more"), "--evaluate-only",
                      "--threads", "2", *small(tmp_path)]) == 0
    assert json.loads((tmp_path / "more" / "held_out.json").read_text()) == rows
    assert len((tmp_path / "more" / "metrics.jsonl").read_text().splitlines()) == 2   # no iteration added
    with pytest.raises(SystemExit):   # nothing saved there to evaluate
        more.main(["--sft", str(tmp_path / "demo" / "sft"), "--out", str(tmp_path / "none"), "--evaluate-only"])


WEBSHOP_LINE = re.compile(r"^held-out webshop: sft_score=(\d+\.\d) rl_score=(\d+\.\d) sft_success=(\d\.\d{3}) "
                          r"rl_success=(\d\.\d{3}) goals=(\d+)$")


def test_the_webshop_demo_config_holds_out_300_goals_of_a_1000_product_shop():
    cfg = config.load(DemoConfig, str(ROOT / "configs" / "demo_webshop.yaml"), [])
    assert (cfg.env, cfg.train_split, cfg.eval_split, cfg.rl.algo) == ("webshop", "train", "test", "boundary")
    assert cfg.eval_episodes >= 300 and "webshop.synthetic_products=1000" in cfg.server_args
    assert cfg.rl.prompt.compact


def test_a_small_webshop_demo_prints_score_and_success(tmp_path, capsys):
    # The 300-product shop: 33 test goals, 300 training goals.
    small_shop = "[--workers, '1', --env-option, webshop.data_dir=synthetic, --env-option, webshop.pos_tagger=heuristic]"
    assert main(["--config", str(ROOT / "configs" / "demo_webshop.yaml"), f"out_dir={tmp_path / 'demo'}",
                 f"server_args={small_shop}", "sft.episodes=8", "sft.epochs=1", "eval_episodes=6", "rl.iterations=1",
                 "rl.episodes_per_iteration=4", "rl.rollout.max_turns=4", "model_size=micro"]) == 0
    match = WEBSHOP_LINE.match(capsys.readouterr().out.strip().splitlines()[-1])
    assert match
    results = json.loads((tmp_path / "demo" / "results.json").read_text())
    assert [float(g) for g in match.groups()[:4]] == [round(results["sft"]["score"], 1), round(results["rl"]["score"], 1),
                                                      round(results["sft"]["success"], 3), round(results["rl"]["success"], 3)]
    assert int(match[5]) == results["rl"]["episodes"] == 6
    assert results["paired_score_gain"]["games"] == 6
    assert (tmp_path / "demo" / "demo.png").stat().st_size > 10_000

    # Where the warm start's clicks go, on the same shop.
    clicks = load_benchmark(ROOT / "benchmarks" / "webshop_clicks.py")
    assert clicks.main(["--checkpoint", str(tmp_path / "demo" / "sft"), "--goals", "2", f"server_args={small_shop}",
                        "rl.rollout.max_turns=4", "--threads", "1"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    actions = sum(v for k, v in row.items() if k.endswith("listed"))
    assert row.get("results/first_product", 0) <= row.get("results/listed", 0)
    assert row["goals"] == 2 and row.get("start/listed", 0) + row.get("start/unlisted", 0) >= 2 and 2 <= actions <= 8
    assert row.get("won", 0) <= row.get("bought", 0) <= 2 and 0 <= row["score"] <= 100

    # How its outcomes spread within and between training goals.
    spread = load_benchmark(ROOT / "benchmarks" / "outcome_spread.py")
    assert spread.main(["--checkpoint", str(tmp_path / "demo" / "sft"), "--tasks", "3", "--samples", "2",
                        f"server_args={small_shop}", "rl.rollout.max_turns=4", "--threads", "1"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["tasks"] == 3 and 0.0 <= row["won"]["within_task_share"] <= 1.0 and 0.0 <= row["score"]["mean"] <= 1.0
