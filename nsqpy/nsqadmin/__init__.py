"""nsqadmin: the web UI (spec §5)."""
