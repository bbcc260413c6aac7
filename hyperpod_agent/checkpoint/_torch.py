"""Everything that touches torch; imported only when a state holds a tensor."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from hyperpod_agent.checkpoint.errors import CheckpointError, UnsupportedStateError


def torch_loaded() -> bool:
    """True if torch is already imported: a state can only hold tensors if it is."""
    return sys.modules.get("torch") is not None


def is_tensor(value: object) -> bool:
    """True for a torch.Tensor, without importing torch when the caller never did."""
    if not torch_loaded():
        return False
    import torch

    return isinstance(value, torch.Tensor)


def describe(path: str, tensor: Any) -> tuple[str, tuple[int, ...], int]:
    """Return (dtype name, shape, nbytes) of a tensor we can store, or raise naming ``path``."""
    import torch

    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) and hasattr(tensor, "to_local"):
        # A DTensor spans ranks; each rank stores its own shard, so it must say which.
        raise UnsupportedStateError(
            f"{path}: {type(tensor).__name__} is not supported; save tensor.to_local()"
        )
    if tensor.layout != torch.strided:
        raise UnsupportedStateError(f"{path}: {tensor.layout} tensors are not supported")
    if tensor.is_quantized:
        raise UnsupportedStateError(f"{path}: quantized tensors are not supported")
    if tensor.device.type == "meta":
        raise UnsupportedStateError(f"{path}: a tensor on the meta device holds no data")
    name = str(tensor.dtype).removeprefix("torch.")
    shape = tuple(int(d) for d in tensor.shape)
    return name, shape, tensor.numel() * tensor.element_size()


def copy_into(dest: np.ndarray, tensor: Any, dtype: str, shape: tuple[int, ...]) -> None:
    """Copy ``tensor`` (any device, any strides) into the uint8 staging slice ``dest``."""
    import torch

    if dest.size == 0:
        return
    view = torch.from_numpy(dest).view(getattr(torch, dtype)).view(shape)
    view.copy_(tensor.detach())


def from_bytes(raw: np.ndarray, dtype: str, shape: tuple[int, ...], device: Any = None) -> Any:
    """Build a tensor from its raw bytes (a uint8 array the tensor may keep as its storage)."""
    try:
        import torch
    except ImportError as exc:
        raise CheckpointError(
            "the checkpoint holds torch tensors but torch is not installed"
        ) from exc
    tdtype = getattr(torch, dtype, None)
    if not isinstance(tdtype, torch.dtype):
        raise CheckpointError(f"unknown torch dtype {dtype!r} in checkpoint")
    if raw.size == 0:
        out = torch.empty(shape, dtype=tdtype)
    else:
        out = torch.from_numpy(raw).view(tdtype).view(shape)
    if device is not None and out.device != device:
        out = out.to(device)
    return out


def element_size(dtype: str) -> int | None:
    """Bytes per element of the torch dtype stored as ``dtype``; None if torch has none such."""
    try:
        import torch
    except ImportError as exc:
        raise CheckpointError(
            "the checkpoint holds torch tensors but torch is not installed"
        ) from exc
    tdtype = getattr(torch, dtype, None) if dtype.isidentifier() else None
    if not isinstance(tdtype, torch.dtype):
        return None
    return int(tdtype.itemsize)


def tensor_meta(tensor: Any) -> tuple[str, tuple[int, ...], Any]:
    """(dtype name, shape, device) of a template tensor."""
    return (
        str(tensor.dtype).removeprefix("torch."),
        tuple(int(d) for d in tensor.shape),
        tensor.device,
    )
