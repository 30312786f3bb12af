"""Small helpers every layer shares: atomic writes, sizes and their units,
human-readable numbers, progress bars. Pure Python, no model."""
