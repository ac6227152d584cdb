"""`python -m dpsynth.cli.retriever`: the same as the `retriever` console script."""

from dpsynth.cli.retriever import main

if __name__ == "__main__":
    main()
