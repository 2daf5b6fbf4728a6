"""The real-process runtime of mirrored queues: a replica's files, the fetch transport, the replica process."""
