"""Sources read raw data from a live node or from a recorded snapshot.

Each source has a live and a recorded implementation behind one small
interface; the parsers above them are shared, so real vendor data exercises
the same code the live agent runs.
"""
