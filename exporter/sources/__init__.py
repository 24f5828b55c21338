"""Sources: each reads one kind of backend on its own interval and returns what it saw.

source.py is the protocol every source meets; runner.py runs each on its interval, with its
deadline (watchdog.py) and its failures handled in one place (outage.py, backoff.py).
redis_keys/, postgres/ and streams/ are the source kinds; readers/ holds every reader of a
queue system's own records.
"""
