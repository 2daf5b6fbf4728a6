"""Federation links between clusters: exchange federation (params, link, runner, manager) and queue federation
(queue_link, queue_runner; run by the same manager). docs/federation.md."""
