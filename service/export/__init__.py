"""Repros and reports of stored failures: standalone pytest files (``attnfuzz export``,
``GET /api/cases/{id}/repro.py``) and issue reports ready to file upstream (`issue_report`).

A repro is one Python file that needs only ``torch``, ``pytest`` and the backend's own package
(never attnfuzz), so a kernel maintainer can drop it into flash-attention's or
TransformerEngine's tests. It

1. carries the oracle's portable core, ``oracle/portable.py``, copied into the file byte for byte
   (`oracle.portable`: the counter hash, the input distributions and families, the mask, a dense
   float64 reference and the tile judge; the oracle draws its inputs and masks with the same
   code), and regenerates the inputs with it, so the tensors are bit-identical to the ones the
   fuzzer used (``tests/service/test_export.py`` checks this, and that the copy is the file);
2. calls the backend exactly as the variant did, through the adapter's own repro call
   (`fuzzer.backends.base.Backend.repro` -> `fuzzer.backends.base.ReproCall`, written next to
   ``run``; found like every backend: built-ins, the ``attnfuzz.backends`` entry points, or
   ``module:attr``, `resolve_backend`). A backend without one gets an `ExportError` saying what
   to add;
3. computes a compact float64 reference with the core (`oracle.portable.dense_reference`: dense
   per sequence, the mask of `oracle.masks`, the backward of FlashAttention-2 Algorithm 2);
4. judges every tensor as `oracle.compare.compare_tensor` did (``judge`` in the file, the core's
   `oracle.portable.tile_judge`, with the signature kinds of `oracle.signatures`): shape, NaN,
   +-inf where the reference is finite, lse finite exactly on rows that see a key (``-inf`` or
   ``+inf`` accepted on the others, and the backend's documented ``masked_row_lse``), all zero,
   the L2 error of the whole tensor against the stored whole-tensor allowance (``mismatch``) and
   of every tile of ``TILE_ROWS`` rows of one (batch, head) against the stored tile allowance
   (``tile_mismatch``). The allowances are the ones the worker stored with the case's results
   (``allowed_global``; ``tile_allowed`` on failing verdicts; `stored_allowance`): they depend on
   the reference only, so any result of the case supplies them. The test fails exactly when the
   recorded signature is among the signatures found (without one: when any is found) and names
   every signature with the figures (error, allowed, worst tile);
5. skips with a reason when the package, a CUDA GPU or the GPU architecture is missing.

`load_export` / `export_target` read everything from the store: no oracle runs unless the caller
asks for it (``compute_missing``, the CLI, for results stored before allowances were); the web
endpoints never do. A variant whose stored results are only ``unsupported`` or passing is
refused without ``force`` (`misleading_reason`).

Safety: generated code contains only validated literals. The stored case is validated again
(`AttentionCase.from_json`), names and signatures must match strict patterns, and every value
goes into the file through `literal`, which accepts only ``None``, ``bool``, ``int``, finite
``float``, strings of a small alphabet and tuples/lists/dicts of those. Finally
`check_only_literals` parses the template (with placeholders in the value slots) and the rendered
file and requires identical syntax trees except at the slots, where only literals
(`ast.literal_eval`) may stand. A hostile value stored in the database therefore raises
`ExportError`; it never becomes code.

Modules, in the order a repro is made:

* `target`: which case, backend and variant to export, read from the store, and refusing what
  would mislead (only ``unsupported`` or passing results) without ``force``;
* `backend`: the adapter that writes the backend call (`resolve_backend`, `repro_call`);
* `allowance`: the allowed errors (stored, or computed with the oracle for old results);
* `repro`: rendering the pytest file (`render_repro`) from the fixed text in `template`;
* `safety`: the checks that only validated literals reach the file (`literal`, `fill_template`);
* `issue_report`: a bucket as a Markdown issue with its repro.
"""
