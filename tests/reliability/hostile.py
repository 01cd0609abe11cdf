"""Stand-in backends whose text no database can store as is (issue 17, item 2).

`HostileTextBackend` (a name of 80 characters): variant ``native`` runs correct attention;
variant ``boom`` raises an exception whose message holds a NUL and a lone surrogate (the
``os.fsdecode`` of a non-UTF-8 path), as a kernel loader's error may; ``versions()`` reports a
package name of 200 characters and a version with a NUL. The store must keep every result, with
the text escaped and cut (`fuzzer.text.storable_text`), and the worker must go on.
"""

from __future__ import annotations

import os

from tests.fuzzer.standins import CorrectBackend

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
