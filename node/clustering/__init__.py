"""The pure half of cluster mode: what a node decides, with no I/O, clocks or trio (time comes in as now_ms).

definitions.py bridges broker records and the cluster metadata (mirroring and commands); proposals.py tracks the
queue commands this node proposed and its peers' liveness (entries are framed by cluster/queue/envelope.py);
incarnations.py holds the rules for queues deleted and declared again; reconcile.py decides membership and leader
moves. The trio runtime that acts on them is node/runtime/cluster.
"""
