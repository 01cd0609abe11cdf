"""One cuDNN per process, and the recorded one is the one that ran (issue 15), on the CPU.

The cuDNN choice (``$ATTNFUZZ_CUDNN``) and the library environment a child starts with, the
process-map reading that finds one or two cuDNN builds (fake maps, and real files mapped by a
child), the runtime versions each child reports and how results and the fingerprint are
attributed to them, and the FA4 compile cache every child shares.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from fuzzer import environment
from fuzzer.backends._common import format_cudnn_version
from fuzzer.environment import (
    CUDNN_ENV,
    FA4_CACHE_DIR_ENV,
    FA4_CACHE_ENABLED_ENV,
    JIT_CACHE_ENV,
    CudnnChoice,
    EnvironmentChoiceError,
    child_library_env,
    cudnn_conflict,
    current_fingerprint,
    jit_cache_env,
    loaded_libraries,
    merge_runtime,
    resolve_cudnn_choice,
    runtime_report,
)
from fuzzer.executor import ChildProcessExecutor, executor_runtime, probe_backends
from oracle.config import AttentionCase
from oracle.inputs import make_inputs
from tests.fuzzer.backends.runtime_standins import (
    TWO_CUDNN_ENV,
    LazyCudnnBackend,
    ReportingBackend,
    TwoCudnnBackend,
)

SYSTEM = "/usr/lib/x86_64-linux-gnu"
TORCH = "/venv/lib/python3.12/site-packages/nvidia/cudnn/lib"


def maps_line(path: str, address: str = "7f0000000000-7f0000001000") -> str:
    return f"{address} r-xp 00000000 08:01 1234 {path}"


ONE_CUDNN_MAPS = "\n".join(
    [
        maps_line("/usr/bin/python3.12"),
        maps_line(f"{TORCH}/libcudnn.so.9"),
        maps_line(f"{TORCH}/libcudnn.so.9", "7f0000001000-7f0000002000"),  # the same file twice
        maps_line(f"{TORCH}/libcudnn_graph.so.9"),
        maps_line("/venv/lib/python3.12/site-packages/nvidia/cublas/lib/libcublasLt.so.13"),
        maps_line("/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"),
        "7ffd00000000-7ffd00001000 rw-p 00000000 00:00 0 [stack]",
    ]
)
TWO_CUDNN_MAPS = ONE_CUDNN_MAPS + "\n" + "\n".join(
    [maps_line(f"{SYSTEM}/libcudnn.so.9.14.0"), maps_line(f"{SYSTEM}/libcudnn_ops.so.9.14.0")]
)


def fake_query(versions: dict[str, str]):
    """A stand-in for asking a mapped library its version (cudnnGetVersion ...), by path."""
    return lambda lib: versions.get(lib.path, "")


# ------------------------------------------------------------------------- the process map
def test_loaded_libraries_reads_each_runtime_file_once_with_its_sub_library():
    libs = loaded_libraries(ONE_CUDNN_MAPS)
    assert [(lib.key, lib.sub, lib.file_version) for lib in libs] == [
        ("cudnn", "", "9"),
        ("cudnn", "_graph", "9"),
        ("cublaslt", "", "13"),
        ("nccl", "", "2"),
    ]


def test_one_cudnn_build_with_its_sub_libraries_is_no_conflict():
    assert cudnn_conflict(loaded_libraries(ONE_CUDNN_MAPS)) is None


def test_two_cudnn_builds_in_one_process_are_named_both():
    message = cudnn_conflict(loaded_libraries(TWO_CUDNN_MAPS))
    assert message is not None
    assert f"{TORCH}/libcudnn.so.9" in message and f"{SYSTEM}/libcudnn.so.9.14.0" in message
    assert CUDNN_ENV in message


def test_runtime_report_takes_the_library_s_own_version_and_reports_both_when_two_are_loaded():
    query = fake_query({f"{TORCH}/libcudnn.so.9": "9.19.0", f"{SYSTEM}/libcudnn.so.9.14.0": "9.14.0"})
    one = runtime_report(ONE_CUDNN_MAPS, query)
    assert one["cudnn"] == "9.19.0" and one["cudnn_library"] == f"{TORCH}/libcudnn.so.9"
    assert one["cublaslt"] == "13" and one["nccl"] == "2"  # file-name versions when not asked
    assert "cudnn_conflict" not in one
    two = runtime_report(TWO_CUDNN_MAPS, query)
    assert two["cudnn"] == "9.19.0+9.14.0" and "cudnn_conflict" in two


def test_cudnn_versions_are_dotted_from_every_encoding():
    assert format_cudnn_version(91900) == "9.19.0"
    assert format_cudnn_version(90100) == "9.1.0"
    assert format_cudnn_version(8906) == "8.9.6"
    assert format_cudnn_version((9, 14, 0)) == "9.14.0"  # TE's get_cudnn_version


# ------------------------------------------------------------------------- the choice
def fake_cudnn_dir(root: Path, name: str, sub_libraries: bool = True) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "libcudnn.so.9").write_bytes(b"")
    if sub_libraries:
        (directory / "libcudnn_graph.so.9").write_bytes(b"")
    return directory


def test_a_cudnn_9_dispatcher_without_its_sub_libraries_is_refused(tmp_path):
    """The H200 image's system cuDNN 9.14 is the dispatcher alone: every FusedAttention call
    failed with CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED. Choosing it is refused up front."""
    bare = fake_cudnn_dir(tmp_path, "usr/lib", sub_libraries=False)
    with pytest.raises(EnvironmentChoiceError, match="without its sub-libraries"):
        resolve_cudnn_choice("system", torch_dirs=lambda: [], system_dirs=lambda: [bare])
    with pytest.raises(EnvironmentChoiceError, match=f"{CUDNN_ENV}: .* cannot run"):
        resolve_cudnn_choice(str(bare))
    assert environment.cudnn_incomplete_reason(fake_cudnn_dir(tmp_path, "whole")) is None


def test_the_default_cudnn_is_torch_s_bundled_one(tmp_path):
    bundled = fake_cudnn_dir(tmp_path, "site/nvidia/cudnn/lib")
    found = environment.torch_cudnn_dirs([str(tmp_path / "site"), str(tmp_path / "nowhere")])
    assert found == [bundled]
    choice = resolve_cudnn_choice("", torch_dirs=lambda: found, system_dirs=lambda: [])
    assert choice == CudnnChoice("torch", bundled)


def test_a_cpu_torch_without_bundled_cudnn_changes_nothing():
    choice = resolve_cudnn_choice("torch", torch_dirs=lambda: [], system_dirs=lambda: [Path(SYSTEM)])
    assert choice.directory is None and child_library_env(choice, {}) == {}


def test_system_and_directory_choices(tmp_path):
    system = fake_cudnn_dir(tmp_path, "usr/lib")
    assert resolve_cudnn_choice("system", torch_dirs=lambda: [], system_dirs=lambda: [system]).directory == system
    other = fake_cudnn_dir(tmp_path, "cudnn-9.27/lib")
    assert resolve_cudnn_choice(str(other)).directory == other.resolve()
    ldconfig = f"\tlibcudnn.so.9 (libc6,x86-64) => {system}/libcudnn.so.9\n"
    assert environment.system_cudnn_dirs(ldconfig, candidates=()) == [system]


@pytest.mark.parametrize("value", ["system", "/no/such/dir", "EMPTY"])
def test_a_choice_that_names_no_cudnn_is_refused_naming_the_variable(tmp_path, value):
    if value == "EMPTY":
        value = str(tmp_path)  # a directory without libcudnn.so*
    with pytest.raises(EnvironmentChoiceError, match=f"{CUDNN_ENV}: .*(torch, system|allowed)"):
        resolve_cudnn_choice(value, torch_dirs=lambda: [], system_dirs=lambda: [])


def test_the_child_library_env_puts_the_chosen_directory_first_once(tmp_path):
    chosen = fake_cudnn_dir(tmp_path, "lib")
    env = child_library_env(CudnnChoice("torch", chosen), {"LD_LIBRARY_PATH": f"/usr/lib:{chosen}:/opt/x"})
    assert env["LD_LIBRARY_PATH"] == f"{chosen}:/usr/lib:/opt/x"
    assert env["CUDNN_PATH"] == env["CUDNN_HOME"] == str(chosen)


# ------------------------------------------------------------------------- the fingerprint
def test_the_fingerprint_names_the_cudnn_and_fa4_build_the_children_ran():
    agree = {"te-fused": {"cudnn": "9.19.0"}, "torch-sdpa-cudnn": {"cudnn": "9.19.0"}, "fa4": {"flash_attn_4": "4.0.0b35"}}
    fingerprint = current_fingerprint("cpu", agree)
    assert fingerprint.cudnn == "9.19.0" and fingerprint.flash_attn_4 == "4.0.0b35"
    differ = {"te-fused": {"cudnn": "9.14.0"}, "torch-sdpa-cudnn": {"cudnn": "9.19.0"}}
    assert current_fingerprint("cpu", differ).cudnn == "9.14.0+9.19.0"
    assert current_fingerprint("cpu", {}).cudnn == ""  # nothing loaded a cuDNN
    assert merge_runtime({"a": {"cudnn": "9.19.0+9.14.0"}, "b": {"cudnn": "9.2.0"}}, "cudnn") == "9.2.0+9.14.0+9.19.0"


def test_the_cpu_fingerprint_is_unchanged_by_runtime_attribution():
    """A CPU worker's children load no cuDNN: the build keeps the identity it had."""
    assert current_fingerprint("cpu", {"torch-cpu-math": {}}) == current_fingerprint("cpu")


# ------------------------------------------------------------------------- children
CASE = AttentionCase(batch_size=1, seqlen_q=4, seqlen_k=4, num_heads=1, num_heads_kv=1, head_dim=8, dtype="float32")
SPEC = "tests.fuzzer.backends.runtime_standins"


def test_each_child_starts_with_the_chosen_cudnn_and_results_are_attributed_to_its_report(tmp_path, monkeypatch):
    chosen = fake_cudnn_dir(tmp_path, "cudnn/lib")
    monkeypatch.setenv(CUDNN_ENV, str(chosen))
    monkeypatch.setenv(JIT_CACHE_ENV, str(tmp_path / "jit"))
    monkeypatch.delenv(FA4_CACHE_DIR_ENV, raising=False)
    before = os.environ.get("LD_LIBRARY_PATH")
    backend = ReportingBackend()
    with ChildProcessExecutor([(backend, f"{SPEC}:ReportingBackend")], start_timeout_s=120) as executor:
        assert executor.availability() == {"standin-runtime": None}
        report = executor.runtime["standin-runtime"]
        outcomes = executor.run(CASE, make_inputs(CASE), [("standin-runtime", "native")], 60)
    assert report["ld_library_path_first"] == str(chosen.resolve()) and report["cudnn_path"] == str(chosen.resolve())
    assert report["fa4_cache_enabled"] == "1" and report["fa4_cache_dir"] == str(tmp_path / "jit")
    assert (tmp_path / "jit").is_dir()
    assert os.environ.get("LD_LIBRARY_PATH") == before, "the worker's own environment is restored"
    assert outcomes[0].status == "ok"
    assert "runtime:cudnn==9.19.0" in backend.version_string()
    assert executor_runtime(executor) == {"standin-runtime": report}
    assert current_fingerprint("cpu", executor_runtime(executor)).cudnn == "9.19.0"


def _small_shared_object() -> Path:
    """A small real ELF shared object to map under another name: an extension module of the
    standard library (which ones are built in varies between Python builds)."""
    import importlib

    for name in ("_bisect", "_random", "_json", "array", "math", "_struct", "select"):
        try:
            path = getattr(importlib.import_module(name), "__file__", "") or ""
        except ImportError:
            continue
        if path.endswith(".so"):
            return Path(path)
    pytest.skip("no standard-library extension module is a separate shared object here")


@pytest.fixture
def two_cudnn_dirs(tmp_path, monkeypatch):
    dirs = []
    for name in ("system", "bundled"):
        directory = tmp_path / name
        directory.mkdir()
        shutil.copy(_small_shared_object(), directory / "libcudnn.so.9")
        dirs.append(directory)
    monkeypatch.setenv(TWO_CUDNN_ENV, os.pathsep.join(map(str, dirs)))
    monkeypatch.setenv(JIT_CACHE_ENV, "off")
    return dirs


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_child_that_maps_two_cudnn_builds_makes_its_backends_unavailable_naming_both(two_cudnn_dirs):
    backend = TwoCudnnBackend()
    with ChildProcessExecutor([(backend, f"{SPEC}:TwoCudnnBackend")], start_timeout_s=120) as executor:
        reason = executor.availability()["standin-two-cudnn"]
        report = executor.runtime["standin-two-cudnn"]
    assert reason is not None and "two cuDNN libraries" in reason
    for directory in two_cudnn_dirs:
        assert str(directory / "libcudnn.so.9") in reason
    assert "cudnn_conflict" in report


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_library_loaded_lazily_by_a_call_is_reported_with_that_outcome(two_cudnn_dirs):
    backend = LazyCudnnBackend()
    with ChildProcessExecutor([(backend, f"{SPEC}:LazyCudnnBackend")], start_timeout_s=120) as executor:
        executor.availability()
        assert "cudnn_library" not in executor.runtime.get("standin-lazy-cudnn", {})
        outcomes = executor.run(CASE, make_inputs(CASE), [("standin-lazy-cudnn", "native")], 60)
        report = executor.runtime["standin-lazy-cudnn"]
    assert outcomes[0].status == "ok"
    assert report["cudnn_library"] == str(two_cudnn_dirs[0] / "libcudnn.so.9")
    assert "runtime:cudnn==9" in backend.version_string()


def test_probing_answers_here_what_needs_no_import_and_starts_no_child_for_it():
    """A CUDA backend on a machine without CUDA is answered by quick_availability in this
    process: no child is started, nothing of the backend's library is imported here."""

    class CudaOnly(ReportingBackend):
        name = "standin-cuda-only"
        device = "cuda"

        def availability(self):  # would import the library: must not be called here
            raise AssertionError("availability() called in the worker process")

    availability, runtime = probe_backends([(CudaOnly(), f"{SPEC}:ReportingBackend")])
    if not __import__("torch").cuda.is_available():
        assert availability["standin-cuda-only"].startswith("no CUDA device") and runtime == {}


# ------------------------------------------------------------------------- the JIT cache
def test_one_fa4_compile_cache_for_every_child_kept_across_runs(tmp_path):
    env = jit_cache_env({JIT_CACHE_ENV: str(tmp_path / "cache")})
    assert env == {FA4_CACHE_ENABLED_ENV: "1", FA4_CACHE_DIR_ENV: str(tmp_path / "cache")}
    assert (tmp_path / "cache").is_dir()
    assert jit_cache_env({JIT_CACHE_ENV: "off"}) == {}
    mine = jit_cache_env({FA4_CACHE_DIR_ENV: str(tmp_path / "mine")})
    assert mine[FA4_CACHE_DIR_ENV] == str(tmp_path / "mine"), "a directory the user set is kept"
    (tmp_path / "file").write_text("")
    with pytest.raises(EnvironmentChoiceError, match=JIT_CACHE_ENV):
        jit_cache_env({JIT_CACHE_ENV: str(tmp_path / "file" / "sub")})


def test_the_summary_names_the_cache_without_creating_it(tmp_path):
    from fuzzer.environment import jit_cache_description

    assert jit_cache_description({JIT_CACHE_ENV: "off"}) == "off"
    assert jit_cache_description({JIT_CACHE_ENV: str(tmp_path / "c")}) == str(tmp_path / "c")
    assert jit_cache_description({FA4_CACHE_DIR_ENV: str(tmp_path / "d"), JIT_CACHE_ENV: str(tmp_path / "c")}) == str(tmp_path / "d")
    assert not (tmp_path / "c").exists()


def test_a_worker_registers_the_children_s_cudnn_and_attributes_each_result_to_it(tmp_path, monkeypatch):
    """Through the worker: the build it registers names the cuDNN its child reported (not the
    worker process's), and each stored result's backend_version carries it."""
    from fuzzer.sinks import MemorySink
    from fuzzer.worker import Worker, WorkerConfig

    class RecordingSink(MemorySink):
        fingerprints: list = []

        def register_build(self, fingerprint):
            self.fingerprints.append(fingerprint)
            return super().register_build(fingerprint)

    monkeypatch.setenv(JIT_CACHE_ENV, "off")
    sink = RecordingSink()
    backend = ReportingBackend()
    config = WorkerConfig(backends=[(backend, f"{SPEC}:ReportingBackend")], isolation="process", shrink=False)
    with Worker(config, sink) as worker:
        results = worker.evaluate(CASE)
    assert [r.status for r in results] == ["pass"]
    assert "runtime:cudnn==9.19.0" in results[0].backend_version
    assert sink.fingerprints[-1].cudnn == "9.19.0"
    assert all("runtime:cudnn==9.19.0" in r.backend_version for r in sink.results.values())


def test_attnfuzz_backends_lists_what_each_child_loaded():
    """``attnfuzz backends --json``: every row has the runtime its child reported (empty where
    none was started: on this CPU machine the CUDA backends are answered without importing
    their libraries)."""
    import json

    from typer.testing import CliRunner

    from service.cli.main import app

    result = CliRunner().invoke(app, ["backends", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert rows["torch-cpu-math"]["available"] and isinstance(rows["torch-cpu-math"]["runtime"], dict)
    if not __import__("torch").cuda.is_available():
        assert not rows["fa4"]["available"] and rows["fa4"]["runtime"] == {}
        assert "flash_attn" not in sys.modules and "transformer_engine" not in sys.modules


def test_a_result_names_the_fa4_build_that_ran_by_version_and_place():
    backend = ReportingBackend()
    backend.set_runtime({"flash_attn_4": "4.0.0b30", "flash_attn_4_module": "/b/flash-attn-4-4.0.0b30/site/flash_attn/cute", "other": "x"})
    text = backend.version_string()
    assert "runtime:flash_attn_4==4.0.0b30" in text
    assert "runtime:flash_attn_4_module==/b/flash-attn-4-4.0.0b30/site/flash_attn/cute" in text
    assert "other" not in text
    backend.set_runtime({})
    assert "runtime:" not in backend.version_string(), "a new report replaces the cached string"


def test_a_replay_on_a_cudnn_build_runs_its_children_on_that_cudnn_and_records_its_version(tmp_path, monkeypatch):
    """A build of the cuDNN line (an unpacked nvidia-cudnn-cu13 wheel) replayed: the replay's
    children start with its nvidia/cudnn/lib first, and the replay's fingerprint names its
    version, so regressions --package cudnn compare the cuDNN builds that ran."""
    from fuzzer.builds.envs import prepare_from_wheelhouse
    from fuzzer.builds.replay import replay_in_build
    from fuzzer.results import ReplayTask
    from tests.builds.fakebuilds import write_wheel

    monkeypatch.delenv(CUDNN_ENV, raising=False)
    monkeypatch.setenv(JIT_CACHE_ENV, "off")
    wheelhouse = tmp_path / "wheels"
    wheelhouse.mkdir()
    write_wheel(
        wheelhouse, "nvidia-cudnn-cu13", "9.27.0.42",
        {
            "nvidia/cudnn/__init__.py": "", "nvidia/cudnn/lib/libcudnn.so.9": "", "nvidia/cudnn/lib/libcudnn_graph.so.9": "",
            "nvidia/cudnn/lib/VERSION": "9.27.0\n",
        },
    )
    env = prepare_from_wheelhouse(
        "nvidia-cudnn-cu13", "9.27.0.42", [wheelhouse], tmp_path / "builds", shared_version=lambda name: None
    )
    assert env.cudnn_dir() == env.paths[0] / "nvidia" / "cudnn" / "lib"
    task = ReplayTask(CASE, "standin-runtime", "native")
    outcome = replay_in_build(env, [task], [("standin-runtime", f"{SPEC}:ReportingBackend")], device="cpu", start_timeout_s=300)
    assert outcome.error in (None, ""), outcome.error
    assert [r.status for r in outcome.results] == ["pass"]
    assert outcome.fingerprint.cudnn == "9.27.0"
    assert "runtime:cudnn==9.27.0" in outcome.results[0].backend_version


def test_the_backends_table_shows_the_imported_fa4_build_and_the_loaded_cudnn():
    from service.cli.backends import _runtime_text

    text = _runtime_text({
        "flash_attn_4": "4.0.0b30", "flash_attn_4_module": "/b/site/flash_attn/cute",
        "cudnn": "9.19.0", "cudnn_library": f"{TORCH}/libcudnn.so.9", "nccl": "2.27.3",
    })
    assert "flash_attn.cute=/b/site/flash_attn/cute (4.0.0b30)" in text
    assert f"cuDNN=9.19.0 ({TORCH}/libcudnn.so.9)" in text and "NCCL=2.27.3" in text
    assert _runtime_text({}) == ""
