"""Fake builds for the CPU tests: wheels of a tiny attention "library", ``attnfuzz-fakekernel``,
whose window resolution changes between versions the way flash-attn-4's did around PR #2490.

Versions (`KERNEL_BEHAVIOUR`):

* ``sum`` (before #2490): causal first, then ``(-1, 0)`` widens to unbounded: correct.
* ``both`` (after #2490): widen only when both bounds are negative, then a remaining bound makes
  a local band and drops ``causal``: the TE encoding ``causal=True, window_size=(-1, 0)`` is an
  empty band, so the output is all zeros and lse is -inf (the seed bug).
* ``fixed``: negative bounds mean unbounded: correct again.
* ``broken``: the module raises ImportError when imported (a build that cannot run: ``skip``).

``attnfuzz-fakedep`` plays nvidia-cutlass-dsl: fakekernel 2.0 declares ``Requires-Dist:
attnfuzz-fakedep>=2`` (it needs ``API == 2``), 1.2rc1 to 1.4 declare ``attnfuzz-fakedep<2``; the
versions before 1.2rc1 need ``attnfuzz-fakedep<2`` too but do not say so, so a rules file says it
(`RULES_TOML`), as ``fuzzer/builds/build_rules.toml`` does for old flash-attn-4 builds. Every fakekernel imports it, so a
build whose extras were not installed cannot import.

Wheels are written directly as zip files (no build backend): a few milliseconds each.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

KERNEL = "attnfuzz-fakekernel"
DEP = "attnfuzz-fakedep"

KERNEL_BEHAVIOUR = {
    "1.0": "sum",
    "1.0.1": "sum",
    "1.1": "sum",
    "1.1.1": "sum",
    "1.1.2": "sum",
    "1.2rc1": "both",
    "1.2": "both",
    "1.3": "both",
    "1.4": "both",
    "2.0": "fixed",
}

RULES_TOML = """
[[rule]]
package = "attnfuzz-fakekernel"
versions = "<1.2rc1"
requires = ["attnfuzz-fakedep<2"]
why = "the old window resolver needs the old dependency API"
"""

KERNEL_SOURCE = '''"""attnfuzz_fakekernel {version}: a test fixture, not a library."""

import attnfuzz_fakedep

__version__ = "{version}"
RESOLVER = "{resolver}"
{guard}

def _resolve(causal, left, right):
    if RESOLVER == "sum":
        if causal:
            right = 0
        if left is not None and right is not None and left + right < 0:
            left = right = None
        return causal, left, right
    if RESOLVER == "both":
        if left is not None and right is not None and left < 0 and right < 0:
            left = right = None
        if causal:
            right = 0
        if left is not None or right is not None:
            return False, left, right
        return causal, left, right
    left = None if left is not None and left < 0 else left
    right = None if right is not None and right < 0 else right
    if causal:
        right = 0 if right is None else min(right, 0)
    return causal, left, right


def attention(q, k, v, *, causal=False, window_size=(None, None), softmax_scale=1.0, offset=0):
    """[batch, seq, heads, dim] float tensors -> (out, lse [batch, heads, seqlen_q])."""
    import math

    import torch

    causal, left, right = _resolve(causal, window_size[0], window_size[1])
    i = torch.arange(q.shape[1]).unsqueeze(1) + offset
    j = torch.arange(k.shape[1]).unsqueeze(0)
    keep = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool)
    if causal:
        keep &= j <= i
    if right is not None:
        keep &= j <= i + right
    if left is not None:
        keep &= j >= i - left
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * softmax_scale
    scores = scores.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    safe = lse.masked_fill(torch.isneginf(lse), 0.0).unsqueeze(-1)
    probs = torch.exp(scores - safe).masked_fill(~keep, 0.0)
    return torch.einsum("bhqk,bkhd->bqhd", probs, v), lse
'''

DEP_SOURCE = '''"""attnfuzz_fakedep {version}: a test fixture."""

API = {api}
'''


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(directory: Path, dist: str, version: str, files: dict[str, str], requires: list[str] = ()) -> Path:
    """A pure-Python wheel ``<dist>-<version>-py3-none-any.whl`` holding ``files`` (path -> text)."""
    stem = dist.replace("-", "_")
    info = f"{stem}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    contents = {
        **files,
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: attnfuzz-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [_record_line(name, text.encode()) for name, text in contents.items()] + [f"{info}/RECORD,,"]
    contents[f"{info}/RECORD"] = "\n".join(record) + "\n"
    path = directory / f"{stem}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in contents.items():
            archive.writestr(name, text)
    return path


def kernel_wheel(directory: Path, version: str, broken: bool = False) -> Path:
    """The fakekernel wheel of ``version`` (behaviour from `KERNEL_BEHAVIOUR`)."""
    resolver = KERNEL_BEHAVIOUR[version]
    needed_api = 2 if resolver == "fixed" else 1
    guard = f"if attnfuzz_fakedep.API != {needed_api}:\n    raise ImportError('attnfuzz_fakekernel {version} needs attnfuzz_fakedep API {needed_api}')\n"
    if broken:
        guard += f"raise ImportError('attnfuzz_fakekernel {version}: symbol _resolve_window missing (broken build)')\n"
    requires = ["torch", "packaging>=20"]
    if resolver == "fixed":
        requires.append(f"{DEP}>=2")
    elif resolver == "both":
        requires.append(f"{DEP}<2")
    source = KERNEL_SOURCE.format(version=version, resolver=resolver, guard=guard)
    return write_wheel(directory, KERNEL, version, {"attnfuzz_fakekernel/__init__.py": source}, requires)


def make_wheelhouse(directory: Path, versions: list[str], broken: tuple[str, ...] = ()) -> Path:
    """A wheelhouse with the fakekernel ``versions`` (``broken`` ones fail to import) and both
    fakedep versions, plus a rules file ``rules.toml`` beside it. Returns the wheelhouse."""
    directory.mkdir(parents=True, exist_ok=True)
    for version in versions:
        kernel_wheel(directory, version, broken=version in broken)
    for version, api in (("1.0", 1), ("2.0", 2)):
        write_wheel(directory, DEP, version, {"attnfuzz_fakedep/__init__.py": DEP_SOURCE.format(version=version, api=api)})
    (directory.parent / "rules.toml").write_text(RULES_TOML)
    return directory
