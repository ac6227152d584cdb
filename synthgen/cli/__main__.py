"""`python -m synthgen.cli`: the same as the `synthgen` console script."""

from synthgen.cli import main

if __name__ == "__main__":
    main()
