"""`python -m retriever.cli`: the same as the `retriever` console script."""

from retriever.cli import main

if __name__ == "__main__":
    main()
