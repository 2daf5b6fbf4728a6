"""`raftmq bench`: throughput and latency of raftmq measured side by side with RabbitMQ (issue 7)."""
