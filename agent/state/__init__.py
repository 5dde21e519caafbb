"""Floor 3 (beside policy): the owner of the state folder (the change journal)."""
