"""The ``attnfuzz`` command line (typer): `service.cli.main` holds the app and lists the commands, one module each."""
