"""korch's version: one place, read by the package, the executable's manifest and the launch module."""

__version__ = "0.1.0"
