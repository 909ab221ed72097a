"""fedbug's version (one place; the package root and run summaries read it)."""

__version__ = "0.1.0"
