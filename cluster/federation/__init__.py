"""Federation links (exchange and queue) between clusters."""
