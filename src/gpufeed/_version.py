"""The package version (its own module: every layer may import it without importing the package root)."""

__version__ = "0.1.0"

__all__ = ["__version__"]
