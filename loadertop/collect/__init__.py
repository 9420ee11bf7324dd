"""Sources beyond one tick of the local sampler: the fleet's figures, read from the Prometheus
that scrapes every node's agent (`fleet_figures`)."""
