"""Everything one sandbox needs, decided once before anything is created: the plan, the hardened
body, the daemon's facts, the post-create verification."""
