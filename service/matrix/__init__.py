"""The build matrix in the service: builds, packages, replays, history, regressions, bisections and corpus import/export (queries, schemas, routes, CLI)."""
