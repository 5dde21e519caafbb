"""The daemon: its service loop, pollers and configuration."""
