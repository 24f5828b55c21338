"""The command line (cli.py) and the commands that are not `serve`: check-config
(check_config.py), redis-acl, emit."""
