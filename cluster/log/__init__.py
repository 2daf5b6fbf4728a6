"""Log storage: append-only segments with indexes and a shared write-ahead log with group commit.

Public API: ``NodeLog.open(directory, LogConfig())`` and the errors below; see ``node_log.py``.
"""

from __future__ import annotations

from cluster.log.node_log import LogBrokenError, LogConfig, NodeLog
from cluster.log.segment import DiskFullError

__all__ = ["DiskFullError", "LogBrokenError", "LogConfig", "NodeLog"]
