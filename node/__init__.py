"""raftmq node: the single-broker process (protocol, broker model, trio runtime)."""
