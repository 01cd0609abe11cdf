"""One wheel build of this tree at a time, across the suite's xdist processes.

setuptools builds in the tree's own ``build/`` directory; two builds at once (``tests/test_packaging.py``
and ``tests/test_packaging_lowest.py`` run on different processes under ``--dist loadfile``) removed each
other's files: "No such file or directory: 'build/bdist.linux-x86_64/wheel/attnfuzz-0.1.0.dist-info/WHEEL'"
(a loaded 2-core machine, 2026-12-03).
"""

from __future__ import annotations

import fcntl
import hashlib
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def tree_build_lock(root: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on a lock file (in the temporary directory, named after
    ``root``'s path) for the block's length: other processes building ``root`` wait."""
    name = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"attnfuzz-build-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
