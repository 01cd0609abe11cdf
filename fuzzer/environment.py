"""What is installed and loaded here: the build fingerprint of the running environment (versions,
device, driver), and the runtime libraries each backend child loads: one cuDNN per process
(``$ATTNFUZZ_CUDNN``), what a child reports it mapped (``/proc/self/maps``), and FA4's shared
compile cache (``$ATTNFUZZ_JIT_CACHE_DIR``). A core module: the executor, the worker, the build
wing (`fuzzer.builds`) and the CLI read it; it reads the adapters' own facts (`fuzzer.backends`:
the imported FA4 build, cuDNN's version format) and is imported by none of them. See the
"runtimes" section below and ``docs/build-matrix.md``."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fuzzer.backends._common import format_cudnn_version
from fuzzer.results import BuildFingerprint
from oracle.errors import AttnFuzzError

#: The lines read from distribution metadata (field -> distribution), from their
#: `fuzzer.results.package_line` declarations.
_PACKAGES = BuildFingerprint.distributions()
_TE_ALTERNATES = ("transformer_engine", "transformer-engine-cu13", "transformer-engine-cu12", "transformer_engine_torch")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""


def current_fingerprint(device: str = "cpu", runtime: Mapping[str, Mapping[str, str]] | None = None) -> BuildFingerprint:
    """Versions of torch, CUDA, cuDNN, flash-attn-4, flash-attn, TE, cutlass-dsl, triton, Python,
    and the device's name, compute capability and driver. Absent packages give ``""``.

    Args:
        device: ``"cpu"`` or ``"cuda"`` (the worker's device; the current CUDA device is used).
        runtime: what each backend's child loaded (`runtime_report` plus the backend's own
            `Backend.runtime_versions`, by backend name; `fuzzer.executor.ChildProcessExecutor.runtime`).
            With it, ``cudnn`` is the cuDNN the children ran (``9.19.0``; ``+``-joined when they
            differ; ``""`` when none loaded one) and ``flash_attn_4`` the flash-attn-4 build
            ``flash_attn.cute`` was imported from, so the fingerprint names what ran. Without it
            (``runtime=None``: an in-process run) they come from this process: torch's cuDNN
            (this process then loads torch's cuDNN; a version mismatch gives ``""``, not an
            exception) and the flash-attn-4 build already imported here, else the metadata's.
    """
    import torch

    versions = {field: _version(dist) for field, dist in _PACKAGES.items()}
    if not versions["transformer_engine"]:
        versions["transformer_engine"] = next((v for v in map(_version, _TE_ALTERNATES) if v), "")
    cuda = torch.version.cuda or ""
    if runtime is not None:
        cudnn = merge_runtime(runtime, "cudnn")
        imported_fa4 = merge_runtime(runtime, "flash_attn_4")
    else:
        cudnn = _torch_cudnn_version(torch)
        imported_fa4 = _imported_fa4_version()
    if imported_fa4:
        versions["flash_attn_4"] = imported_fa4
    device_name, capability, driver = platform.processor() or platform.machine(), "", ""
    if device == "cuda" and torch.cuda.is_available():
        index = torch.cuda.current_device()
        device_name = torch.cuda.get_device_name(index)
        major, minor = torch.cuda.get_device_capability(index)
        capability = f"{major}.{minor}"
        try:
            driver = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.splitlines()[0].strip()
        except (OSError, IndexError, subprocess.SubprocessError):
            driver = ""
    return BuildFingerprint(
        torch=torch.__version__,
        cuda=cuda,
        cudnn=cudnn,
        python=platform.python_version(),
        device_name=device_name or "cpu",
        compute_capability=capability,
        driver=driver,
        **versions,
    )


def _torch_cudnn_version(torch: object) -> str:
    """torch's cuDNN in this process, dotted (``9.19.0``); "" without one or when torch's own
    version check refuses the loaded library (two cuDNN builds: see `cudnn_conflict`)."""
    try:
        if not torch.backends.cudnn.is_available():  # type: ignore[attr-defined]
            return ""
        code = torch.backends.cudnn.version()  # type: ignore[attr-defined]
    except RuntimeError:
        return ""
    return format_cudnn_version(int(code)) if code else ""


def _imported_fa4_version() -> str:
    """The flash-attn-4 build ``flash_attn.cute`` was imported from in this process ("" when it
    is not imported: nothing is imported here)."""
    if "flash_attn.cute.interface" not in sys.modules:
        return ""
    from fuzzer.backends.fa4 import fa4_imported_build

    return fa4_imported_build().get("flash_attn_4", "")


# ------------------------------------------------------------------------------------ runtimes
# One cuDNN per process, and the recorded one is the one that ran (issue 15).
#
# A process that imports TransformerEngine and torch can map two cuDNN builds: TE's loader finds
# the system one (``/usr/lib/x86_64-linux-gnu/libcudnn.so.9``) while torch wants the one its wheel
# depends on (``site-packages/nvidia/cudnn/lib``), and torch's version check then raises "cuDNN
# version incompatibility". attnfuzz therefore (1) never imports a backend library in the worker
# process (availability is asked in each backend's child), (2) chooses one cuDNN for every child
# (`resolve_cudnn_choice`, ``$ATTNFUZZ_CUDNN``) and puts its directory first on the child's
# ``LD_LIBRARY_PATH`` before the child starts (`child_library_env`; the dynamic loader reads it at
# exec, so it cannot be changed later), and (3) has each child report the runtime libraries it
# actually mapped (`runtime_report`, read from ``/proc/self/maps``), which the results and the
# build fingerprint are attributed to.

CUDNN_ENV = "ATTNFUZZ_CUDNN"
#: Values of ``$ATTNFUZZ_CUDNN`` besides a directory.
CUDNN_CHOICES = ("torch", "system")
JIT_CACHE_ENV = "ATTNFUZZ_JIT_CACHE_DIR"
#: FA4's on-disk compile cache (flash_attn/cute/cache_utils.py reads both at import).
FA4_CACHE_ENABLED_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
FA4_CACHE_DIR_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
#: Where a system cuDNN is looked for when ``ldconfig -p`` does not say.
SYSTEM_LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/lib",
)
#: Subdirectories of a site-packages directory where NVIDIA's cuDNN wheels put the library.
TORCH_CUDNN_SUBDIRS = ("nvidia/cudnn/lib", "nvidia/cu13/lib", "nvidia/cu12/lib")
#: Runtime libraries reported from the process map: report key -> file-name stem.
RUNTIME_LIBRARIES = {"cudnn": "libcudnn", "cublas": "libcublas", "cublaslt": "libcublasLt", "nccl": "libnccl", "cudart": "libcudart"}

_SO_NAME = re.compile(r"^(lib[A-Za-z]+)(_[A-Za-z0-9_]+)?\.so(?:\.(\d+(?:\.\d+)*))?$")


class EnvironmentChoiceError(AttnFuzzError, ValueError):
    """A runtime choice is invalid (``$ATTNFUZZ_CUDNN`` names no cuDNN, a cache directory cannot
    be created). The message names the variable and the allowed values."""


@dataclass(frozen=True)
class CudnnChoice:
    """The cuDNN every backend child loads.

    Attributes:
        choice: ``"torch"``, ``"system"`` or the directory given.
        directory: the directory holding ``libcudnn.so*`` that goes first on ``LD_LIBRARY_PATH``;
            None: leave the loader alone (no bundled cuDNN here, e.g. a CPU build of torch).
    """

    choice: str
    directory: Path | None

    def describe(self) -> str:
        where = str(self.directory) if self.directory is not None else "not set (no cuDNN found)"
        return f"{CUDNN_ENV}={self.choice}: {where}"


def _has_cudnn(directory: Path) -> bool:
    try:
        return any(p.name.startswith("libcudnn.so") for p in directory.iterdir())
    except OSError:
        return False


def cudnn_incomplete_reason(directory: Path) -> str | None:
    """Why the cuDNN in ``directory`` cannot run, None when it looks complete: a cuDNN 9
    ``libcudnn.so.9`` is only a dispatcher that loads its sub-libraries (``libcudnn_graph``,
    ``libcudnn_ops``, ``libcudnn_engines_*``) from the loader's path, and a system that ships the
    dispatcher alone (the H200 image's ``/usr/lib/x86_64-linux-gnu``) fails every FusedAttention
    call with ``CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED``."""
    try:
        names = [p.name for p in directory.iterdir()]
    except OSError as exc:
        return f"cannot list {directory}: {exc}"
    major9 = any(re.match(r"libcudnn\.so\.(9|[1-9]\d)", n) for n in names)
    if major9 and not any(n.startswith("libcudnn_graph.so") for n in names):
        return f"{directory} holds a cuDNN 9 dispatcher (libcudnn.so.9) without its sub-libraries (libcudnn_graph.so.9, ...)"
    return None


def torch_cudnn_dirs(search_path: Sequence[str] | None = None) -> list[Path]:
    """Directories of the cuDNN that torch's wheel depends on (``nvidia-cudnn-cu1x``), found on
    ``search_path`` (default: torch's own site directory, then ``sys.path``) without importing
    torch's CUDA libraries."""
    entries: list[str] = []
    if search_path is None:
        spec = importlib.util.find_spec("torch")
        if spec is not None and spec.origin:
            entries.append(str(Path(spec.origin).parent.parent))
        entries.extend(sys.path)
    else:
        entries.extend(search_path)
    found: list[Path] = []
    for entry in entries:
        for sub in TORCH_CUDNN_SUBDIRS:
            directory = Path(entry or ".") / sub
            if directory not in found and _has_cudnn(directory):
                found.append(directory)
    return found


def system_cudnn_dirs(ldconfig_output: str | None = None, candidates: Sequence[str] = SYSTEM_LIBRARY_DIRS) -> list[Path]:
    """Directories of a system cuDNN: those ``ldconfig -p`` lists for ``libcudnn.so*``, then the
    usual library directories that hold one."""
    if ldconfig_output is None:
        try:
            ldconfig_output = subprocess.run(
                ["ldconfig", "-p"], capture_output=True, text=True, timeout=10
            ).stdout
        except (OSError, subprocess.SubprocessError):
            ldconfig_output = ""
    found: list[Path] = []
    for line in ldconfig_output.splitlines():
        if "libcudnn.so" in line and "=>" in line:
            directory = Path(line.split("=>", 1)[1].strip()).parent
            if directory not in found:
                found.append(directory)
    for candidate in candidates:
        directory = Path(candidate)
        if directory not in found and _has_cudnn(directory):
            found.append(directory)
    return found


def resolve_cudnn_choice(
    choice: str | None = None,
    *,
    torch_dirs: Callable[[], list[Path]] = torch_cudnn_dirs,
    system_dirs: Callable[[], list[Path]] = system_cudnn_dirs,
) -> CudnnChoice:
    """Which cuDNN the backend children load: ``choice`` or ``$ATTNFUZZ_CUDNN``, default
    ``torch``.

    * ``torch`` (default): the cuDNN torch's wheel depends on (what torch was built and checks
      against). Where there is none (a CPU build of torch) nothing is changed.
    * ``system``: the system's (``ldconfig -p``, then `SYSTEM_LIBRARY_DIRS`), for every child
      (refused when it is a cuDNN 9 dispatcher without its sub-libraries: `cudnn_incomplete_reason`),
      torch's cuDNN SDPA included (torch's own version check may then refuse it: the child says
      so in its availability).
    * a directory holding ``libcudnn.so*`` (e.g. an unpacked ``nvidia-cudnn-cu13`` 9.27 wheel's
      ``nvidia/cudnn/lib``): that build, for a build of the ``cudnn`` line.

    Raises:
        EnvironmentChoiceError: ``system`` with no system cuDNN, a directory without
            ``libcudnn.so*``, or a cuDNN 9 without its sub-libraries.
    """
    text = (choice if choice is not None else os.environ.get(CUDNN_ENV, "")).strip() or "torch"
    if text == "torch":
        dirs = torch_dirs()
        return CudnnChoice("torch", dirs[0] if dirs else None)
    if text == "system":
        dirs = system_dirs()
        if not dirs:
            raise EnvironmentChoiceError(
                f"{CUDNN_ENV}: 'system' but no system libcudnn.so* was found (ldconfig -p, "
                f"{', '.join(SYSTEM_LIBRARY_DIRS)}); allowed: {', '.join(CUDNN_CHOICES)} or a directory holding libcudnn.so*"
            )
        incomplete = cudnn_incomplete_reason(dirs[0])
        if incomplete:
            raise EnvironmentChoiceError(
                f"{CUDNN_ENV}: 'system' cannot run: {incomplete}; allowed: torch, or a directory holding a whole cuDNN"
            )
        return CudnnChoice("system", dirs[0])
    directory = Path(text).expanduser()
    if not directory.is_dir() or not _has_cudnn(directory):
        raise EnvironmentChoiceError(
            f"{CUDNN_ENV}: {text!r} is not a directory holding libcudnn.so* "
            f"(allowed: {', '.join(CUDNN_CHOICES)} or such a directory)"
        )
    incomplete = cudnn_incomplete_reason(directory)
    if incomplete:
        raise EnvironmentChoiceError(f"{CUDNN_ENV}: {text!r} cannot run: {incomplete} (allowed: {', '.join(CUDNN_CHOICES)} or a whole cuDNN)")
    return CudnnChoice(text, directory.resolve())


def child_library_env(choice: CudnnChoice, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a backend child must start with so that it loads ``choice``'s cuDNN:
    ``LD_LIBRARY_PATH`` with the directory first (the loader resolves ``libcudnn.so.9`` there for
    torch and for TE alike), and ``CUDNN_PATH``/``CUDNN_HOME`` naming it (where TE's loader looks
    first). Empty when the choice leaves the loader alone."""
    if choice.directory is None:
        return {}
    environ = os.environ if environ is None else environ
    directory = str(choice.directory)
    rest = [p for p in environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p and p != directory]
    return {"LD_LIBRARY_PATH": os.pathsep.join([directory, *rest]), "CUDNN_PATH": directory, "CUDNN_HOME": directory}


def default_jit_cache_dir() -> Path:
    """``$ATTNFUZZ_JIT_CACHE_DIR``, else ``~/.cache/attnfuzz/fa4-jit`` (beside the builds)."""
    return Path(os.environ.get(JIT_CACHE_ENV) or Path.home() / ".cache" / "attnfuzz" / "fa4-jit")


def jit_cache_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """FA4's on-disk compile cache for every backend child: one directory shared by all children
    (``fa4`` and ``te-fa4`` compile the same kernels in separate processes) and kept across runs.
    FA4 keys each entry by its compile key under a fingerprint of its own sources, so builds do not
    share entries by mistake (flash_attn/cute/cache_utils.py).

    ``$ATTNFUZZ_JIT_CACHE_DIR=off`` disables it; a ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR`` already
    set is kept (the directory is still enabled).

    Raises:
        EnvironmentChoiceError: the directory cannot be created.
    """
    environ = os.environ if environ is None else environ
    setting = environ.get(JIT_CACHE_ENV, "").strip()
    if setting.lower() in ("off", "0", "none"):
        return {}
    directory = Path(environ.get(FA4_CACHE_DIR_ENV) or setting or default_jit_cache_dir()).expanduser()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EnvironmentChoiceError(f"{JIT_CACHE_ENV}: cannot create {str(directory)!r}: {exc} (or 'off')") from exc
    return {FA4_CACHE_ENABLED_ENV: "1", FA4_CACHE_DIR_ENV: str(directory)}


def jit_cache_description(environ: Mapping[str, str] | None = None) -> str:
    """Where the children keep FA4's compile cache (`jit_cache_env`), for summaries: the
    directory, or ``off``. Creates nothing."""
    environ = os.environ if environ is None else environ
    setting = environ.get(JIT_CACHE_ENV, "").strip()
    if setting.lower() in ("off", "0", "none"):
        return "off"
    return str(Path(environ.get(FA4_CACHE_DIR_ENV) or setting or default_jit_cache_dir()).expanduser())


@dataclass(frozen=True)
class LoadedLibrary:
    """One runtime library file mapped into a process.

    Attributes:
        key: the report key (`RUNTIME_LIBRARIES`: ``cudnn``, ``cublas``, ...).
        path: the file as mapped (``/proc/<pid>/maps``).
        sub: the sub-library suffix (``_graph`` of ``libcudnn_graph.so.9``), "" for the main one.
        file_version: the version in the file name (``9.19.0`` of ``libcudnn.so.9.19.0``, ``9``
            of ``libcudnn.so.9``), "" when none.
    """

    key: str
    path: str
    sub: str
    file_version: str


def loaded_libraries(maps_text: str | None = None) -> list[LoadedLibrary]:
    """The runtime libraries (`RUNTIME_LIBRARIES`) mapped into this process, from
    ``/proc/self/maps`` (or ``maps_text``), each file once, in map order. Empty where there is no
    ``/proc`` (not Linux). A CUDA process maps thousands of regions: lines are filtered by a
    substring test before any parsing."""
    if maps_text is None:
        try:
            with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
                maps_text = fh.read()
        except OSError:
            return []
    stems = {stem: key for key, stem in RUNTIME_LIBRARIES.items()}
    found: dict[str, LoadedLibrary] = {}
    for line in maps_text.splitlines():
        if "/libcu" not in line and "/libnccl" not in line:
            continue
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5].strip()
        match = _SO_NAME.match(os.path.basename(path))
        if match is None or match.group(1) not in stems or path in found:
            continue
        found[path] = LoadedLibrary(stems[match.group(1)], path, match.group(2) or "", match.group(3) or "")
    return list(found.values())


def cudnn_conflict(libraries: Sequence[LoadedLibrary]) -> str | None:
    """A message naming both libraries when the cuDNN files of one process come from more than
    one directory (two builds loaded), else None."""
    by_dir: dict[str, LoadedLibrary] = {}
    for lib in libraries:
        if lib.key != "cudnn":
            continue
        directory = os.path.dirname(os.path.realpath(lib.path))
        current = by_dir.get(directory)
        if current is None or (current.sub and not lib.sub):
            by_dir[directory] = lib  # prefer the main libcudnn.so* to name the directory
    if len(by_dir) < 2:
        return None
    names = " and ".join(lib.path for lib in by_dir.values())
    return (
        f"two cuDNN libraries are loaded in one process: {names}; results could not be attributed to "
        f"one cuDNN. Choose one with {CUDNN_ENV}=torch|system|<directory> (it goes first on each "
        "backend child's LD_LIBRARY_PATH)"
    )


def _query_library_version(lib: LoadedLibrary) -> str:
    """The version a mapped library reports of itself (``cudnnGetVersion``,
    ``cublasLtGetVersion``, ``ncclGetVersion``, ``cudaRuntimeGetVersion``), "" when it cannot be
    asked. Opening a file that is already mapped returns the same handle: nothing new is loaded."""
    import ctypes

    try:
        handle = ctypes.CDLL(lib.path, mode=getattr(os, "RTLD_NOLOAD", 4) | ctypes.RTLD_GLOBAL)
        if lib.key == "cudnn" and not lib.sub:
            handle.cudnnGetVersion.restype = ctypes.c_size_t
            return format_cudnn_version(int(handle.cudnnGetVersion()))
        if lib.key == "cublaslt":
            handle.cublasLtGetVersion.restype = ctypes.c_size_t
            code = int(handle.cublasLtGetVersion())
            return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
        if lib.key in ("nccl", "cudart"):
            value = ctypes.c_int()
            function = handle.ncclGetVersion if lib.key == "nccl" else handle.cudaRuntimeGetVersion
            if function(ctypes.byref(value)) != 0:
                return ""
            code = value.value
            if lib.key == "nccl":
                return f"{code // 10000}.{code % 10000 // 100}.{code % 100}" if code >= 10000 else f"{code // 1000}.{code % 1000 // 100}.{code % 100}"
            return f"{code // 1000}.{code % 1000 // 10}"
    except (OSError, AttributeError, ValueError):
        return ""
    return ""


def runtime_report(
    maps_text: str | None = None, query: Callable[[LoadedLibrary], str] = _query_library_version
) -> dict[str, str]:
    """The runtime libraries this process has loaded: for each of `RUNTIME_LIBRARIES` found,
    ``<key>`` (its version: what the library reports of itself, else its file name's) and
    ``<key>_library`` (the main file's path); ``cudnn_conflict`` when two cuDNN builds are mapped
    (then ``cudnn`` is every version, ``+``-joined). Strings only; empty without such libraries.

    Args:
        maps_text: the process map to read (default ``/proc/self/maps``).
        query: asks a mapped library for its version (a stand-in in tests).
    """
    libraries = loaded_libraries(maps_text)
    report: dict[str, str] = {}
    versions: dict[str, list[str]] = {}
    for lib in libraries:
        if lib.sub:
            continue
        version = query(lib) or lib.file_version
        if version and version not in versions.setdefault(lib.key, []):
            versions[lib.key].append(version)
        report.setdefault(f"{lib.key}_library", lib.path)
    for key, found in versions.items():
        report[key] = "+".join(found)
    conflict = cudnn_conflict(libraries)
    if conflict:
        report["cudnn_conflict"] = conflict
    return report


def merge_runtime(reports: Mapping[str, Mapping[str, str]], key: str) -> str:
    """One value of ``key`` over the backends' runtime reports: the single value they agree on,
    or every distinct value ``+``-joined in sorted order ("" when none reports it)."""
    values: list[str] = []
    for report in reports.values():
        for value in str(report.get(key, "")).split("+"):
            if value and value not in values:
                values.append(value)
    return "+".join(sorted(values, key=_version_sort_key))


def _version_sort_key(text: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+]", text))
