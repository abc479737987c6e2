"""NSQ command-line tools (spec §6)."""
