"""Importers: turn other tools' output into snapshots that the audit replays.

`nvidia_smi` builds a snapshot (meta.yaml + nvml.json) from an `nvidia-smi -q`
text or `nvidia-smi -q -x` XML dump, so a node that only left a support
bundle behind can still be audited.
"""
