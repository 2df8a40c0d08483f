"""`python -m annotated_transformer train|translate|evaluate|export|visualize|...`: see annotated_transformer.cli."""

from annotated_transformer.cli import main

if __name__ == "__main__":
    main()
