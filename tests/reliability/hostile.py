"""Hostile plugin backends: what a careless or broken plugin does, and what must still hold.

* `HostileTextBackend` (a name of 80 characters; issue 17, item 2): variant ``native`` runs
  correct attention; variant ``boom`` raises an exception whose message holds a NUL and a lone
  surrogate (the ``os.fsdecode`` of a non-UTF-8 path), as a kernel loader's error may;
  ``versions()`` reports a package name of 200 characters and a version with a NUL. The store
  must keep every result, with the text escaped and cut (`fuzzer.text.storable_text`), and the
  worker must go on.
* `InputWritingBackend` ("hostile-writes-inputs", environment ``standin``: the child of
  `tests.fuzzer.standins.CorrectBackend`): correct attention, then it scales q and negates k in
  place. It must get ``error:InputMutated``; every other backend, in its child or not, and the
  oracle must see the inputs unchanged.
* `ReusedBufferBackend` ("hostile-reuses-output"): variants ``right`` (correct attention) and
  ``zeros``, both written into one output buffer the backend keeps: ``right`` must pass and
  ``zeros`` get ``error:OutputReused``.
* `BrokenOutputBackend` ("hostile-broken-output"): one variant per way to return a broken output
  (`BROKEN_OUTPUTS`); each must get ``error:InvalidOutput`` naming the field, never ``pass``.
"""

from __future__ import annotations

import os

import torch

from tests.fuzzer.standins import WIDE_CAPS, CorrectBackend

LONG_NAME = "hostile-" + "x" * 72
BAD_PATH = os.fsdecode(b"/tmp/\xff.so")  # "/tmp/\udcff.so": a lone surrogate


class HostileTextBackend(CorrectBackend):
    name = LONG_NAME
    environment = "standin-hostile"
    variants = ("native", "boom")

    def versions(self) -> dict[str, str]:
        return {"p" * 200: "1.0\x00rc", "hostile-kernels": BAD_PATH}

    def run(self, case, inputs, variant):
        if variant == "boom":
            raise RuntimeError(f"cannot load {BAD_PATH}: bad byte \x00 in the ELF header")
        return super().run(case, inputs, variant)


class InputWritingBackend(CorrectBackend):
    name = "hostile-writes-inputs"
    capabilities = WIDE_CAPS

    def run(self, case, inputs, variant):
        output = super().run(case, inputs, variant)  # correct on the inputs it was given
        inputs.q.mul_(1000.0)
        inputs.k.neg_()
        return output


class ReusedBufferBackend(CorrectBackend):
    name = "hostile-reuses-output"
    environment = "hostile-reuse"
    capabilities = WIDE_CAPS
    variants = ("right", "zeros")

    def run(self, case, inputs, variant):
        output = super().run(case, inputs, variant)
        buffer = self.__dict__.get("_buffer")
        if buffer is None or buffer.shape != output.out.shape or buffer.dtype != output.out.dtype:
            buffer = self.__dict__["_buffer"] = torch.empty_like(output.out)
        if variant == "zeros":
            buffer.zero_()
        else:
            buffer.copy_(output.out)
        output.out = buffer
        return output


#: variant -> the field the error must name (`BrokenOutputBackend`)
BROKEN_OUTPUTS = {
    "no_output": "BackendOutput",
    "out_none": "out",
    "lse_none": "lse",
    "grads_none": "dq",
    "float64_out": "out",
    "complex_out": "out",
    "float64_grad": "dk",
    "wrong_shape": "out",
    "not_a_tensor": "lse",
    "wrong_device": "out",
}


class BrokenOutputBackend(CorrectBackend):
    name = "hostile-broken-output"
    environment = "hostile-broken"
    capabilities = WIDE_CAPS
    variants = tuple(BROKEN_OUTPUTS)

    def run(self, case, inputs, variant):
        output = super().run(case, inputs, variant)
        if variant == "no_output":
            return {"out": output.out}
        if variant == "out_none":
            output.out = None
        elif variant == "lse_none":
            output.lse = None
        elif variant == "grads_none":
            output.dq = output.dk = output.dv = None
        elif variant == "float64_out":
            output.out = output.out.double()
        elif variant == "complex_out":
            output.out = output.out.to(torch.complex64)
        elif variant == "float64_grad":
            output.dk = output.dk.double()
        elif variant == "wrong_shape":
            output.out = output.out[:, :-1]
        elif variant == "not_a_tensor":
            output.lse = output.lse.tolist()
        elif variant == "wrong_device":
            output.out = output.out.to("meta")
        return output
