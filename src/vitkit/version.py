"""vitkit's version: one place, read by the package, the CLI and the files vitkit writes."""

__version__ = "0.1.0"
