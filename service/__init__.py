"""The storage, web service and command line of attnfuzz.

``__version__``: the installed distribution's version (``importlib.metadata``), or
``"0+unknown"`` in a source tree never installed (the same value as ``attnfuzz.__version__``,
which service may not import: it is the layer above).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("attnfuzz")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0+unknown"
