"""`AttentionCase`: the frozen, validated description of one attention test case.

Both the oracle and the fuzzer need it, so it lives in `oracle` (which imports nothing of ours).

Conventions (the single place they are written down; the mask itself is in `oracle/masks.py`):

* Dimensions: ``batch_size, seqlen_q, seqlen_k, num_heads, num_heads_kv, head_dim, head_dim_v``.
  ``num_heads % num_heads_kv == 0``; query head ``h`` reads key/value head ``h // (num_heads //
  num_heads_kv)`` (GQA/MQA grouping as in FlashAttention and TransformerEngine).
* ``qkv_format``: ``"bshd"`` and ``"sbhd"`` describe how a backend is *called*; the canonical
  tensors handed to every backend and to the oracle are ``[batch_size, seqlen, heads, dim]`` for
  both. ``"thd"`` is the packed varlen form ``[total, heads, dim]`` with ``cu_seqlens_q/k``
  (int32, length ``batch_size + 1``, starting at 0); then ``seqlens_q``/``seqlens_k`` give the
  per-sequence lengths and ``seqlen_q``/``seqlen_k`` are their maxima (``max_seqlen_q/k``).
* Mask: ``causal`` plus ``causal_alignment`` in {"top_left", "bottom_right"}. The alignment places
  the diagonal for *both* the causal bound and the window bounds: offset ``0`` (top-left) or
  ``seqlen_k - seqlen_q`` per sequence (bottom-right). ``window_size_left`` / ``window_size_right``
  are ``int >= 0`` counted in tokens, ``None`` = unbounded. No ``-1`` sentinel exists here: the
  seed bug lives in such sentinels, so adapters translate at the API boundary.
* ``softmax_scale`` multiplies q.k^T; ``None`` resolves to ``head_dim ** -0.5`` at construction.
  ``softcap`` (``None`` = off) applies ``softcap * tanh(s / softcap)`` to the scaled scores
  (Gemma 2 convention, as in flash-attention ``flash_attn_func(softcap=...)``).
* ``lse`` is the natural-log logsumexp of the (scaled, capped, masked) scores.
* If ``causal_alignment`` has no effect (not causal and no window), it is stored as "top_left" so
  that equal cases hash equally.

Source: FlashAttention 2 README ("causal ... aligned to the bottom right corner", windows
``[i + seqlen_k - seqlen_q - window_size[0], i + seqlen_k - seqlen_q + window_size[1]]``);
TransformerEngine ``dot_product_attention/utils.py`` (``causal`` = top-left,
``causal_bottom_right``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Literal, get_args

from oracle import mask_kinds
from oracle.errors import CaseValidationError

SCHEMA_VERSION = 1

# The choice fields of `AttentionCase`: each is one ``Literal`` (its type, so a JSON schema of the
# case carries the enum) and the tuple of its values read from it (the checks and the draws).
DType = Literal["bfloat16", "float16", "float32"]
QkvFormat = Literal["bshd", "sbhd", "thd"]
CausalAlignment = Literal["top_left", "bottom_right"]
InputDistribution = Literal["normal", "large_logits", "outliers", "near_constant"]
DoutDistribution = Literal["normal", "tiny", "large", "sparse"]
ScoreOffsetMode = Literal["head", "row"]
CPCommType = Literal["p2p", "all_gather", "a2a", "a2a+p2p"]
DTYPES: tuple[str, ...] = get_args(DType)
QKV_FORMATS: tuple[str, ...] = get_args(QkvFormat)
CAUSAL_ALIGNMENTS: tuple[str, ...] = get_args(CausalAlignment)
INPUT_DISTRIBUTIONS: tuple[str, ...] = get_args(InputDistribution)
# Input families (`oracle.inputs` documents each): fields of `AttentionCase` that default to "off"
# and are left out of the JSON (hence of ``case_id``) at these defaults, so every case stored
# before they existed keeps its JSON and id.
DOUT_DISTRIBUTIONS: tuple[str, ...] = get_args(DoutDistribution)
SCORE_OFFSET_MODES: tuple[str, ...] = get_args(ScoreOffsetMode)
MAX_SCORE_OFFSET = 256.0  # nats
MAX_SEQ_SCALE_LOG2 = 3
MAX_QK_RANK = MAX_MASSIVE_CHANNELS = 64  # both act as min(value, head_dim): a shrunk head_dim stays valid
INPUT_FAMILY_DEFAULTS: dict[str, Any] = {
    "score_offset": 0.0,
    "score_offset_mode": "head",
    "qk_rank": 0,
    "massive_channels": 0,
    "attention_sink": False,
    "seq_scale_log2": 0,
    "peaked_rows": 0.0,
    "dout_distribution": "normal",
}
CP_COMM_TYPES: tuple[str, ...] = get_args(CPCommType)


def cp_heads_unit(cp_size: int, cp_comm_type: str | None) -> int:
    """How many ranks split the heads under context parallelism: ``num_heads`` and
    ``num_heads_kv`` must be multiples of it. ``a2a`` splits heads over all ``cp_size`` ranks,
    ``a2a+p2p`` over pairs of ranks (2); the other comm types keep every head (1). Convention of
    TransformerEngine's ``context_parallel.py`` (``attn_forward_func_with_cp``)."""
    return {"a2a": cp_size, "a2a+p2p": 2}.get(cp_comm_type, 1)

MAX_HEAD_DIM = 1024
MAX_SEED = 2**32 - 1
MAX_INT32 = 2**31 - 1
"""Largest ``seqlen_q``/``seqlen_k``, total token count and window size: the kernels hold token
counts, ``cu_seqlens`` and window bounds in int32 (FlashAttention ``Flash_fwd_params``,
TransformerEngine ``cu_seqlens`` tensors)."""
MAX_GRID_DIM = 65535
"""Largest ``batch_size`` and ``num_heads``: FlashAttention 2/4 and cuDNN launch one CUDA grid
row per batch item and head (``gridDim.y``/``gridDim.z`` <= 65535)."""
MAX_ORACLE_BYTES_ENV = "ATTNFUZZ_MAX_ORACLE_BYTES"
DEFAULT_MAX_ORACLE_BYTES = 8 * 2**30
"""Default bound on `AttentionCase.oracle_working_set_bytes` (8 GiB); raise it with
``$ATTNFUZZ_MAX_ORACLE_BYTES`` (bytes) on a machine with more memory."""


def max_oracle_bytes() -> int:
    """The configured bound on a case's float64 oracle working set, in bytes:
    ``$ATTNFUZZ_MAX_ORACLE_BYTES`` (a positive int), else `DEFAULT_MAX_ORACLE_BYTES`.

    Raises:
        CaseValidationError: the variable is set but not a positive integer.
    """
    import os

    raw = os.environ.get(MAX_ORACLE_BYTES_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_MAX_ORACLE_BYTES
    try:
        value = int(raw.strip().replace("_", ""))
    except ValueError:
        value = 0
    if value <= 0:
        raise CaseValidationError(MAX_ORACLE_BYTES_ENV, f"not a positive number of bytes: {raw!r}", "an int > 0")
    return value


def _check_int(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CaseValidationError(name, f"must be an int, got {type(value).__name__} {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f"{lo} <= {name}" + (f" <= {hi}" if hi is not None else "")
        raise CaseValidationError(name, f"out of range: {value}", bound)


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise CaseValidationError(name, f"unknown value {value!r}", ", ".join(choices))


@dataclass(frozen=True)
class AttentionCase:
    """One attention configuration: shapes, layout, mask, scaling, dtype, inputs and seed.

    Immutable and validated in ``__post_init__``; ``to_json``/``from_json`` round-trip exactly and
    ``case_id`` is a content hash, so the same case has the same id on every machine.

    Raises:
        CaseValidationError: a field is of the wrong type or out of range, or fields contradict
            each other (e.g. ``num_heads`` not divisible by ``num_heads_kv``). The error names the
            field and the allowed values.
    """

    batch_size: int = 1
    seqlen_q: int = 1
    seqlen_k: int = 1
    num_heads: int = 1
    num_heads_kv: int | None = None  # None -> num_heads
    head_dim: int = 64
    head_dim_v: int | None = None  # None -> head_dim
    dtype: DType = "bfloat16"
    qkv_format: QkvFormat = "bshd"
    seqlens_q: tuple[int, ...] | None = None
    seqlens_k: tuple[int, ...] | None = None
    causal: bool = False
    causal_alignment: CausalAlignment = "top_left"
    window_size_left: int | None = None
    window_size_right: int | None = None
    softmax_scale: float | None = None  # None -> head_dim ** -0.5
    softcap: float | None = None
    backward: bool = True
    input_distribution: InputDistribution = "normal"
    seed: int = 0
    cp_size: int = 1
    cp_comm_type: CPCommType | None = None
    # input families (see INPUT_FAMILY_DEFAULTS and `oracle.inputs`); defaults = off
    score_offset: float = 0.0
    score_offset_mode: ScoreOffsetMode = "head"
    qk_rank: int = 0
    massive_channels: int = 0
    attention_sink: bool = False
    seq_scale_log2: int = 0
    peaked_rows: float = 0.0
    dout_distribution: DoutDistribution = "normal"

    def __post_init__(self) -> None:
        s = object.__setattr__
        for name, hi in (("batch_size", MAX_GRID_DIM), ("seqlen_q", MAX_INT32), ("seqlen_k", MAX_INT32),
                         ("num_heads", MAX_GRID_DIM)):
            _check_int(name, getattr(self, name), 1, hi)
        if self.num_heads_kv is None:
            s(self, "num_heads_kv", self.num_heads)
        _check_int("num_heads_kv", self.num_heads_kv, 1, MAX_GRID_DIM)
        if self.num_heads % self.num_heads_kv:
            raise CaseValidationError(
                "num_heads_kv",
                f"num_heads={self.num_heads} is not divisible by num_heads_kv={self.num_heads_kv}",
                "a divisor of num_heads",
            )
        _check_int("head_dim", self.head_dim, 1, MAX_HEAD_DIM)
        if self.head_dim_v is None:
            s(self, "head_dim_v", self.head_dim)
        _check_int("head_dim_v", self.head_dim_v, 1, MAX_HEAD_DIM)
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("qkv_format", self.qkv_format, QKV_FORMATS)
        self._check_seqlens()
        for name in ("causal", "backward"):
            if not isinstance(getattr(self, name), bool):
                raise CaseValidationError(name, f"must be a bool, got {getattr(self, name)!r}", "true, false")
        _check_choice("causal_alignment", self.causal_alignment, CAUSAL_ALIGNMENTS)
        for name in ("window_size_left", "window_size_right"):
            value = getattr(self, name)
            if value is not None:
                _check_int(name, value, 0, MAX_INT32)
        if not self.causal and self.window_size_left is None and self.window_size_right is None:
            s(self, "causal_alignment", "top_left")
        if self.softmax_scale is None:
            s(self, "softmax_scale", float(self.head_dim) ** -0.5)
        s(self, "softmax_scale", self._finite_float("softmax_scale", self.softmax_scale, positive=True))
        if self.softcap is not None:
            s(self, "softcap", self._finite_float("softcap", self.softcap, positive=True))
        _check_choice("input_distribution", self.input_distribution, INPUT_DISTRIBUTIONS)
        _check_int("seed", self.seed, 0, MAX_SEED)
        _check_int("cp_size", self.cp_size, 1, 64)
        if self.cp_size == 1:
            if self.cp_comm_type is not None:
                raise CaseValidationError("cp_comm_type", "must be null when cp_size == 1", "null")
        else:
            _check_choice("cp_comm_type", self.cp_comm_type, CP_COMM_TYPES)
            if self.cp_comm_type == "a2a+p2p" and self.cp_size < 4:
                raise CaseValidationError("cp_comm_type", "a2a+p2p needs cp_size >= 4", "p2p, all_gather, a2a")
        self._check_input_families()
        self.check_resources()

    def _check_input_families(self) -> None:
        """Validate and canonicalise the input-family fields (`oracle.inputs` describes them).

        ``score_offset`` in ``[-MAX_SCORE_OFFSET, MAX_SCORE_OFFSET]`` nats (``-0.0`` becomes
        ``0.0``; ``score_offset_mode`` is stored as ``"head"`` when there is no offset, so equal
        cases hash equally), ``qk_rank`` and ``massive_channels`` in ``[0, 64]`` (either acts as
        ``min(value, head_dim)``, so a minimiser may shrink head_dim under them),
        ``seq_scale_log2`` in ``[0, MAX_SEQ_SCALE_LOG2]``, ``peaked_rows`` a fraction in ``[0, 1]``.

        Raises:
            CaseValidationError: naming the field and its allowed values.
        """
        s = object.__setattr__
        for name in ("score_offset", "peaked_rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise CaseValidationError(name, f"must be a finite number, got {value!r}")
            s(self, name, float(value) + 0.0)  # -0.0 -> 0.0
        if abs(self.score_offset) > MAX_SCORE_OFFSET:
            raise CaseValidationError(
                "score_offset", f"out of range: {self.score_offset}", f"-{MAX_SCORE_OFFSET:g} <= score_offset <= {MAX_SCORE_OFFSET:g}"
            )
        _check_choice("score_offset_mode", self.score_offset_mode, SCORE_OFFSET_MODES)
        if self.score_offset == 0.0:
            s(self, "score_offset_mode", "head")
        _check_int("qk_rank", self.qk_rank, 0, MAX_QK_RANK)
        _check_int("massive_channels", self.massive_channels, 0, MAX_MASSIVE_CHANNELS)
        if not isinstance(self.attention_sink, bool):
            raise CaseValidationError("attention_sink", f"must be a bool, got {self.attention_sink!r}", "true, false")
        _check_int("seq_scale_log2", self.seq_scale_log2, 0, MAX_SEQ_SCALE_LOG2)
        if not 0.0 <= self.peaked_rows <= 1.0:
            raise CaseValidationError("peaked_rows", f"out of range: {self.peaked_rows}", "0 <= peaked_rows <= 1")
        _check_choice("dout_distribution", self.dout_distribution, DOUT_DISTRIBUTIONS)

    @property
    def input_families(self) -> dict[str, Any]:
        """The input-family fields that differ from their defaults (empty for a plain case)."""
        return {name: getattr(self, name) for name, default in INPUT_FAMILY_DEFAULTS.items() if getattr(self, name) != default}

    def check_resources(self, max_bytes: int | None = None) -> None:
        """Refuse a case whose float64 oracle working set (`oracle_working_set_bytes`) is over
        ``max_bytes`` (default `max_oracle_bytes()`), before anything is allocated. Called by
        ``__post_init__``, so every door a case enters by (draw, corpus, API, replay, stored rows)
        applies the same bound.

        Raises:
            CaseValidationError: field ``case``, with the size, the bound and how to raise it.
        """
        bound = max_oracle_bytes() if max_bytes is None else max_bytes
        need = self.oracle_working_set_bytes
        if need > bound:
            raise CaseValidationError(
                "case",
                f"the float64 oracle would need {need} bytes (batch_size={self.batch_size}, seqlen_q={self.seqlen_q}, "
                f"seqlen_k={self.seqlen_k}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"head_dim_v={self.head_dim_v})",
                f"a working set <= {bound} bytes; set {MAX_ORACLE_BYTES_ENV} to raise it",
            )

    @staticmethod
    def _finite_float(name: str, value: Any, positive: bool) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CaseValidationError(name, f"must be a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value) or (positive and value <= 0):
            raise CaseValidationError(name, f"must be finite and > 0, got {value!r}", "a finite float > 0")
        return value

    def _check_seqlens(self) -> None:
        s = object.__setattr__
        if self.qkv_format != "thd":
            for name in ("seqlens_q", "seqlens_k"):
                if getattr(self, name) is not None:
                    raise CaseValidationError(name, "only allowed with qkv_format='thd'", "null")
            return
        for name, max_name in (("seqlens_q", "seqlen_q"), ("seqlens_k", "seqlen_k")):
            value = getattr(self, name)
            if value is None:
                value = (getattr(self, max_name),) * self.batch_size
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                raise CaseValidationError(name, f"must be a list of ints, got {value!r}")
            value = tuple(value)
            if len(value) != self.batch_size:
                raise CaseValidationError(
                    name, f"has {len(value)} entries but batch_size={self.batch_size}", "one length per sequence"
                )
            for i, n in enumerate(value):
                _check_int(f"{name}[{i}]", n, 1, MAX_INT32)
            if sum(value) > MAX_INT32:
                raise CaseValidationError(name, f"total {sum(value)} tokens do not fit cu_seqlens (int32)", f"sum <= {MAX_INT32}")
            if max(value) != getattr(self, max_name):
                raise CaseValidationError(
                    max_name, f"must equal max({name}) = {max(value)}, got {getattr(self, max_name)}"
                )
            s(self, name, value)

    # ---------------------------------------------------------------- derived values
    @property
    def is_varlen(self) -> bool:
        """True for the packed ``thd`` layout."""
        return self.qkv_format == "thd"

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (``num_heads // num_heads_kv``)."""
        return self.num_heads // self.num_heads_kv

    @property
    def seqlens_q_list(self) -> tuple[int, ...]:
        """Per-sequence query lengths (``seqlen_q`` repeated for bshd/sbhd)."""
        return self.seqlens_q if self.seqlens_q is not None else (self.seqlen_q,) * self.batch_size

    @property
    def seqlens_k_list(self) -> tuple[int, ...]:
        """Per-sequence key lengths (``seqlen_k`` repeated for bshd/sbhd)."""
        return self.seqlens_k if self.seqlens_k is not None else (self.seqlen_k,) * self.batch_size

    @property
    def total_q(self) -> int:
        """Number of query tokens over the batch."""
        return sum(self.seqlens_q_list)

    @property
    def total_k(self) -> int:
        """Number of key tokens over the batch."""
        return sum(self.seqlens_k_list)

    @property
    def oracle_working_set_bytes(self) -> int:
        """Bytes of float64 the oracle holds at least for this case (a lower bound, computed
        from the shapes without allocating): q ``[total_q, num_heads, head_dim]``, k and v
        ``[total_k, num_heads_kv, head_dim(_v)]``, out and lse, with ``backward`` also dout, dq,
        dk, dv and the row terms, plus two score rows per sequence and head ``[num_heads,
        seqlen_k]`` (the smallest block `oracle.reference` can use). 8 bytes per element."""
        h, hkv, d, dv = self.num_heads, self.num_heads_kv, self.head_dim, self.head_dim_v
        total_q = sum(self.seqlens_q) if self.seqlens_q is not None else self.batch_size * self.seqlen_q
        total_k = sum(self.seqlens_k) if self.seqlens_k is not None else self.batch_size * self.seqlen_k
        forward = total_q * h * (d + dv + 1) + total_k * hkv * (d + dv)
        elements = forward * (2 if self.backward else 1) + 2 * self.batch_size * h * self.seqlen_k
        return 8 * elements

    @property
    def has_mask(self) -> bool:
        """True when any key is hidden from any query by causal or window bounds: a mask kind of
        stage ``mask`` is on (`oracle.mask_kinds`)."""
        return any(kind.is_on(self) for kind in mask_kinds.kinds("mask"))

    # ---------------------------------------------------------------- serialisation
    def to_json(self) -> dict[str, Any]:
        """A plain-JSON dict (``schema_version`` included); tuples become lists."""
        data = {"schema_version": SCHEMA_VERSION}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in INPUT_FAMILY_DEFAULTS and value == INPUT_FAMILY_DEFAULTS[f.name]:
                continue  # left out at its default: older cases keep their JSON and case_id
            data[f.name] = list(value) if isinstance(value, tuple) else value
        return data

    @classmethod
    def from_json(cls, data: Any) -> AttentionCase:
        """Build a case from ``to_json`` output.

        Raises:
            CaseValidationError: ``data`` is not an object, has unknown or missing-type fields, an
                unsupported ``schema_version``, or violates a constraint.
        """
        if not isinstance(data, dict):
            raise CaseValidationError("case", f"must be a JSON object, got {type(data).__name__}")
        data = dict(data)
        version = data.pop("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise CaseValidationError(
                "schema_version", f"unsupported case schema version {version!r}", str(SCHEMA_VERSION)
            )
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise CaseValidationError(unknown[0], "unknown field", ", ".join(sorted(names)))
        for name in ("seqlens_q", "seqlens_k"):
            if isinstance(data.get(name), list):
                data[name] = tuple(data[name])
        return cls(**data)

    def to_json_str(self) -> str:
        """Canonical JSON text (sorted keys, no spaces): the input of ``case_id``. Computed once
        per case (the case is immutable) and kept in the instance's ``__dict__``: a fuzz case
        asked for its id about 17 times (every result carries it)."""
        text = self.__dict__.get("_json_str")
        if text is None:
            text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
            self.__dict__["_json_str"] = text  # not a field: eq, hash, repr and replace ignore it
        return text

    @property
    def case_id(self) -> str:
        """First 16 hex digits of the SHA-256 of the canonical JSON (computed once per case)."""
        case_id = self.__dict__.get("_case_id")
        if case_id is None:
            case_id = hashlib.sha256(self.to_json_str().encode()).hexdigest()[:16]
            self.__dict__["_case_id"] = case_id
        return case_id

    def replace(self, **changes: Any) -> AttentionCase:
        """A copy with ``changes`` applied and validated.

        Fields resolved at construction (``softmax_scale``, ``num_heads_kv``, ``head_dim_v``) keep
        their resolved values unless they are passed too (``None`` resolves them again).
        """
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """One line for humans, e.g. ``b1 sq2 sk2 h1/1 d64/64 bf16 bshd causal(top_left)``."""
        mask = []
        if self.causal:
            mask.append(f"causal({self.causal_alignment})")
        if self.window_size_left is not None or self.window_size_right is not None:
            mask.append(f"window({self.window_size_left},{self.window_size_right})")
        extra = [f"scale={self.softmax_scale:.4g}"]
        if self.softcap is not None:
            extra.append(f"softcap={self.softcap:g}")
        if self.is_varlen:
            extra.append(f"seqlens_q={list(self.seqlens_q_list)} seqlens_k={list(self.seqlens_k_list)}")
        if self.cp_size > 1:
            extra.append(f"cp={self.cp_size}/{self.cp_comm_type}")
        short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[self.dtype]
        return (
            f"b{self.batch_size} sq{self.seqlen_q} sk{self.seqlen_k} h{self.num_heads}/{self.num_heads_kv} "
            f"d{self.head_dim}/{self.head_dim_v} {short} {self.qkv_format} "
            f"{' '.join(mask) or 'no_mask'} {' '.join(extra)} {self.input_distribution} "
            f"{''.join(f'{name}={value} ' for name, value in self.input_families.items())}"
            f"seed={self.seed}{'' if self.backward else ' fwd-only'}"
        )


def torch_dtype(name: str):
    """The ``torch.dtype`` for a dtype name of ``DTYPES`` (imports torch lazily).

    Raises:
        CaseValidationError: ``name`` is not one of ``DTYPES``.
    """
    import torch

    _check_choice("dtype", name, DTYPES + ("float64",))
    return getattr(torch, name)


__all__ = [
    "AttentionCase",
    "CAUSAL_ALIGNMENTS",
    "CP_COMM_TYPES",
    "DOUT_DISTRIBUTIONS",
    "INPUT_FAMILY_DEFAULTS",
    "SCORE_OFFSET_MODES",
    "DTYPES",
    "INPUT_DISTRIBUTIONS",
    "QKV_FORMATS",
    "SCHEMA_VERSION",
    "torch_dtype",
]
