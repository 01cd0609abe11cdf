"""Package layout that pyproject.toml cannot state on its own: the repository's ``alembic/``
directory (the migrations; it must stay a plain directory, never a package named ``alembic``,
which would shadow the Alembic library) is installed as ``attnfuzz.migrations``, so a wheel
carries the migrations and `service.db.migrations` finds them after a non-editable install.
Everything else (package data included) is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["oracle*", "fuzzer*", "service*", "attnfuzz*"])
    + ["attnfuzz.migrations", "attnfuzz.migrations.versions"],
    package_dir={"attnfuzz.migrations": "alembic"},
)
