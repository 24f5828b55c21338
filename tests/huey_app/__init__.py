"""A Huey application for the tests: its tasks on a RedisHuey or PriorityRedisHuey named by the
environment, a producer and truth driver (`python -m tests.huey_app.driver`), and the real
`huey_consumer` on `tests.huey_app.tasks.huey`."""
