"""Shared test set-up: the real data through ALFWORLD_DATA / WEBSHOP_DATA, and quiet, fixed CPU threads."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
if not os.environ.get("ALFWORLD_DATA") and (_SHARED / "alfworld" / "json_2.1.1").is_dir():
    os.environ["ALFWORLD_DATA"] = str(_SHARED / "alfworld")
if not os.environ.get("WEBSHOP_DATA") and (_SHARED / "webshop" / "items_shuffle_1000.json").is_file():
    os.environ["WEBSHOP_DATA"] = str(_SHARED / "webshop")
