"""One module per command group that does not live in agent.cli."""
