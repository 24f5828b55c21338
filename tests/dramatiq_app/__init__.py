"""A Dramatiq application for the tests: its broker, actors and a middleware that writes what
the library tells it (enqueued, started, ended, dead-lettered) as JSON lines, a producer and
truth driver, and a worker run with Dramatiq's own Worker.

The tests talk to Dramatiq only through `python -m tests.dramatiq_app.driver` and
`python -m tests.dramatiq_app.worker` (REDIS_URL and DRAMATIQ_EVENTS in the environment).
"""
