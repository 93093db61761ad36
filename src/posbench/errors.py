"""The one exception type that the CLI turns into a one-line message and exit code 2."""


class PosbenchError(Exception):
    """A user-facing problem: bad input, missing data, unusable checkpoint."""
