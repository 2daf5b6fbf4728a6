"""PySpark job computing replication lag from the nodes' replication telemetry files."""
