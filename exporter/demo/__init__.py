"""`queue-exporter demo`: the whole product live in one command.

embedded.py starts throwaway Redis and PostgreSQL servers from PyPI packages, layouts.py and
attune_db.py write the seed systems' data exactly as they write it, the sim_* modules run a
synthetic workload of each system, workload.py drives them, command.py is the CLI command.
"""
