"""A plugin module that fails at import (`tests.reliability.hostile`): ``--backend
tests.reliability.hostile_import:Backend`` must be one line naming the spec, not a traceback."""

raise RuntimeError("planted: this plugin cannot initialise its library")
