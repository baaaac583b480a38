"""``python -m pytest_ptn``: the command line, pytest_ptn.cli.main."""

import sys

from pytest_ptn.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
