#!/usr/bin/env bash
# Start the local NSQ: nsqlookupd (4160/4161), nsqd (4150/4151, data in ./data/nsqd) registered
# with it, and nsqadmin (http://127.0.0.1:4171/). Ctrl-C stops them all.
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
exec "${UV[@]}" run --frozen python scripts/local_cluster.py "$@"
