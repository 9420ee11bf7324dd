"""What the monitor gives out, each from the same snapshots: the JSON report and its Markdown
and HTML renderings, recordings (written, and read back for replay), and the Prometheus exporter."""
