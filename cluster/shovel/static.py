"""Static shovels: RabbitMQ's `shovels` config section (rabbitmq_shovel's `{shovels, [...]}`) as TOML tables in the
node's config file, turned into the dynamic shovel definition they mean.

Pure. `static_definition(name, table)` returns the JSON text of the equivalent dynamic definition (validated by
`parse_definition`, so the same rules and error texts apply) or raises `ShovelParamError`. The layout is
RabbitMQ's, in TOML:

    [shovels.my_shovel]
    ack_mode = "on_confirm"            # on_confirm (default), on_publish, no_ack
    reconnect_delay = 5                # seconds
    [shovels.my_shovel.source]
    uris = ["amqp://u:p@host-a"]       # tried in turn
    queue = "orders"
    prefetch_count = 1000
    delete_after = "never"             # never, queue-length or a number
    [shovels.my_shovel.destination]
    uris = ["amqps://u:p@host-b?cacertfile=/tls/ca.pem"]
    publish_fields = { exchange = "", routing_key = "orders" }
    publish_properties = { delivery_mode = 2 }
    add_forward_headers = true
    add_timestamp_header = false

`declarations` (RabbitMQ's list of AMQP methods run at connect) are refused: a missing source or destination
queue is declared by the shovel itself (`queue-args` below), exchanges must exist. raftmq's own extras:
`source.queue_args`, `source.consumer_args`, `destination.queue` and `destination.queue_args` (the dynamic keys).
Static shovels live in the vhost "/" of their status rows; unknown keys are refused.
"""

from __future__ import annotations

import json
from typing import Any

from cluster.shovel.params import ShovelParamError, parse_definition

SOURCE = {"protocol": "src-protocol", "uris": "src-uri", "queue": "src-queue", "prefetch_count": "src-prefetch-count",
          "delete_after": "src-delete-after", "queue_args": "src-queue-args", "consumer_args": "src-consumer-args"}
DESTINATION = {"protocol": "dest-protocol", "uris": "dest-uri", "queue": "dest-queue",
               "queue_args": "dest-queue-args", "publish_properties": "dest-publish-properties",
               "add_forward_headers": "dest-add-forward-headers",
               "add_timestamp_header": "dest-add-timestamp-header"}
ACK_MODES = {"on_confirm": "on-confirm", "on_publish": "on-publish", "no_ack": "no-ack"}


def _side(name: str, table: Any, which: str, keys: dict[str, str], value: dict[str, Any]) -> None:
    if not isinstance(table, dict):
        raise ShovelParamError(f"static shovel {name}: [{which}] must be a table")
    if "declarations" in table:
        raise ShovelParamError(f"static shovel {name}: {which}.declarations are not supported (a missing queue is "
                               f"declared by the shovel: {which}.queue_args)")
    unknown = set(table) - set(keys) - ({"publish_fields"} if which == "destination" else set())
    if unknown:
        raise ShovelParamError(f"static shovel {name}: unknown {which} keys {sorted(unknown)}")
    for key, dynamic in keys.items():
        if key in table:
            value[dynamic] = table[key]
    fields = table.get("publish_fields")
    if fields is not None:
        if not isinstance(fields, dict) or set(fields) - {"exchange", "routing_key"}:
            raise ShovelParamError(f"static shovel {name}: publish_fields takes exchange and routing_key")
        if "exchange" in fields:
            value["dest-exchange"] = fields["exchange"]
        if "routing_key" in fields:
            value["dest-exchange-key"] = fields["routing_key"]


def static_definition(name: str, table: Any) -> str:
    """The dynamic definition (JSON text) a `[shovels.<name>]` table means; ShovelParamError when it is invalid."""
    if not isinstance(table, dict):
        raise ShovelParamError(f"static shovel {name}: must be a table ([shovels.{name}])")
    unknown = set(table) - {"source", "destination", "ack_mode", "reconnect_delay"}
    if unknown:
        raise ShovelParamError(f"static shovel {name}: unknown keys {sorted(unknown)}")
    value: dict[str, Any] = {}
    for which, keys in (("source", SOURCE), ("destination", DESTINATION)):
        if which not in table:
            raise ShovelParamError(f"static shovel {name}: [shovels.{name}.{which}] is missing")
        _side(name, table[which], which, keys, value)
    if "ack_mode" in table:
        mode = table["ack_mode"]
        if mode not in ACK_MODES:
            raise ShovelParamError(f"static shovel {name}: ack_mode must be one of {sorted(ACK_MODES)}")
        value["ack-mode"] = ACK_MODES[mode]
    if "reconnect_delay" in table:
        value["reconnect-delay"] = table["reconnect_delay"]
    try:
        parse_definition("/", name, value)
    except ShovelParamError as exc:
        raise ShovelParamError(f"static shovel {name}: {exc}") from None
    return json.dumps(value, sort_keys=True)
