"""nsqlookupd: the discovery service (spec §4)."""
