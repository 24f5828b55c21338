"""Redis plumbing every Redis reader shares: connections, pipelined round trips, a cluster's
shards, bounded reads of set members."""
