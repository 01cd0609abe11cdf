"""The ``attnfuzz`` command line (typer): `service.cli.main.main` holds the app and the fuzz/serve/db commands."""
