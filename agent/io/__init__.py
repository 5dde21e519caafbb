"""Floor 2: every byte in or out: bounded readers, the one writer, trusted input, YAML/JSON/schema, logs,
secrets, bounded subprocesses, the metrics exposition server."""
