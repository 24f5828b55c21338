"""Prometheus recording and alerting rules for queue-exporter, generated from code."""
