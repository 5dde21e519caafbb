"""Fleet compliance: many audit reports (or Prometheus) -> one summary.

Reading is the expensive part (about 5 GB of JSON at 100,000 nodes), so each
report is parsed and reduced to a `NodeRecord` in a worker process, and only
the records travel back. The parent folds each one in as it arrives
(`FleetReader`): a compact record per node, its repeated strings and tuples
shared (`Interner`), well under 5 KiB a node (issue #16); the fleet-wide
figures are derived from the records at the end (`build_report`) and the
renderers stream their output. A file that is corrupt, truncated, foreign,
of another schema or holding values no report holds is skipped with a
warning that the report lists; it never stops the report. A node that
reported more than once counts once: its newest report wins and the
duplicate is noted. A node's `nodewarden accept` JSON report among the inputs (the audit schema with an
`acceptance` block) is not an audit: it is kept apart, the newest per node, and paired with the node's
audit by name (`acceptance`).

The parts: `records` (one report -> `NodeSummary` -> `NodeRecord`, the `Interner`), `acceptance`
(one accept report -> `AcceptRecord`, each node's acceptance as shown), `reading` (files -> records, in
worker processes), `figures` (records -> the fleet summary), `render` (with `charts`, `heatmap`) and
`prometheus`. Every public name is importable from `agent.apps.fleet` too.
"""

from agent.apps.fleet.acceptance import AcceptRecord, is_acceptance, summarize_acceptance
from agent.apps.fleet.figures import FLEET_SCHEMA, FleetOptions, NodeRows, build_fleet, build_report
from agent.apps.fleet.reading import (
    MAX_DEPTH,
    MAX_FILE_BYTES,
    FleetReader,
    Result,
    input_files,
    newest_per_node,
    progress_bar,
    read_into,
    read_reports,
)
from agent.apps.fleet.records import (
    BASELINE_CHECK,
    FIRMWARE_CHECKS,
    REPORT_SCHEMA,
    FindingRow,
    FleetInputError,
    Interner,
    NodeRecord,
    NodeSummary,
    Skipped,
    iter_rows,
    summarize_report,
)

__all__ = [
    "BASELINE_CHECK",
    "FIRMWARE_CHECKS",
    "FLEET_SCHEMA",
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "REPORT_SCHEMA",
    "AcceptRecord",
    "FindingRow",
    "FleetInputError",
    "FleetOptions",
    "FleetReader",
    "Interner",
    "NodeRecord",
    "NodeRows",
    "NodeSummary",
    "Result",
    "Skipped",
    "build_fleet",
    "build_report",
    "input_files",
    "is_acceptance",
    "iter_rows",
    "newest_per_node",
    "progress_bar",
    "read_into",
    "read_reports",
    "summarize_acceptance",
    "summarize_report",
]
