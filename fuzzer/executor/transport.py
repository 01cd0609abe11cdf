"""Inputs and outputs on their way through the pipe between a worker and its children.

Tensors up to `BYTES_TRANSPORT_MAX` bytes travel as plain bytes in the pipe message
(`PackedTensor`: one copy, no shared-memory segment or CUDA IPC handle to create, pass and release
per tensor, which cost more than the copy for the small tensors of most cases); larger ones go
through ``torch.multiprocessing``: a CPU tensor as a copy in shared memory made before sending
(`shared_copy`: never the sender's own tensor, which the oracle reads meanwhile), a CUDA tensor as
a CUDA IPC handle. A forward-only case sends no ``dout`` (the child gets zeros of its shape).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fuzzer.backends.base import BackendOutput
from oracle.config import AttentionCase

BYTES_TRANSPORT_MAX = 8 * 2**20  # bytes: tensors up to this size travel as bytes, larger ones as handles


@dataclass(frozen=True)
class PackedTensor:
    """A tensor as plain bytes for the pipe to a child: ``dtype`` (torch name, e.g.
    ``"bfloat16"``), ``shape``, ``device`` (``"cpu"``, ``"cuda:0"``: where it was) and the
    C-contiguous bytes. `unpack` gives it back on the CPU, same dtype, shape and values."""

    dtype: str
    shape: tuple[int, ...]
    device: str
    data: bytes

    @classmethod
    def pack(cls, tensor: Any) -> Any:
        """``tensor`` as a `PackedTensor` if it holds at most ``BYTES_TRANSPORT_MAX`` bytes (a
        copy to the host for a CUDA tensor); a larger CPU tensor as a copy in shared memory, made
        here (`shared_copy`); a larger CUDA tensor itself (a CUDA IPC handle when pickled); None
        stays None."""
        import torch

        if tensor is None or not isinstance(tensor, torch.Tensor):
            return tensor
        if tensor.numel() * tensor.element_size() > BYTES_TRANSPORT_MAX:
            return shared_copy(tensor) if tensor.device.type == "cpu" else tensor
        host = tensor.detach().to("cpu").contiguous()
        data = host.view(-1).view(torch.uint8).numpy().tobytes() if host.numel() else b""
        return cls(str(host.dtype).removeprefix("torch."), tuple(host.shape), str(tensor.device), data)

    def unpack(self) -> Any:
        import torch

        dtype = getattr(torch, self.dtype)
        if not self.data:
            return torch.empty(self.shape, dtype=dtype)
        return torch.frombuffer(bytearray(self.data), dtype=torch.uint8).view(dtype).reshape(self.shape)


def shared_copy(tensor: Any) -> Any:
    """A copy of the CPU tensor ``tensor`` in shared memory (same dtype, shape and values), made
    in the calling thread: what a larger tensor travels as (`PackedTensor.pack`).

    Why a copy: pickling a CPU tensor for the pipe (torch's reducer) moves *its own* storage into
    shared memory, in place, in the thread that sends. The inputs were sent from an environment
    thread while the worker's main thread read the same tensors for the oracle: the storage
    changed under the oracle and the worker died with SIGSEGV (``--backend torch-cpu-math``, a
    corpus case just over ``BYTES_TRANSPORT_MAX``, 2 runs in 3); and the child then shared the
    worker's own inputs, so a backend that wrote into them changed the oracle's (an innocent
    backend failed with an error ratio of 714,848 while the culprit passed). An output was the
    backend's own buffer moved into shared memory, so a plugin that reused it for its next call
    changed the output already sent."""
    return tensor.detach().clone().share_memory_()


def _unpack(value: Any) -> Any:
    return value.unpack() if isinstance(value, PackedTensor) else value


def pack_inputs(case: AttentionCase, inputs: Any) -> dict[str, Any]:
    """`oracle.inputs.AttentionInputs` as a dict of `PackedTensor` (or large tensors) for a child;
    ``dout`` is left out of a forward-only case. Inverse: `unpack_inputs`."""
    import dataclasses

    names = [f.name for f in dataclasses.fields(inputs) if case.backward or f.name != "dout"]
    packed = {name: PackedTensor.pack(getattr(inputs, name)) for name in names}
    if not case.backward:  # not read: a lazy dout (oracle.inputs.AttentionInputs) stays unbuilt
        shape, dtype = inputs.dout_meta if hasattr(type(inputs), "dout_meta") else (inputs.dout.shape, inputs.dout.dtype)
        packed["dout"] = ("zeros", tuple(shape), str(dtype).removeprefix("torch."))
    return packed


def unpack_inputs(packed: dict[str, Any]) -> Any:
    """The `oracle.inputs.AttentionInputs` of `pack_inputs` (host tensors, or the shared ones)."""
    import torch

    from oracle.inputs import AttentionInputs

    fields = {}
    for name, value in packed.items():
        if isinstance(value, tuple) and value and value[0] == "zeros":
            fields[name] = torch.zeros(value[1], dtype=getattr(torch, value[2]))
        else:
            fields[name] = _unpack(value)
    return AttentionInputs(**fields)


def pack_output(output: Any) -> Any:
    """A `BackendOutput` whose tensors are `PackedTensor` where small enough (see `unpack_output`)."""
    if output is None:
        return None
    return BackendOutput(
        out=PackedTensor.pack(output.out),
        lse=PackedTensor.pack(output.lse),
        dq=PackedTensor.pack(output.dq),
        dk=PackedTensor.pack(output.dk),
        dv=PackedTensor.pack(output.dv),
        selected_kernel=output.selected_kernel,
        compile_ms=output.compile_ms,
        extra=dict(output.extra),
    )


def unpack_output(output: Any) -> Any:
    """Inverse of `pack_output` (tensors on the CPU)."""
    if output is None:
        return None
    for name in ("out", "lse", "dq", "dk", "dv"):
        setattr(output, name, _unpack(getattr(output, name)))
    return output
