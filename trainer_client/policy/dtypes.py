"""Dtype names as configs spell them, and the torch dtype each one names: one definition for every section."""

from __future__ import annotations

import typing
from typing import Literal

import torch

ModelDtype = Literal["float32", "bfloat16"]
"""What the trainer holds its models (and a sampling copy) in."""
EngineDtype = Literal["float32", "bfloat16", "float16"]
"""What a vLLM engine may run in."""
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def names(dtype_type: object) -> tuple[str, ...]:
    """The names a dtype type allows, e.g. names(ModelDtype) == ("float32", "bfloat16")."""
    return typing.get_args(dtype_type)


def torch_dtype(name: str) -> torch.dtype:
    if name not in TORCH_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(TORCH_DTYPES)}, got {name!r}")
    return TORCH_DTYPES[name]
