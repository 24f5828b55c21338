"""Lifecycle event streams: the consumer-group reader (consumer.py), where the group stands
(group_position.py) and the `sources.events` settings (config.py)."""
