"""nodewarden: audit, tune and watch GPU servers."""

__version__ = "0.1.0"
