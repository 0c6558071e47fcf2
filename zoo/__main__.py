"""``python -m zoo``: the ``zoo`` command (:mod:`zoo.cli`)."""

from zoo.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
