"""Pure AMQP 0-9-1 protocol: framer, codec and the connection/channel state machines. No I/O."""
