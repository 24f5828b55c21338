"""A SAQ application for the tests: its job functions, a producer and truth driver
(`python -m tests.saq_app.driver`) and a real SAQ Worker (`python -m tests.saq_app.worker`),
on $REDIS_URL."""
