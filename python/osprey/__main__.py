"""`python -m osprey ...` runs the osprey command line (the same as the `osprey` binary)."""
import sys

from . import _osprey


def main() -> int:
    return _osprey.cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
