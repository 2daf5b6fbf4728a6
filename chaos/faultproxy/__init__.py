"""A TCP fault proxy serving Toxiproxy 2.x's HTTP API (proxies and toxics), so toxiproxy clients drive it."""
