"""Floor 1: plain types, facts, comparators and hardware knowledge. Standard library only, no I/O."""
