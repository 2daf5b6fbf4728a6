"""Links to other brokers: the AMQP 0-9-1 client (trio around node/amqp/client.py) and URI parsing, used by shovels
and, next, federation."""
