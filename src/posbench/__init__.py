"""posbench: positional encodings for length extrapolation, and the experiment runner that compares them."""

__version__ = "0.1.0"
