"""The trio runtime: listeners, connections, timers and disk threads. The only trio in node/."""
