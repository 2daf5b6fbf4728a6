"""Raft group ids of queue declarations: "q/<vhost>/<name>" (escaped), with "/i<hex incarnation>" when not 0 and
"/g<hex generation>" when not 0 (the generation counts a queue's moves from a mirror log back to a Raft group:
cluster/metadata/mirror_convert.py, `ConvertToClassic`; each move starts a new Raft group under a new id).

Split out of `replicated_codec` (which re-exports these names); pure string work, no state.
"""

from __future__ import annotations

from typing import Final

GROUP_PREFIX: Final = "q/"
INCARNATION_SEPARATOR: Final = "/i"  # queue_group_id: "q/<vhost>/<name>/i<hex incarnation>"
GENERATION_SEPARATOR: Final = "/g"  # "q/<vhost>/<name>[/i<hex incarnation>]/g<hex generation>"
INCARNATION_LIMIT: Final = 2**64  # incarnations are 63-bit (node/runtime/cluster_tracking.incarnation_of_cid)


def _escape(part: str) -> str:
    return part.replace("%", "%25").replace("/", "%2F")


def _unescape(part: str) -> str:
    return part.replace("%2F", "/").replace("%2f", "/").replace("%25", "%")


def queue_group_id(vhost: str, name: str, incarnation: int = 0, generation: int = 0) -> str:
    """The Raft group id of a queue declaration: "q/<vhost>/<name>" with "%" and "/" percent-escaped in both parts,
    then, for an incarnation other than 0, "/i" + the incarnation in lowercase hex (no leading zeros). An escaped part
    never holds "/", so the suffix cannot collide with a name; incarnation 0 (queues declared before incarnations)
    keeps the original two-part form, so their stored groups open unchanged."""
    group = GROUP_PREFIX + _escape(vhost) + "/" + _escape(name)
    if incarnation:
        if not 0 < incarnation < INCARNATION_LIMIT:
            raise ValueError(f"queue incarnation out of range: {incarnation}")
        group += INCARNATION_SEPARATOR + format(incarnation, "x")
    if generation:
        if not 0 < generation < INCARNATION_LIMIT:
            raise ValueError(f"queue generation out of range: {generation}")
        group += GENERATION_SEPARATOR + format(generation, "x")
    return group


def parse_queue_group_id(group_id: str) -> tuple[str, str, int]:
    """Inverse of `queue_group_id`: (vhost, name, incarnation), the generation left out. Raises ValueError if
    `group_id` is not a canonical queue group id."""
    if not group_id.startswith(GROUP_PREFIX):
        raise ValueError(f"not a queue group id: {group_id!r}")
    parts = group_id[len(GROUP_PREFIX) :].split("/")
    incarnation = generation = 0
    if len(parts) >= 3 and parts[-1].startswith(GENERATION_SEPARATOR[1:]):
        try:
            generation = int(parts.pop()[1:], 16)
        except ValueError:
            raise ValueError(f"not a queue group id: {group_id!r}") from None
    if len(parts) == 3 and parts[2].startswith(INCARNATION_SEPARATOR[1:]):
        try:
            incarnation = int(parts.pop()[1:], 16)
        except ValueError:
            raise ValueError(f"not a queue group id: {group_id!r}") from None
    if len(parts) != 2 or not 0 <= incarnation < INCARNATION_LIMIT or not 0 <= generation < INCARNATION_LIMIT:
        raise ValueError(f"not a queue group id: {group_id!r}")
    vhost, name = (_unescape(part) for part in parts)
    if queue_group_id(vhost, name, incarnation, generation) != group_id:
        raise ValueError(f"not a canonical queue group id: {group_id!r}")
    return vhost, name, incarnation
