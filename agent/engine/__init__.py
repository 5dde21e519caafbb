"""Floor 6: the audit and remediation pipelines (above sources, report, checks and remediations)."""
