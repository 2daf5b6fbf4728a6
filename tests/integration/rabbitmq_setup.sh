#!/usr/bin/env bash
# Create on a RabbitMQ node the users and vhosts the integration suite expects (see nodeproc.py), then run e.g.
#   RAFTMQ_TEST_TARGET=127.0.0.1:35672 RAFTMQ_TEST_RABBITMQCTL="rabbitmqctl -n raftmq_it@localhost" \
#       .venv/bin/pytest tests/integration
# Usage: rabbitmq_setup.sh "rabbitmqctl -n NODE"
set -euo pipefail
ctl=${1:-rabbitmqctl}
$ctl add_user it-limited it-limited-pw || true
$ctl set_permissions -p / it-limited '^it-limited-.*' '^it-limited-.*' '.*'
$ctl add_vhost it-private || true
$ctl add_user it-private-owner it-private-pw || true
$ctl set_permissions -p it-private it-private-owner '.*' '.*' '.*'
