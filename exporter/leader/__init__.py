"""Leader election: one replica samples at a time, under a Redis lease (election.py), and its
light settings model (config.py)."""
