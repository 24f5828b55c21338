"""Grafana dashboards for queue-exporter, built with grafana-foundation-sdk."""
