"""The PostgreSQL source: SQL collectors (collectors.py) on their own intervals over one pool
(source.py), and the settings of both and of the finished-rows reader (config.py,
finished_config.py)."""
