"""Floor 7: what a user runs: the CLI, the daemon, the scheduler gate, acceptance, fleet reports."""
