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
* Broken metadata methods, asked in the worker's own process (`BROKEN_METHODS`: backend name ->
  the method and what its result must name): ``unsupported_reasons`` that raises or returns an
  int, ``inapplicable_reasons`` that raises, ``applicable_variants`` that returns a str,
  ``version_string`` that raises. Each costs its backend only (``error:PluginError``, or a
  version ``unknown (...)``); the others' verdicts stand.
* `HangingChecksBackend` ("hostile-hangs-checks"): ``unsupported_reasons`` sleeps for an hour:
  it must be quarantined at the guard's deadline (``error:PluginTimeout``) and the run go on.
* `RaisingAvailabilityBackend` ("hostile-raises-availability", environment ``standin``):
  ``availability`` raises in its child; it is unavailable with that reason, and its child's other
  backends are not.
* `NanCompileBackend` ("hostile-nan-compile"): variants ``nan``, ``negative`` and ``text``
  report such a ``compile_ms``; stored as 0 (the NaN hit a NOT NULL column and ended the worker).
* Declarations no worker can use: `StrVariantsBackend` (``variants = "default"``),
  `DictCapabilitiesBackend` (``capabilities`` a dict), `BadDeviceBackend` (``device = "gpu"``);
  and `tests.reliability.hostile_import`, a plugin module that raises at import. Each must be one
  line naming the spec, with no traceback.
"""

from __future__ import annotations

import math
import os
import time

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


#: variant -> what its error must say (`BrokenOutputBackend`)
BROKEN_OUTPUTS = {
    "no_output": "expected a fuzzer.backends.base.BackendOutput, got dict",
    "out_none": "out: missing (every case asks for it)",
    "lse_none": "lse: missing (the backend declares lse for this variant)",
    "grads_none": "dq: missing (a backward case, and the backend declares backward)",
    "float64_out": "out: dtype float64, expected float32 (the case's dtype)",
    "complex_out": "out: dtype complex64, expected float32 (the case's dtype)",
    "float64_grad": "dk: dtype float64, expected float32 (the case's dtype)",
    "wrong_shape": "out: shape (1, 5, 2, 16), expected (1, 6, 2, 16)",
    "not_a_tensor": "lse: expected a torch.Tensor or None, got list",
    "wrong_device": "out: on meta, expected cpu (the backend's device)",
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


class RaisingReasonsBackend(CorrectBackend):
    name = "hostile-raises-reasons"

    def unsupported_reasons(self, case, variant):
        raise ValueError("planted: the check itself is broken")


class IntReasonsBackend(CorrectBackend):
    name = "hostile-int-reasons"

    def unsupported_reasons(self, case, variant):
        return 7


class RaisingInapplicableBackend(CorrectBackend):
    name = "hostile-raises-inapplicable"

    def inapplicable_reasons(self, case, variant):
        raise KeyError("planted")


class StrApplicableBackend(CorrectBackend):
    name = "hostile-str-applicable"

    def applicable_variants(self, case):
        return "native"


class RaisingVersionBackend(CorrectBackend):
    name = "hostile-raises-version"

    def version_string(self):
        raise OSError("planted: no metadata")


#: backend name -> (the method its failure names, the class)
BROKEN_METHODS = {
    RaisingReasonsBackend.name: ("unsupported_reasons() raised ValueError: planted", RaisingReasonsBackend),
    IntReasonsBackend.name: ("unsupported_reasons() returned int, expected a list of str", IntReasonsBackend),
    RaisingInapplicableBackend.name: ("inapplicable_reasons(case, 'native') raised KeyError", RaisingInapplicableBackend),
    StrApplicableBackend.name: ("applicable_variants() returned str, expected a list of str", StrApplicableBackend),
}


class HangingChecksBackend(CorrectBackend):
    name = "hostile-hangs-checks"
    environment = "hostile-hangs"

    def unsupported_reasons(self, case, variant):
        time.sleep(3600)  # the injected fault: a check that never returns
        return []


class RaisingAvailabilityBackend(CorrectBackend):
    name = "hostile-raises-availability"

    def availability(self):
        raise RuntimeError("planted: probing the device failed")


class NanCompileBackend(CorrectBackend):
    name = "hostile-nan-compile"
    environment = "hostile-nan"
    variants = ("nan", "negative", "text")

    def run(self, case, inputs, variant):
        output = super().run(case, inputs, variant)
        output.compile_ms = {"nan": math.nan, "negative": -5.0, "text": "12 ms"}[variant]
        return output


class StrVariantsBackend(CorrectBackend):
    name = "hostile-str-variants"
    variants = "default"


class DictCapabilitiesBackend(CorrectBackend):
    name = "hostile-dict-capabilities"
    capabilities = {"dtypes": ("float32",)}


class BadDeviceBackend(CorrectBackend):
    name = "hostile-bad-device"
    device = "gpu"
