"""An arq application for the tests: its jobs and worker settings, and a driver.

arq pins redis-py below 6, so it lives in a venv of its own (scripts/setup.sh makes
.venv/tools/arq); the tests talk to it only through `python -m tests.arq_app.driver` and the
`arq` command under that venv's Python, so producers, workers and the truth (arq's own
Job.status() and queued_jobs()) all come from arq itself.
"""
