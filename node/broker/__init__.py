"""Pure broker model: vhosts, users, exchanges, bindings, routing, consumers and QoS. No I/O."""
