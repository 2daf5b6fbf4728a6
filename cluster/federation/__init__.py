"""Federation links between clusters: exchange federation (params, link machine, runner, manager; docs/federation.md).
Queue federation is not built yet."""
