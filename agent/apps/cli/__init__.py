"""The click CLI: `main` (the group and `audit`), one module per command group."""
