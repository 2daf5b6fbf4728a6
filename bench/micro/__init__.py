"""Micro-benchmarks of single components (codec, broker hot path, queue machine and apply, log storage, Raft
throughput, the Spark job). Unlike the rest of `bench`, which measures whole brokers from outside, these import our
own modules directly. Run one from the repository root as `.venv/bin/python -m bench.micro.<name> [--help]`;
figures and their history are in docs/benchmarks.md, docs/raft.md and docs/spark.md."""
