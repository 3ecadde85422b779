"""Scale-out with PyTorch's own tools: the same trainer under ``torchrun --nproc-per-node N``
(gloo on CPU, nccl on GPU; every rank keeps its slice of the same global batch; rank 0 writes
the files). docs/training.md ("Scale-out") tells the story.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from lmlab.utils.errors import LmlabError


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: rank, world size, local rank, and whether a group is running."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    active: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_distributed(device: torch.device) -> DistInfo:
    """Start the process group if torchrun launched us (idempotent); one-process info otherwise."""
    if not launched_by_torchrun():
        return DistInfo()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if world == 1:
        return DistInfo(rank=0, world_size=1, local_rank=local)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(local)
        dist.init_process_group(backend=backend)
        # a group left to the interpreter's teardown can abort a rank at exit: destroy it first
        atexit.register(shutdown, DistInfo(active=True))
    return DistInfo(rank=rank, world_size=world, local_rank=local, active=True)


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """The device ``name`` stands for on this machine (``auto``: the GPU if any, else CPU; under
    torchrun a bare ``cuda`` is the process's own GPU), refused when it is not there."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank if launched_by_torchrun() else 0)
        return torch.device("cpu")
    from lmlab.training.config import parse_device

    device = parse_device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise LmlabError(f"device {name!r} was asked for but CUDA is not available",
                             "use --device cpu (or auto)")
        if device.index is None and launched_by_torchrun():
            device = torch.device("cuda", local_rank)
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise LmlabError(f"device {name!r} was asked for but this machine has {count} "
                             f"GPU{'s' if count != 1 else ''} (cuda:0 to cuda:{count - 1})",
                             "use --device cuda (or auto), or a GPU index this machine has")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise LmlabError(f"device {name!r} was asked for but Apple's MPS is not available",
                         "use --device cpu (or auto)")
    return device


def process_device(name: str) -> torch.device:
    """:func:`resolve_device` for this process: its ``LOCAL_RANK`` under torchrun."""
    return resolve_device(name, int(os.environ.get("LOCAL_RANK", "0")))


def barrier(info: DistInfo) -> None:
    if info.active:
        dist.barrier()


def all_reduce_sum(values: list[float], info: DistInfo, device: torch.device) -> list[float]:
    """Sum a few floats over ranks (one collective)."""
    if not info.active:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (``[obj]`` in one process)."""
    if not info.active:
        return [obj]
    gathered: list[Any] = [None] * info.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(obj: Any, info: DistInfo) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not info.active:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shutdown(info: DistInfo) -> None:
    if info.active and dist.is_initialized():
        dist.destroy_process_group()


class RankSlice:
    """Wrap a stream of global batches; yield rank ``rank``'s contiguous share of each (tensors
    of the batch's first dimension are sliced; the position is the wrapped stream's)."""

    def __init__(self, stream: Any, rank: int, world_size: int):
        self.stream = stream
        self.rank = rank
        self.world_size = world_size

    def _slice(self, batch: dict[str, Any]) -> dict[str, Any]:
        sizes = {v.shape[0] for v in batch.values() if isinstance(v, torch.Tensor) and v.dim()}
        if not sizes:
            return batch
        size = max(sizes)
        if size % self.world_size:
            raise LmlabError(f"global batch size {size} is not divisible by {self.world_size} "
                             "processes", "choose a batch size that is a multiple of the "
                             "process count")
        share = size // self.world_size
        lo, hi = self.rank * share, (self.rank + 1) * share
        return {k: (v[lo:hi] if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == size
                    else v) for k, v in batch.items()}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.stream:
            yield self._slice(batch)

    def __getattr__(self, name: str) -> Any:  # state_dict, load_state_dict: the stream's own
        return getattr(self.stream, name)


class LossModule(torch.nn.Module):
    """Model + objective as one module whose forward returns ``(loss, metrics,
    num_predictions)``: DDP/FSDP wrap the whole loss computation (objectives call several pieces
    of the model)."""

    def __init__(self, model: torch.nn.Module, objective: torch.nn.Module):
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, batch: dict[str, torch.Tensor]):
        result = self.objective.compute_loss(self.model, batch)
        return result.loss, dict(result.metrics), int(result.num_predictions)


def wrap(module: LossModule, strategy: str, info: DistInfo, device: torch.device
         ) -> torch.nn.Module:
    """Wrap ``module`` for ``strategy`` (``ddp``/``fsdp``) when a process group is running."""
    if not info.active:
        return module
    if strategy == "fsdp":
        # FSDP2 (fully_shard): works on CPU with gloo, unlike FSDP1 (accelerator only). One unit
        # over everything: tied embeddings/decoder must live in one unit. Parameters become
        # DTensors sharded over ranks; rank 0's initial weights are broadcast first.
        from torch.distributed.fsdp import fully_shard

        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)
        fully_shard(module)
        return module
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index] if device.type == "cuda" else None
    return DDP(module, device_ids=ids, find_unused_parameters=True)
