"""`python -m dpsynth.cli.synthgen`: the same as the `synthgen` console script."""

from dpsynth.cli.synthgen import main

if __name__ == "__main__":
    main()
