"""The build-matrix wing: per-build environments (wheels, manifests, fingerprints), what is installed here, corpus files, replay, regressions and bisection."""
