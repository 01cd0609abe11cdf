"""The fuzz loop of one worker, split by idea; `fuzzer.worker` re-exports its public names.

- `fuzzer.loop.worker`: `Worker`, the loop (run, chunk, evaluate, record) and `Reporter`.
- `fuzzer.loop.config`: `WorkerConfig` and `WorkerError`.
- `fuzzer.loop.stats`: `WorkerStats`, `merge_stats` and the steps that add to the figures.
- `fuzzer.loop.compile_budget`: the compile gate, kernel templates and crash quarantine of JIT backends.
- `fuzzer.loop.draws`: the Hypothesis strategy of a chunk and its target plan.
- `fuzzer.loop.repeats`: fuzz cases drawn again, answered from their first run.
- `fuzzer.loop.background`: the lanes' late parts and the judge thread's pending judgements.
- `fuzzer.loop.shrinker`: minimisation claims and leases, the still-fails predicate, symptoms.
- `fuzzer.loop.known_hits`: hits on buckets already known and how draws move away from them.
- `fuzzer.loop.journal`: the evaluation a killed worker left, redone or quarantined.
- `fuzzer.loop.stop`: a Ctrl-C that something swallowed still stops the worker.

Each part owns its state and is handed what it needs of the worker as callables; none imports
`fuzzer.builds` (an import-linter contract): replaying the corpus on a new build is composed
outside, in `fuzzer.worker`.
"""
