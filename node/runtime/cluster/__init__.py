"""The trio half of cluster mode: `ClusterRuntime` (runtime.py) glues the metadata store, the queue Raft groups and
the broker, with its proposal path in proposing.py and its membership and liveness tasks in liveness.py (mixins);
members.py joins, leaves and replaces members; view.py answers the management API for the cluster;
incarnation_file.py records the queue groups this node hosts. The decisions they act on are pure and live in
node/clustering."""
