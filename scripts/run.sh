#!/usr/bin/env bash
# Start the local NSQ: nsqlookupd (127.0.0.1:4160/4161), nsqd (127.0.0.1:4150/4151, data in
# ./data/nsqd) registered with it, and nsqadmin (http://127.0.0.1:4171/). Installs only what
# the servers need. Arguments: nsqd's flags; after --nsqlookupd, nsqlookupd's; after
# --nsqadmin, nsqadmin's (--nsqd switches back). Ctrl-C stops them all.
NSQPY_RUN_STARTED="$(date +%s.%N)"
export NSQPY_RUN_STARTED
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
sync_env broker
exec .venv/bin/python scripts/local_cluster.py "$@"
