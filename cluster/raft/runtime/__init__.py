"""The runtime side of cluster/raft: wire codec, trio TCP transport, storage on cluster/log's NodeLog, node driver."""
