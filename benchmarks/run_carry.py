"""Carry a long run's products across machines through git: a checkpoint folder packed as what differs from a
base folder the next machine can make again (a fetched model, an earlier stage's product).

A session here ends on a fresh machine that holds only what was committed, while the real-model run
(benchmarks/real_model.py) takes many sessions. Its SFT start is the fetched SmolLM2 with 8 retrained layers, and
an RL checkpoint is that start plus LoRA adapters: a pack holds only those tensors (rows, when only some rows of a
matrix changed; bf16 where the values are exactly bf16), the files that differ from the base, and a digest of every
weight, so unpacking either rebuilds the same bytes of tensors or fails.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

WEIGHTS = "model.safetensors"
MANIFEST = "manifest.json"
DELTA = "delta.safetensors"
ROWS_SUFFIX = "@rows"


def tensor_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over names, dtypes, shapes and bytes, in name order: equal digests, equal weights."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def compact(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor in bf16 when that loses nothing (fp32 weights rounded to bf16 on purpose), else as it is."""
    if tensor.dtype == torch.float32:
        narrow = tensor.to(torch.bfloat16)
        if torch.equal(narrow.to(torch.float32), tensor):
            return narrow
    return tensor


def weight_delta(weights: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What `weights` holds that `base` does not: whole tensors, or for a matrix whose rows mostly match (an
    output layer grown by two value rows) the changed rows under NAME and their indices under NAME@rows."""
    delta: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        old = base.get(name)
        if old is not None and old.dtype == tensor.dtype and old.shape == tensor.shape and torch.equal(old, tensor):
            continue
        if (old is not None and tensor.dim() == 2 and old.dim() == 2 and old.dtype == tensor.dtype
                and old.shape[1] == tensor.shape[1] and old.shape[0] <= tensor.shape[0]):
            changed = torch.ones(tensor.shape[0], dtype=torch.bool)
            changed[:old.shape[0]] = (tensor[:old.shape[0]] != old).any(dim=1)
            if int(changed.sum()) * 2 < tensor.shape[0]:
                rows = changed.nonzero().squeeze(1)
                delta[name], delta[name + ROWS_SUFFIX] = compact(tensor[rows].clone()), rows
                continue
        delta[name] = compact(tensor.clone())
    return delta


def apply_delta(base: Mapping[str, torch.Tensor], delta: Mapping[str, torch.Tensor],
                dtypes: Mapping[str, str], shapes: Mapping[str, list[int]]) -> dict[str, torch.Tensor]:
    """Rebuild the weights `weight_delta` was taken from (their names, dtypes and shapes from the manifest)."""
    rebuilt = {}
    for name, dtype_name in dtypes.items():
        dtype, shape = getattr(torch, dtype_name.removeprefix("torch.")), tuple(shapes[name])
        if name in delta and name + ROWS_SUFFIX in delta:
            tensor = torch.zeros(shape, dtype=dtype)
            old = base[name]
            tensor[:old.shape[0]] = old
            tensor[delta[name + ROWS_SUFFIX]] = delta[name].to(dtype)
        elif name in delta:
            tensor = delta[name].to(dtype)
        else:
            tensor = base[name]
        rebuilt[name] = tensor.contiguous()
    return rebuilt


def same_file(a: Path, b: Path) -> bool:
    return b.is_file() and a.stat().st_size == b.stat().st_size and a.read_bytes() == b.read_bytes()


def pack(folder: Path, base: Path, out: Path, keep_weights: bool = True) -> dict:
    """Pack `folder` against `base` into `out` (replaced). keep_weights=False leaves model.safetensors out (its
    digest still recorded): the caller can derive it again, e.g. a LoRA checkpoint merged from its adapters."""
    folder, base, out = Path(folder), Path(base), Path(out)
    staged = out.with_name(out.name + ".tmp")
    shutil.rmtree(staged, ignore_errors=True)
    (staged / "files").mkdir(parents=True)
    weights = load_file(folder / WEIGHTS)
    manifest = {"weights_digest": tensor_digest(weights), "weights_packed": keep_weights,
                "dtypes": {n: str(t.dtype) for n, t in weights.items()},
                "shapes": {n: list(t.shape) for n, t in weights.items()}, "files": []}
    if keep_weights:
        save_file(weight_delta(weights, load_file(base / WEIGHTS)), staged / DELTA)
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != WEIGHTS):
        name = str(path.relative_to(folder))
        manifest["files"].append(name)
        if not same_file(path, base / name):
            target = staged / "files" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix == ".safetensors":   # e.g. LoRA adapters: bf16 where that loses nothing
                tensors = load_file(path)
                save_file({n: compact(t) for n, t in tensors.items()}, target,
                          metadata={"dtypes": json.dumps({n: str(t.dtype) for n, t in tensors.items()})})
            else:
                shutil.copy2(path, target)
    (staged / MANIFEST).write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    staged.rename(out)
    return manifest


def unpack(packed: Path, base: Path, folder: Path,
           derive_weights: Callable[[Path], None] | None = None) -> Path:
    """Rebuild the folder `pack` took (its files and weights); a pack without weights calls
    derive_weights(folder) once the other files are in place, which must write model.safetensors. Either way
    the weights must match the recorded digest."""
    packed, base, folder = Path(packed), Path(base), Path(folder)
    manifest = json.loads((packed / MANIFEST).read_text())
    staged = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    for name in manifest["files"]:
        from_pack = (packed / "files" / name).is_file()
        source = packed / "files" / name if from_pack else base / name
        if not source.is_file():
            raise FileNotFoundError(f"{packed} needs {name} from its base {base}, which lacks it")
        (staged / name).parent.mkdir(parents=True, exist_ok=True)
        if from_pack and source.suffix == ".safetensors":
            restore_dtypes(source, staged / name)
        else:
            shutil.copy2(source, staged / name)
    if manifest["weights_packed"]:
        rebuilt = apply_delta(load_file(base / WEIGHTS), load_file(packed / DELTA), manifest["dtypes"],
                              manifest["shapes"])
        save_file(rebuilt, staged / WEIGHTS, metadata={"format": "pt"})
    elif derive_weights is None:
        raise ValueError(f"{packed} holds no weights: pass derive_weights to make them")
    else:
        derive_weights(staged)
    got = tensor_digest(load_file(staged / WEIGHTS))
    if got != manifest["weights_digest"]:
        shutil.rmtree(staged, ignore_errors=True)
        raise ValueError(f"the weights rebuilt from {packed} differ from the packed ones (digest {got[:12]} != "
                         f"{manifest['weights_digest'][:12]}): is {base} the base it was packed against?")
    shutil.rmtree(folder, ignore_errors=True)
    staged.rename(folder)
    return folder


def restore_dtypes(packed_file: Path, out: Path) -> None:
    """A safetensors file `pack` stored compact, written back with every tensor in its recorded dtype."""
    with safe_open(packed_file, "pt") as handle:
        dtypes = json.loads((handle.metadata() or {}).get("dtypes", "{}"))
    tensors = load_file(packed_file)
    save_file({n: t.to(getattr(torch, dtypes.get(n, str(t.dtype)).removeprefix("torch."))) for n, t in tensors.items()},
              out, metadata={"format": "pt"})


def round_trained_matrices_to_bf16(model: torch.nn.Module) -> int:
    """Round every trainable weight matrix to bf16 in place (kept in its fp32 storage); returns how many.

    Under bf16 autocast and in the bf16 sampler a matrix only ever enters a product as bf16, so this changes no
    computation of those, and halves what a pack of the weights holds."""
    rounded = 0
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad and parameter.dim() == 2 and parameter.dtype == torch.float32:
                parameter.copy_(parameter.to(torch.bfloat16).to(torch.float32))
                rounded += 1
    return rounded
