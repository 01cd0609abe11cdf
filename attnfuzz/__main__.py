"""``python -m attnfuzz``: the ``attnfuzz`` command line (`service.cli.main`)."""

from attnfuzz.cli import main

if __name__ == "__main__":
    main()
