"""The version of zoo, in one place: read by the package and written into every saved file."""

__version__ = "0.3.0"
