"""The HTTP endpoint: /metrics, /healthz, /readyz, the status page, and the web config file."""
