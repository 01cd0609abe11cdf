"""Standalone pytest repros of stored failures (``attnfuzz export``, ``GET /api/cases/{id}/repro.py``).

A repro is one Python file that needs only ``torch``, ``pytest`` and the backend's own package
(never attnfuzz), so a kernel maintainer can drop it into flash-attention's or
TransformerEngine's tests. It

1. regenerates the inputs deterministically: `oracle.inputs.hash_normal` is copied into the file
   verbatim (its source), and `make_inputs` re-implemented with the same constants, so the
   tensors are bit-identical to the ones the fuzzer used (``tests/service/test_export.py``
   checks this);
2. calls the backend exactly as the failing variant did, through a *call snippet* (below) built
   from the adapter's own pure translation functions (`fuzzer.backends.fa4.fa4_call_kwargs`,
   `fuzzer.backends.te.te_module_kwargs` ...);
3. computes a compact float64 reference inline (dense per sequence, the mask semantics of
   `oracle.masks`, the backward of FlashAttention-2 Algorithm 2);
4. asserts the invariants attnfuzz checks (shape, NaN, +-inf, all-zero output, finite lse on rows
   that see no key) and the tolerance: the L2 error of every tensor over the whole tensor must
   stay within ``ALLOWED[tensor]``, the allowed error of `oracle.compare`'s model
   (``factor * max(||round_dtype(R) - R||, u * ||sigma||) + floor * sqrt(numel)``) evaluated by
   the oracle on exactly these inputs when the file was generated. The per-tile check
   (``tile_mismatch``) is not repeated in the file;
5. skips with a reason when the package, a CUDA GPU or the GPU architecture is missing.

Call snippets: `register_snippet` maps a backend name to a factory ``(case, variant) ->
CallSnippet``; the built-ins cover ``fa4``, ``te-fa4``/``te-fa2``/``te-fused``/``te-unfused``,
``fa2`` and PyTorch SDPA (``torch-cpu-*``, ``torch-sdpa-*``). `snippet_factory` raises
`ExportError` "no export for backend X" for any other name; tests register their own.

Safety: generated code contains only validated literals. The stored case is validated again
(`AttentionCase.from_json`), names and signatures must match strict patterns, and every value
goes into the file through `literal`, which accepts only ``None``, ``bool``, ``int``, finite
``float``, strings of a small alphabet and tuples/lists/dicts of those. Finally
`check_only_literals` parses the template (with placeholders in the value slots) and the rendered
file and requires identical syntax trees except at the slots, where only literals
(`ast.literal_eval`) may stand. A hostile value stored in the database therefore raises
`ExportError`; it never becomes code.
"""

from __future__ import annotations

import ast
import inspect
import math
import re
import string
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oracle.config import AttentionCase
from oracle.errors import CaseValidationError
from service.errors import FieldValidationError

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
"""Backend and variant names (as in `fuzzer.corpus`)."""
SIGNATURE_PATTERN = re.compile(r"^[A-Za-z0-9_]{1,64}(:[A-Za-z0-9_.]{1,128})?$")
"""Failure signatures such as ``out:all_zero``, ``crash``, ``error:RuntimeError``."""
_SAFE_STRING = re.compile(r"^[A-Za-z0-9_.:+\-]{0,200}$")
_DOC_TEXT = re.compile(r"^[\x20-\x7e\n]*$")
TENSOR_NAMES = ("out", "lse", "dq", "dk", "dv")


class ExportError(FieldValidationError):
    """A repro cannot be generated; ``field`` names the offending input (HTTP 422)."""


# ---------------------------------------------------------------------------------- literals
def literal(value: Any, *, where: str = "value") -> str:
    """Python source for ``value``, which must be plain data.

    Accepted: ``None``, ``bool``, ``int``, finite ``float``, ``str`` of letters, digits and
    ``_ . : + -`` (at most 200), and ``tuple``/``list``/``dict`` (string keys) of those. Exact types
    only: subclasses (with their own ``__repr__``) are refused.

    Raises:
        ExportError: anything else; ``field`` is ``where``.
    """
    kind = type(value)
    if value is None or kind is bool or kind is int:
        return repr(value)
    if kind is float:
        if not math.isfinite(value):
            raise ExportError(where, f"non-finite float {value!r} cannot be exported")
        return repr(value)
    if kind is str:
        if not _SAFE_STRING.match(value):
            raise ExportError(where, f"string {value[:80]!r} has characters outside [A-Za-z0-9_.:+-]")
        return repr(value)
    if kind is tuple:
        items = [literal(v, where=where) for v in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if kind is list:
        return "[" + ", ".join(literal(v, where=where) for v in value) + "]"
    if kind is dict:
        parts = []
        for key, item in value.items():
            if type(key) is not str:
                raise ExportError(where, f"dict key {key!r} is not a string")
            parts.append(f"{literal(key, where=where)}: {literal(item, where=where)}")
        return "{" + ", ".join(parts) + "}"
    raise ExportError(where, f"a {kind.__name__} cannot be exported as a literal")


def docstring_literal(text: str) -> str:
    """``text`` as a triple-quoted string literal (printable ASCII, no backslash or triple quote).

    Raises:
        ExportError: ``text`` contains anything else.
    """
    if not _DOC_TEXT.match(text) or "\\" in text or '"""' in text or text.endswith('"'):
        raise ExportError("docstring", "contains characters that cannot be written into a docstring")
    return '"""' + text + '"""'


class _Slot:
    """Marks a value already rendered as a literal (the docstring)."""

    def __init__(self, source: str):
        self.source = source


def _slot_source(name: str, value: Any) -> str:
    return value.source if isinstance(value, _Slot) else literal(value, where=name)


def _compare_trees(template: ast.AST, rendered: ast.AST, slots: set[str]) -> None:
    if isinstance(template, ast.Name) and template.id in slots:
        ast.literal_eval(rendered)  # raises ValueError for anything but a literal
        return
    if type(template) is not type(rendered):
        raise ValueError(f"{type(rendered).__name__} where the template has {type(template).__name__}")
    for name, expected in ast.iter_fields(template):
        actual = getattr(rendered, name, None)
        if isinstance(expected, list):
            if not isinstance(actual, list) or len(actual) != len(expected):
                raise ValueError(f"{type(template).__name__}.{name} differs in length")
            for e, a in zip(expected, actual):
                if isinstance(e, ast.AST):
                    _compare_trees(e, a, slots)
                elif e != a:
                    raise ValueError(f"{type(template).__name__}.{name}: {a!r} != {e!r}")
        elif isinstance(expected, ast.AST):
            _compare_trees(expected, actual, slots)
        elif expected != actual:
            raise ValueError(f"{type(template).__name__}.{name}: {actual!r} != {expected!r}")


def fill_template(template: str, values: dict[str, Any]) -> str:
    """Substitute ``$name`` slots of ``template`` with literals of ``values`` and prove that only
    literals were added (`check_only_literals`).

    Raises:
        ExportError: a value is not a plain literal, a slot has no value, or the result differs
            from the template anywhere but at its slots.
    """
    try:
        rendered = string.Template(template).substitute({k: _slot_source(k, v) for k, v in values.items()})
    except KeyError as exc:
        raise ExportError(str(exc.args[0]), "the template has a slot without a value") from None
    check_only_literals(template, rendered, set(values))
    return rendered


def check_only_literals(template: str, rendered: str, slots: set[str]) -> None:
    """Require ``rendered`` to be ``template`` with literals at the ``$slot`` positions only.

    Raises:
        ExportError: the syntax trees differ elsewhere, or a slot holds a non-literal.
    """
    placeholders = {name: f"__attnfuzz_slot_{name}__" for name in slots}
    try:
        template_tree = ast.parse(string.Template(template).substitute(placeholders))
        rendered_tree = ast.parse(rendered)
        _compare_trees(template_tree, rendered_tree, set(placeholders.values()))
    except (SyntaxError, ValueError) as exc:
        raise ExportError("repro", f"generated code failed the literal-only check: {exc}") from None


# ---------------------------------------------------------------------------------- snippets
@dataclass(frozen=True)
class CallSnippet:
    """How a repro calls one backend: source text with ``$name`` slots, and the slots' values.

    ``source`` must define ``check_environment()`` (calls ``pytest.skip`` with the reason when the
    package, CUDA or the GPU architecture is missing; may set environment variables the library
    reads) and ``call_backend(q, k, v, cu_seqlens_q, cu_seqlens_k) -> (out, lse)``: q, k, v are
    leaf tensors in the canonical layout (``[batch_size, seqlen, heads, dim]``, or ``[total,
    heads, dim]`` for thd, see `oracle.config`) on ``DEVICE`` in the case dtype; ``out`` must come
    back in the same layout and ``lse`` as ``[batch_size, num_heads, seqlen_q]`` (thd
    ``[num_heads, total_q]``) or None. The file's helpers (``library_layout``, ``canonical_lse``,
    ``require_cuda``, ``key_bounds``, ``visible_mask``) and case constants (``QKV_FORMAT``,
    ``NUM_HEADS`` ...) may be used.

    Attributes:
        source: the code, every value a ``$slot`` (never formatted in by hand).
        values: slot name -> plain value (written with `literal`).
        device: ``"cuda"`` or ``"cpu"``: where the inputs are built.
        packages: what to install, for the docstring (e.g. ``("flash-attn-4",)``).
        masked_row_lse: the lse the library documents for rows without a visible key when it is
            neither ``-inf`` nor ``+inf`` (PyTorch's CPU flash op: ``0.0``).
    """

    source: str
    values: dict[str, Any] = field(default_factory=dict)
    device: str = "cuda"
    packages: tuple[str, ...] = ()
    masked_row_lse: float | None = None


SnippetFactory = Callable[[AttentionCase, str], CallSnippet]
_SNIPPETS: dict[str, SnippetFactory] = {}


def register_snippet(backend: str, factory: SnippetFactory, *, replace: bool = False) -> None:
    """Make ``backend`` exportable: ``factory(case, variant)`` returns its `CallSnippet`.

    Raises:
        ExportError: ``backend`` is not a valid name, or already registered and not ``replace``.
    """
    if not NAME_PATTERN.match(backend):
        raise ExportError("backend", f"{backend!r} is not a backend name")
    if backend in _SNIPPETS and not replace:
        raise ExportError("backend", f"a snippet for {backend!r} is already registered")
    _SNIPPETS[backend] = factory


def unregister_snippet(backend: str) -> None:
    """Forget the snippet of ``backend`` (tests); nothing happens when there is none."""
    _SNIPPETS.pop(backend, None)


def snippet_factory(backend: str) -> SnippetFactory:
    """The registered snippet factory of ``backend``.

    Raises:
        ExportError: "no export for backend X" (``field`` ``backend``).
    """
    try:
        return _SNIPPETS[backend]
    except KeyError:
        known = ", ".join(sorted(_SNIPPETS))
        raise ExportError("backend", f"no export for backend {backend!r} (exportable: {known})") from None


def exportable_backends() -> list[str]:
    """Names with a registered snippet, sorted."""
    return sorted(_SNIPPETS)


def _translation(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ValueError as exc:
        raise ExportError("variant", str(exc)) from None


_FA4_SOURCE = '''
FA4_KWARGS = $fa4_kwargs
FA4_ARCH_MAJORS = $arch_majors


def check_environment():
    require_cuda(FA4_ARCH_MAJORS, "flash-attn-4")
    pytest.importorskip("flash_attn.cute.interface", reason="flash-attn-4 is not installed")


def call_backend(q, k, v, cu_seqlens_q, cu_seqlens_k):
    from flash_attn.cute import interface

    q, k, v = library_layout(q, k, v)
    if QKV_FORMAT == "thd":
        result = interface.flash_attn_varlen_func(
            q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, **FA4_KWARGS
        )
    else:
        result = interface.flash_attn_func(q, k, v, **FA4_KWARGS)
    if isinstance(result, (tuple, list)):
        return result[0], canonical_lse(result[1] if len(result) > 1 else None)
    return result, None
'''


def _fa4_snippet(case: AttentionCase, variant: str) -> CallSnippet:
    from fuzzer.backends.fa4 import FA4_ARCH_MAJORS, fa4_call_kwargs

    kwargs = _translation(lambda: fa4_call_kwargs(case, variant))
    return CallSnippet(
        source=_FA4_SOURCE,
        values={"fa4_kwargs": kwargs, "arch_majors": tuple(FA4_ARCH_MAJORS)},
        packages=("flash-attn-4",),
    )


_TE_SOURCE = '''
TE_ENVIRONMENT = $te_environment
TE_MODULE_KWARGS = $te_module_kwargs
TE_FORWARD_KWARGS = $te_forward_kwargs
TE_MIN_ARCH_MAJOR = $min_arch_major
TE_REQUIRED_MODULES = $required_modules


def check_environment():
    require_cuda(None, "TransformerEngine", min_major=TE_MIN_ARCH_MAJOR)
    # TE reads these on every backend selection; they pin the sub-backend the failure was seen on.
    os.environ.update(TE_ENVIRONMENT)
    pytest.importorskip("transformer_engine.pytorch", reason="transformer-engine is not installed")
    for module in TE_REQUIRED_MODULES:
        pytest.importorskip(module, reason=module + " is not installed (TE needs it for this sub-backend)")


def call_backend(q, k, v, cu_seqlens_q, cu_seqlens_k):
    import transformer_engine.pytorch as te

    module = te.DotProductAttention(**TE_MODULE_KWARGS).to(dtype=q.dtype, device=q.device)
    if QKV_FORMAT == "sbhd":
        q, k, v = (t.transpose(0, 1).contiguous() for t in (q, k, v))
    tensors = {"cu_seqlens_q": cu_seqlens_q, "cu_seqlens_kv": cu_seqlens_k} if QKV_FORMAT == "thd" else {}
    out = module(q, k, v, **tensors, **TE_FORWARD_KWARGS)
    out = out.reshape(*out.shape[: 1 if QKV_FORMAT == "thd" else 2], NUM_HEADS, HEAD_DIM_V)
    return (out.transpose(0, 1) if QKV_FORMAT == "sbhd" else out), None
'''

_TE_REQUIRED_MODULES = {"flash-attn-4": "flash_attn.cute", "flash-attn": "flash_attn"}


def _te_snippet_for(backend_class: type) -> SnippetFactory:
    def factory(case: AttentionCase, variant: str) -> CallSnippet:
        from fuzzer.backends.te import te_forward_kwargs, te_module_kwargs

        module_kwargs = _translation(lambda: te_module_kwargs(case, variant))
        forward_kwargs = _translation(lambda: te_forward_kwargs(case, variant))
        required = tuple(_TE_REQUIRED_MODULES[p] for p in backend_class.requires if p in _TE_REQUIRED_MODULES)
        return CallSnippet(
            source=_TE_SOURCE,
            values={
                "te_environment": dict(backend_class.env_vars),
                "te_module_kwargs": module_kwargs,
                "te_forward_kwargs": forward_kwargs,
                "min_arch_major": backend_class.min_arch_major,
                "required_modules": required,
            },
            packages=("transformer-engine[pytorch]", *backend_class.requires),
        )

    return factory


_FA2_SOURCE = '''
FA2_KWARGS = $fa2_kwargs


def check_environment():
    require_cuda(None, "flash-attn 2", min_major=8)
    pytest.importorskip("flash_attn", reason="flash-attn (FlashAttention 2) is not installed")


def call_backend(q, k, v, cu_seqlens_q, cu_seqlens_k):
    import flash_attn

    q, k, v = library_layout(q, k, v)
    if QKV_FORMAT == "thd":
        result = flash_attn.flash_attn_varlen_func(
            q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, **FA2_KWARGS
        )
    else:
        result = flash_attn.flash_attn_func(q, k, v, **FA2_KWARGS)
    if isinstance(result, (tuple, list)):
        return result[0], canonical_lse(result[1] if len(result) > 1 else None)
    return result, None
'''


def _fa2_snippet(case: AttentionCase, variant: str) -> CallSnippet:
    from fuzzer.backends.fa2 import fa2_call_kwargs

    kwargs = _translation(lambda: fa2_call_kwargs(case, variant))
    return CallSnippet(source=_FA2_SOURCE, values={"fa2_kwargs": kwargs}, packages=("flash-attn",))


_SDPA_SOURCE = '''
SDPA_DEVICE = $sdpa_device
SDPA_KERNEL = $sdpa_kernel


def check_environment():
    if SDPA_DEVICE == "cuda":
        require_cuda(None, "PyTorch SDPA on CUDA")


def _sdpa_mask(q, variant):
    if variant == "is_causal":
        return None, CAUSAL
    if variant == "causal_bias":
        from torch.nn.attention.bias import causal_lower_right, causal_upper_left

        make = causal_lower_right if CAUSAL_ALIGNMENT == "bottom_right" else causal_upper_left
        return make(SEQLEN_Q, SEQLEN_K), False
    visible = visible_mask(SEQLEN_Q, SEQLEN_K).to(q.device)
    if variant == "bool_mask":
        return visible, False
    additive = torch.zeros(visible.shape, dtype=q.dtype, device=q.device)
    return additive.masked_fill(~visible, -math.inf), False


def _aten_lse(q, k, v):
    group = NUM_HEADS // NUM_HEADS_KV
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    aten = torch.ops.aten
    has_window = WINDOW_SIZE_LEFT is not None or WINDOW_SIZE_RIGHT is not None
    has_mask = CAUSAL or has_window
    if SDPA_DEVICE == "cpu":
        mask = None
        if has_mask and not (CAUSAL and CAUSAL_ALIGNMENT == "top_left" and not has_window):
            mask = _sdpa_mask(q, "float_mask")[0]
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, CAUSAL and mask is None, attn_mask=mask, scale=SOFTMAX_SCALE
        )
        return out, lse
    if SDPA_KERNEL == "FLASH_ATTENTION":
        res = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, CAUSAL, False, scale=SOFTMAX_SCALE)
        return res[0], res[1]
    if SDPA_KERNEL == "EFFICIENT_ATTENTION":
        bias = None
        if has_mask:
            mask = _sdpa_mask(q, "float_mask")[0]
            pad = (-mask.shape[-1]) % 16
            padded = torch.nn.functional.pad(mask, (0, pad))[..., : mask.shape[-1]]
            bias = padded.expand(q.shape[0], q.shape[1], -1, -1)
        res = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, False, scale=SOFTMAX_SCALE)
        return res[0], res[1][..., : q.shape[2]]
    res = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, CAUSAL, False, scale=SOFTMAX_SCALE)
    return res[0], res[1].reshape(q.shape[0], q.shape[1], q.shape[2])


def call_backend(q, k, v, cu_seqlens_q, cu_seqlens_k):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def to_sdpa(t):  # canonical [b, s, h, d] -> SDPA's [b, h, s, d]; sbhd callers pass strided views
        if QKV_FORMAT == "sbhd":
            return t.transpose(0, 1).contiguous().permute(1, 2, 0, 3)
        return t.transpose(1, 2)

    qs, ks, vs = to_sdpa(q), to_sdpa(k), to_sdpa(v)
    if VARIANT == "aten_lse":
        out, lse = _aten_lse(qs, ks, vs)
    else:
        mask, is_causal = _sdpa_mask(qs, VARIANT)
        with sdpa_kernel(getattr(SDPBackend, SDPA_KERNEL)):
            out = torch.nn.functional.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=mask, is_causal=is_causal, scale=SOFTMAX_SCALE,
                enable_gqa=NUM_HEADS != NUM_HEADS_KV,
            )
        lse = None
    return out.transpose(1, 2), lse
'''

_SDPA_KERNELS = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}


def _sdpa_snippet_for(name: str, device: str, kernel: str, variants: tuple[str, ...], masked_row_lse: Any) -> SnippetFactory:
    def factory(case: AttentionCase, variant: str) -> CallSnippet:
        if variant not in variants:
            raise ExportError("variant", f"unknown variant {variant!r} of {name} (allowed: {', '.join(variants)})")
        return CallSnippet(
            source=_SDPA_SOURCE,
            values={"sdpa_device": device, "sdpa_kernel": _SDPA_KERNELS[kernel]},
            device=device,
            packages=(),
            masked_row_lse=masked_row_lse,
        )

    return factory


def _register_builtins() -> None:
    from fuzzer.backends import sdpa, te

    register_snippet("fa4", _fa4_snippet, replace=True)
    register_snippet("fa2", _fa2_snippet, replace=True)
    for backend_class in (te.TEFA4Backend, te.TEFA2Backend, te.TEFusedBackend, te.TEUnfusedBackend):
        register_snippet(backend_class.name, _te_snippet_for(backend_class), replace=True)
    for backend in sdpa.builtin_backends():
        if isinstance(backend, sdpa.SDPABackend):
            factory = _sdpa_snippet_for(
                backend.name, backend.device, backend.kernel, tuple(backend.variants), backend.masked_row_lse
            )
            register_snippet(backend.name, factory, replace=True)


_register_builtins()


# ---------------------------------------------------------------------------------- the file
_INPUT_FUNCTIONS = ("_mix32", "_horner", "_sqrt", "hash_normal")

_HEADER = '''$docstring

from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch")

# ---------------------------------------------------------------------------------- the case
CASE_ID = $case_id
BACKEND = $backend
VARIANT = $variant
SIGNATURE = $signature
BATCH_SIZE = $batch_size
SEQLEN_Q = $seqlen_q
SEQLEN_K = $seqlen_k
SEQLENS_Q = $seqlens_q
SEQLENS_K = $seqlens_k
NUM_HEADS = $num_heads
NUM_HEADS_KV = $num_heads_kv
HEAD_DIM = $head_dim
HEAD_DIM_V = $head_dim_v
DTYPE = $dtype
QKV_FORMAT = $qkv_format
CAUSAL = $causal
CAUSAL_ALIGNMENT = $causal_alignment
WINDOW_SIZE_LEFT = $window_size_left
WINDOW_SIZE_RIGHT = $window_size_right
SOFTMAX_SCALE = $softmax_scale
SOFTCAP = $softcap
BACKWARD = $backward
INPUT_DISTRIBUTION = $input_distribution
SEED = $seed
DEVICE = $device

# Allowed L2 error per tensor (see the module docstring) and what it was computed from.
ALLOWED = $allowed
TOLERANCE_FACTORS = $tolerance_factors
MASKED_ROW_LSE = $masked_row_lse

# ------------------------------------------------------------- inputs (attnfuzz oracle/inputs.py)
_M32 = $m32
_COS_COEFFS = $cos_coeffs
_ATANH_COEFFS = $atanh_coeffs
STREAM_Q, STREAM_K, STREAM_V, STREAM_DOUT = $streams_qkvd
STREAM_Q_OUTLIERS, STREAM_K_OUTLIERS, STREAM_K_BASE = $streams_extra
LARGE_LOGITS_STD = $large_logits_std
MAX_Q_GAIN = $max_q_gain
OUTLIER_Z = $outlier_z
OUTLIER_GAIN = $outlier_gain
NEAR_CONSTANT_NOISE = $near_constant_noise

'''

_RUNTIME = '''

def make_inputs(device):
    """q, k, v, dout in the canonical layout (bit-identical to attnfuzz), cu_seqlens for thd."""
    dtype = getattr(torch, DTYPE)
    if QKV_FORMAT == "thd":
        rows_q, rows_k = (sum(SEQLENS_Q),), (sum(SEQLENS_K),)
    else:
        rows_q, rows_k = (BATCH_SIZE, SEQLEN_Q), (BATCH_SIZE, SEQLEN_K)
    shape_q = (*rows_q, NUM_HEADS, HEAD_DIM)
    shape_k = (*rows_k, NUM_HEADS_KV, HEAD_DIM)
    shape_v = (*rows_k, NUM_HEADS_KV, HEAD_DIM_V)
    shape_out = (*rows_q, NUM_HEADS, HEAD_DIM_V)

    def normal(stream, shape):
        return hash_normal(SEED, stream, math.prod(shape), device).view(shape)

    q, k = normal(STREAM_Q, shape_q), normal(STREAM_K, shape_k)
    if INPUT_DISTRIBUTION == "large_logits":
        q = q * min(LARGE_LOGITS_STD / (SOFTMAX_SCALE * math.sqrt(HEAD_DIM)), MAX_Q_GAIN)
    elif INPUT_DISTRIBUTION == "outliers":
        q = torch.where(normal(STREAM_Q_OUTLIERS, shape_q).abs() > OUTLIER_Z, q * OUTLIER_GAIN, q)
        k = torch.where(normal(STREAM_K_OUTLIERS, shape_k).abs() > OUTLIER_Z, k * OUTLIER_GAIN, k)
    elif INPUT_DISTRIBUTION == "near_constant":
        base = normal(STREAM_K_BASE, (NUM_HEADS_KV, HEAD_DIM)).to(torch.bfloat16).to(torch.float64)
        k = base * (1.0 + NEAR_CONSTANT_NOISE * k.clamp(-1.0, 1.0))
    v, dout = normal(STREAM_V, shape_v), normal(STREAM_DOUT, shape_out)
    cu_seqlens_q = cu_seqlens_k = None
    if QKV_FORMAT == "thd":
        cu_seqlens_q = torch.tensor([0, *torch.tensor(SEQLENS_Q).cumsum(0).tolist()], dtype=torch.int32, device=device)
        cu_seqlens_k = torch.tensor([0, *torch.tensor(SEQLENS_K).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return q.to(dtype), k.to(dtype), v.to(dtype), dout.to(dtype), cu_seqlens_q, cu_seqlens_k


# ---------------------------------------------------------------- mask (attnfuzz oracle/masks.py)
def key_bounds(seqlen_q, seqlen_k):
    """Row i of one sequence sees keys lo[i] <= j < hi[i]; the diagonal is at i + offset with
    offset 0 (top_left) or seqlen_k - seqlen_q (bottom_right); causal caps the right bound there."""
    rows = torch.arange(seqlen_q, dtype=torch.int64)
    diagonal = rows + (0 if CAUSAL_ALIGNMENT == "top_left" else seqlen_k - seqlen_q)
    if CAUSAL:
        right = diagonal
    elif WINDOW_SIZE_RIGHT is not None:
        right = diagonal + WINDOW_SIZE_RIGHT
    else:
        right = torch.full_like(rows, seqlen_k - 1)
    left = diagonal - WINDOW_SIZE_LEFT if WINDOW_SIZE_LEFT is not None else torch.zeros_like(rows)
    return left.clamp(0, seqlen_k), (right + 1).clamp(0, seqlen_k)


def visible_mask(seqlen_q, seqlen_k):
    """[seqlen_q, seqlen_k] bool: True where the query row may attend the key."""
    lo, hi = key_bounds(seqlen_q, seqlen_k)
    cols = torch.arange(seqlen_k, dtype=torch.int64)
    return (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])


# ------------------------------------------------------------------ float64 reference (dense)
def _attend(q, k, v, dout):
    """One sequence: q [sq, h, d], k [sk, hkv, d], v [sk, hkv, dv], dout [sq, h, dv], float64.
    Returns out [sq, h, dv], lse [h, sq] (-inf on rows without a visible key), dq, dk, dv."""
    group = NUM_HEADS // NUM_HEADS_KV
    k_heads, v_heads = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k_heads) * SOFTMAX_SCALE
    tanh = None
    if SOFTCAP is not None:
        tanh = torch.tanh(scores / SOFTCAP)
        scores = SOFTCAP * tanh
    visible = visible_mask(q.shape[0], k.shape[0]).to(q.device)
    scores = scores.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    out = torch.einsum("hqk,khd->qhd", probs, v_heads)
    if dout is None:
        return out, lse, None, None, None
    # FlashAttention-2 (arXiv:2307.08691) Algorithm 2: D = rowsum(dO * O), dS = P * (dP - D).
    delta = (dout * out).sum(-1).transpose(0, 1)
    dscores = probs * (torch.einsum("qhd,khd->hqk", dout, v_heads) - delta[..., None])
    if tanh is not None:
        dscores = dscores * (1.0 - tanh * tanh)
    dq = torch.einsum("hqk,khd->qhd", dscores, k_heads) * SOFTMAX_SCALE
    dk = torch.einsum("hqk,qhd->khd", dscores, q) * SOFTMAX_SCALE
    dv = torch.einsum("hqk,qhd->khd", probs, dout)
    dk = dk.reshape(k.shape[0], NUM_HEADS_KV, group, -1).sum(2)
    dv = dv.reshape(k.shape[0], NUM_HEADS_KV, group, -1).sum(2)
    return out, lse, dq, dk, dv


def reference(q, k, v, dout):
    """Float64 out, lse, dq, dk, dv in the canonical layout (lse [b, h, sq], thd [h, total_q])."""
    q, k, v, dout = (t.to(torch.float64) for t in (q, k, v, dout))
    if not BACKWARD:
        dout = None
    if QKV_FORMAT == "thd":
        starts_q = [sum(SEQLENS_Q[:i]) for i in range(BATCH_SIZE)]
        starts_k = [sum(SEQLENS_K[:i]) for i in range(BATCH_SIZE)]
        pieces = [
            _attend(
                q[sq:sq + nq], k[sk:sk + nk], v[sk:sk + nk], None if dout is None else dout[sq:sq + nq]
            )
            for sq, nq, sk, nk in zip(starts_q, SEQLENS_Q, starts_k, SEQLENS_K)
        ]
        stack = {"out": 0, "lse": 1, "dq": 0, "dk": 0, "dv": 0}
    else:
        pieces = [_attend(q[b], k[b], v[b], None if dout is None else dout[b]) for b in range(BATCH_SIZE)]
        stack = None
    result = {}
    for i, name in enumerate(("out", "lse", "dq", "dk", "dv")):
        parts = [p[i] for p in pieces]
        if parts[0] is None:
            result[name] = None
        elif stack is not None:
            result[name] = torch.cat(parts, dim=stack[name])
        else:
            result[name] = torch.stack(parts)
    return result


# --------------------------------------------------------------------------- library helpers
def require_cuda(arch_majors, what, min_major=None):
    """Skip unless a CUDA GPU of a suitable architecture is present."""
    if not torch.cuda.is_available():
        pytest.skip(what + " needs a CUDA GPU (torch.cuda.is_available() is False)")
    major = torch.cuda.get_device_capability()[0]
    if arch_majors is not None and major not in arch_majors:
        pytest.skip(f"{what} targets compute capability major {arch_majors}, this GPU is sm{major}x")
    if min_major is not None and major < min_major:
        pytest.skip(f"{what} needs compute capability >= {min_major}.0, this GPU is sm{major}x")


def library_layout(q, k, v):
    """bshd and thd as they are; sbhd as [b, s, h, d] strided views of [s, b, h, d] memory."""
    if QKV_FORMAT != "sbhd":
        return q, k, v
    return tuple(t.transpose(0, 1).contiguous().transpose(0, 1) for t in (q, k, v))


def canonical_lse(lse):
    """A library lse as [b, h, sq] (thd: [h, total_q]); accepts [b, sq, h] / [total_q, h] and the
    padded [b, h, max_seqlen_q] of older varlen kernels."""
    if lse is None:
        return None
    lse = lse.detach()
    shape = tuple(lse.shape)
    if QKV_FORMAT != "thd":
        if shape == (BATCH_SIZE, SEQLEN_Q, NUM_HEADS) and SEQLEN_Q != NUM_HEADS:
            return lse.transpose(1, 2)
        return lse
    total_q = sum(SEQLENS_Q)
    if shape == (total_q, NUM_HEADS) and total_q != NUM_HEADS:
        return lse.transpose(0, 1)
    if shape == (BATCH_SIZE, NUM_HEADS, SEQLEN_Q):
        return torch.cat([lse[i, :, :n] for i, n in enumerate(SEQLENS_Q)], dim=1)
    return lse

'''

_JUDGE = '''

# ------------------------------------------------------------------------------------ judging
SEVERITY = ("shape", "nan", "posinf", "neginf", "all_zero", "finite_on_masked", "mismatch")


def check_tensor(name, actual, expected):
    """attnfuzz's invariants and global tolerance for one tensor: (signatures, err, allowed)."""
    if tuple(actual.shape) != tuple(expected.shape):
        return [name + ":shape"], math.nan, ALLOWED[name]
    actual = actual.detach().to("cpu", torch.float64)
    expected = expected.to("cpu")
    masked = ~torch.isfinite(expected)  # lse of rows that see no key (-inf); nothing else
    if name == "lse" and MASKED_ROW_LSE is not None:
        actual = torch.where(masked & (actual == MASKED_ROW_LSE), -math.inf, actual)
    finite = ~masked
    kinds = set()
    if torch.isnan(actual).any():
        kinds.add("nan")
    if ((actual == math.inf) & finite).any():
        kinds.add("posinf")
    if ((actual == -math.inf) & finite).any():
        kinds.add("neginf")
    if (masked & torch.isfinite(actual)).any():
        kinds.add("finite_on_masked")
    both = finite & torch.isfinite(actual)
    err = float(torch.where(both, actual - torch.where(finite, expected, 0.0), 0.0).norm())
    allowed = ALLOWED[name]
    if err > allowed:
        kinds.add("mismatch")
        if finite.any() and not (actual[finite] != 0).any():
            kinds.add("all_zero")
    return [name + ":" + kind for kind in SEVERITY if kind in kinds], err, allowed


def test_attnfuzz_repro():
    check_environment()
    q, k, v, dout, cu_seqlens_q, cu_seqlens_k = make_inputs(DEVICE)
    expected = reference(q, k, v, dout)
    leaves = [t.detach().clone().requires_grad_(BACKWARD) for t in (q, k, v)]
    with torch.set_grad_enabled(BACKWARD):
        out, lse = call_backend(*leaves, cu_seqlens_q, cu_seqlens_k)
    grads = (None, None, None)
    if BACKWARD:
        out.backward(dout)
        grads = tuple(t.grad for t in leaves)
    found, lines = [], []
    for name, actual in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads)):
        if actual is None or expected[name] is None:
            continue
        signatures, err, allowed = check_tensor(name, actual, expected[name])
        found.extend(signatures)
        lines.append(f"{name}: L2 error {err:.4g}, allowed {allowed:.4g}")
    assert not found, (
        f"attnfuzz {BACKEND}/{VARIANT}: {', '.join(found)} (recorded signature {SIGNATURE}, "
        f"case {CASE_ID}); " + "; ".join(lines)
    )
'''


@dataclass(frozen=True)
class Repro:
    """A generated repro: a file name and the source text."""

    filename: str
    source: str


def allowed_errors(case: AttentionCase) -> dict[str, float]:
    """The allowed global L2 error per tensor (out, lse and with backward dq, dk, dv) of
    `oracle.compare`'s model for the case's inputs, computed with the float64 oracle on the CPU.

    Cost: one oracle reference of the case (milliseconds for minimised cases; seconds for cases
    with ~1e9 score entries).
    """
    from oracle.compare import compare_outputs
    from oracle.inputs import make_inputs
    from oracle.reference import reference

    ref = reference(case, make_inputs(case, device="cpu"), backward=case.backward, engine="torch")
    verdict = compare_outputs(case, ref, out=ref.out, lse=ref.lse, dq=ref.dq, dk=ref.dk, dv=ref.dv)
    return {name: float(tv.allowed) for name, tv in verdict.tensors.items()}


def validated_case(config: Any) -> AttentionCase:
    """The stored case JSON validated again.

    Raises:
        ExportError: ``field`` ``case.<name>`` for the offending field.
    """
    try:
        return AttentionCase.from_json(config)
    except CaseValidationError as exc:
        name = getattr(exc, "field", None) or "config"
        raise ExportError(f"case.{name}", f"the stored case does not validate: {exc}") from None


def repro_filename(backend: str, variant: str, case_id: str) -> str:
    """``test_attnfuzz_<backend>_<variant>_<case_id>.py`` (``-``, ``.`` and ``+`` become ``_``)."""
    clean = re.sub(r"[^A-Za-z0-9_]", "_", f"{backend}_{variant}")
    return f"test_attnfuzz_{clean}_{case_id}.py"


def render_repro(
    case: AttentionCase,
    backend: str,
    variant: str,
    signature: str | None,
    *,
    allowed: dict[str, float] | None = None,
) -> Repro:
    """The standalone pytest file reproducing ``case`` on ``backend``/``variant``.

    Args:
        case: the (minimised) case.
        backend: backend name with a registered snippet (`register_snippet`).
        variant: the API variant the failure was seen with.
        signature: the recorded failure signature (named in the assertion message), or None when
            the case is exported as a plain regression test.
        allowed: per-tensor allowed L2 errors; default `allowed_errors(case)`.

    Returns:
        `Repro` (file name and source).

    Raises:
        ExportError: a name or signature of the wrong form, no snippet for ``backend``, a variant
            the backend cannot encode the case with, or a value that is not a plain literal.
    """
    if not isinstance(backend, str) or not NAME_PATTERN.match(backend):
        raise ExportError("backend", f"{str(backend)[:80]!r} is not a backend name")
    if not isinstance(variant, str) or not NAME_PATTERN.match(variant):
        raise ExportError("variant", f"{str(variant)[:80]!r} is not a variant name")
    if signature is not None and (not isinstance(signature, str) or not SIGNATURE_PATTERN.match(signature)):
        raise ExportError("signature", f"{str(signature)[:80]!r} is not a signature like 'out:all_zero'")
    if not isinstance(case, AttentionCase):
        raise ExportError("case", "must be an AttentionCase")
    if case.cp_size != 1:
        raise ExportError("case.cp_size", "context-parallel cases (cp_size > 1) cannot be exported")
    snippet = snippet_factory(backend)(case, variant)
    if not isinstance(snippet, CallSnippet):
        raise ExportError("backend", f"the snippet factory of {backend!r} did not return a CallSnippet")
    allowed = allowed_errors(case) if allowed is None else allowed

    from oracle import compare, inputs

    packages = ", ".join(("torch", "pytest", *snippet.packages))
    factors = compare.TOLERANCE_FACTORS[case.dtype]
    doc = textwrap.dedent(
        f"""\
        attnfuzz repro: {backend} / {variant} / {signature or "(no recorded failure)"}, case {case.case_id}.

        {case.describe()}

        Standalone: needs only {packages}; skips with the reason when the package, a CUDA GPU or
        the GPU architecture is missing. Run it with plain pytest.

        What it does: regenerates the inputs bit for bit (attnfuzz's counter-based hash_normal,
        copied below), calls {backend} exactly as the variant {variant!s} did (call_backend), computes
        a dense float64 reference inline (reference) and checks, per tensor (out, lse, dq, dk, dv):
        no NaN, no +-inf where the reference is finite, lse infinite exactly on rows that see no
        key, not all zero, and the tolerance.

        Tolerance: the L2 error over the whole tensor must be <= ALLOWED[tensor], which is
        attnfuzz's error model (oracle/compare.py) evaluated on these inputs when this file was
        generated: factor * max(||round_dtype(R) - R||_2, u * ||sigma||_2) + floor * sqrt(numel),
        with R the float64 reference, round_dtype the rounding to {case.dtype} (float32 for lse), u
        that dtype's unit roundoff, sigma the first-order rounding error of an fp32-accumulating
        kernel per row, and factor TOLERANCE_FACTORS[tensor] for {case.dtype}. attnfuzz also checks
        tiles of 64 rows; this file checks whole tensors only.

        A failure names the signatures found; the recorded one is SIGNATURE.
        """
    )
    values: dict[str, Any] = {
        "docstring": _Slot(docstring_literal(doc.rstrip() + "\n")),
        "case_id": case.case_id,
        "backend": backend,
        "variant": variant,
        "signature": signature,
        "batch_size": case.batch_size,
        "seqlen_q": case.seqlen_q,
        "seqlen_k": case.seqlen_k,
        "seqlens_q": tuple(case.seqlens_q_list),
        "seqlens_k": tuple(case.seqlens_k_list),
        "num_heads": case.num_heads,
        "num_heads_kv": case.num_heads_kv,
        "head_dim": case.head_dim,
        "head_dim_v": case.head_dim_v,
        "dtype": case.dtype,
        "qkv_format": case.qkv_format,
        "causal": case.causal,
        "causal_alignment": case.causal_alignment,
        "window_size_left": case.window_size_left,
        "window_size_right": case.window_size_right,
        "softmax_scale": case.softmax_scale,
        "softcap": case.softcap,
        "backward": case.backward,
        "input_distribution": case.input_distribution,
        "seed": case.seed,
        "device": snippet.device,
        "allowed": {name: float(allowed[name]) for name in TENSOR_NAMES if name in allowed},
        "tolerance_factors": {name: float(value) for name, value in factors.items()},
        "masked_row_lse": snippet.masked_row_lse,
        "m32": inputs._M32,
        "cos_coeffs": list(inputs._COS_COEFFS),
        "atanh_coeffs": list(inputs._ATANH_COEFFS),
        "streams_qkvd": (inputs.STREAM_Q, inputs.STREAM_K, inputs.STREAM_V, inputs.STREAM_DOUT),
        "streams_extra": (inputs.STREAM_Q_OUTLIERS, inputs.STREAM_K_OUTLIERS, inputs.STREAM_K_BASE),
        "large_logits_std": inputs.LARGE_LOGITS_STD,
        "max_q_gain": inputs.MAX_Q_GAIN,
        "outlier_z": inputs.OUTLIER_Z,
        "outlier_gain": inputs.OUTLIER_GAIN,
        "near_constant_noise": inputs.NEAR_CONSTANT_NOISE,
    }
    overlap = set(values) & set(snippet.values)
    if overlap:
        raise ExportError("backend", f"snippet slots {sorted(overlap)} clash with the file's own")
    values.update(snippet.values)
    copied = "\n\n".join(inspect.getsource(getattr(inputs, name)) for name in _INPUT_FUNCTIONS)
    template = (
        _HEADER
        + copied.replace("$", "$$")
        + _RUNTIME
        + "\n# ------------------------------------------------------------------- the backend call\n"
        + textwrap.dedent(snippet.source)
        + _JUDGE
    )
    return Repro(filename=repro_filename(backend, variant, case.case_id), source=fill_template(template, values))


__all__ = [
    "CallSnippet",
    "ExportError",
    "Repro",
    "allowed_errors",
    "check_only_literals",
    "docstring_literal",
    "exportable_backends",
    "fill_template",
    "literal",
    "register_snippet",
    "render_repro",
    "repro_filename",
    "snippet_factory",
    "unregister_snippet",
    "validated_case",
]
