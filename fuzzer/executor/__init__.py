"""Running backends, isolated in persistent child processes, and turning every way a call can end
(result, exception, crash, hang, OOM) into a `TaskOutcome`.

One module per idea; this package re-exports their public names, so ``fuzzer.executor.X`` works
for each of them:

- `fuzzer.executor.outcome`: `TaskOutcome`, its statuses (`SKIPPED`, `BUSY`), the
  ``exception_type`` names of the executor's checks and `ExecutorError`.
- `fuzzer.executor.calls`: one backend call in this process, isolated from its inputs and
  classified (`run_task`, `OutputReuse`, `InProcessExecutor`, `configure_torch_threads`).
- `fuzzer.executor.transport`: inputs and outputs through the pipe: small tensors as bytes
  (`PackedTensor`), larger ones in shared memory or as CUDA IPC handles.
- `fuzzer.executor.processes`: the process tree below a worker (`die_with_parent`,
  `adopt_orphans`, `kill_tree`, `resident_bytes`, `usable_cores`).
- `fuzzer.executor.logs`: a child's stdout and stderr, kept bounded by its worker (`ChildLog`).
- `fuzzer.executor.child`: the child's own side: its entry point (`child.child_main`), its serving
  loop and the protocol between worker and child.
- `fuzzer.executor.handle`: the worker's handle of one child (waiting on it, how it died, ending it).
- `fuzzer.executor.runs`: handles of submitted runs (`submit_run`, `DeferredRun`).
- `fuzzer.executor.children`: `ChildProcessExecutor`, one child per backend environment, and
  `probe_backends`, `executor_runtime`.
"""

from fuzzer.executor.calls import (
    THREADS_ENV,
    InProcessExecutor,
    OutputReuse,
    availability_of,
    configure_torch_threads,
    inputs_on,
    mutated_inputs,
    output_structure_problems,
    own_inputs,
    quick_availability_of,
    run_task,
    sane_ms,
)
from fuzzer.executor.child import (
    PROFILE_DIR_ENV,
    become_child,
    child_runtime,
    exit_if_crashed,
    load_task_backends,
    release_after_oom,
)
from fuzzer.executor.children import (
    PARALLEL_ENV,
    ChildProcessExecutor,
    executor_runtime,
    parallel_children_setting,
    probe_backends,
)
from fuzzer.executor.logs import LOG_KEEP_BYTES, LOG_MAX_BYTES, ChildLog, log_output_to
from fuzzer.executor.outcome import (
    BUSY,
    COMPILE_ERROR_TYPES,
    DECLARATION_GAP,
    INPUT_MUTATED,
    INVALID_OUTPUT,
    OUTPUT_REUSED,
    OUTPUT_TENSORS,
    SKIPPED,
    TASK_TIMING_PARTS,
    ExecutorError,
    TaskOutcome,
)
from fuzzer.executor.processes import (
    adopt_orphans,
    descendants,
    die_with_parent,
    end_descendants,
    kill_tree,
    resident_bytes,
    usable_cores,
)
from fuzzer.executor.runs import DeferredRun, submit_run
from fuzzer.executor.transport import (
    BYTES_TRANSPORT_MAX,
    PackedTensor,
    pack_inputs,
    pack_output,
    shared_copy,
    unpack_inputs,
    unpack_output,
)

__all__ = [
    "BUSY", "BYTES_TRANSPORT_MAX", "COMPILE_ERROR_TYPES", "DECLARATION_GAP", "INPUT_MUTATED", "INVALID_OUTPUT",
    "LOG_KEEP_BYTES", "LOG_MAX_BYTES", "OUTPUT_REUSED", "OUTPUT_TENSORS", "PARALLEL_ENV", "PROFILE_DIR_ENV", "SKIPPED",
    "TASK_TIMING_PARTS", "THREADS_ENV", "ChildLog", "ChildProcessExecutor", "DeferredRun", "ExecutorError",
    "InProcessExecutor", "OutputReuse", "PackedTensor", "TaskOutcome", "adopt_orphans", "availability_of",
    "become_child", "child_runtime", "configure_torch_threads", "descendants", "die_with_parent", "end_descendants",
    "executor_runtime", "exit_if_crashed", "inputs_on", "kill_tree", "load_task_backends", "log_output_to",
    "mutated_inputs", "output_structure_problems", "own_inputs", "pack_inputs", "pack_output",
    "parallel_children_setting", "probe_backends", "quick_availability_of", "release_after_oom", "resident_bytes",
    "run_task", "sane_ms", "shared_copy", "submit_run", "unpack_inputs", "unpack_output", "usable_cores",
]
