"""Acceptance of a node under full load (`nodewarden accept`): load runners, the sampler, judgement
(checks.accept), baseline and drift, the HTML picture. The entry point is agent.apps.accept.run.run_accept."""
