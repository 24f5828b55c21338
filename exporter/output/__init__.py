"""What the exporter serves: the metric catalog, the one store, Prometheus and OpenMetrics text,
OTLP, the exporter's own instruments and each source's health."""
