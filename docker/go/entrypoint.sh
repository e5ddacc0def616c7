#!/bin/bash
# The server with the command's arguments. For the S3 server, the buckets in BUCKETS (space
# separated) exist first: with versitygw's posix backend a bucket is a directory of the data.
set -euo pipefail
for bucket in ${BUCKETS:-}; do
    mkdir -p "/data/$bucket"
done
exec /usr/local/bin/server "$@"
