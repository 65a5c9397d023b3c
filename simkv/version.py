"""simkv's version, in a module of its own so that anything can read it without loading the library."""

__version__ = "0.1.0"
