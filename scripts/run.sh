#!/usr/bin/env bash
# Start the local NSQ: nsqd on its default ports (TCP 4150, HTTP 4151), data in ./data.
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
mkdir -p data/nsqd
exec "${UV[@]}" run --frozen nsqd --data-path=data/nsqd "$@"
