"""Floor 3 (beside state): configuration, profiles, matching a node to its profile, waivers."""
