"""A run directory: what a launch may do with it, its one owner, its checkpoints."""
