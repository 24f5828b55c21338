"""Lifecycle event streams: the consumer-group reader (consumer.py), where the group stands
(group_position.py), the formats and their decoders (formats.py), the `sources.events`
settings (config.py), and what check-config and redis-acl ask of them (probe.py, acl.py)."""
