"""The metadata store's errors (shared by `store` and `store_membership`; all re-exported by `store`)."""

from __future__ import annotations


class MetadataError(Exception):
    """A metadata command failed for a reason a retry will not fix."""


class MetadataTimeout(MetadataError):
    """No result within the timeout: the command may or may not have been applied; retrying it is safe."""


class IncompatibleVersionError(MetadataError):
    """The cluster refused this node's metadata protocol version."""


class JoinRefused(MetadataError):
    """The member asked refused the join (another protocol version, a taken name): nothing changed."""


class LeftClusterError(MetadataError):
    """This node left its cluster (`leave_cluster`): its data directory must be reset before it starts again."""
