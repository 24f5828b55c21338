"""An RQ application for the tests: its jobs, and a driver run by each RQ version's Python.

The tests talk to RQ only through `python -m tests.rq_app.driver` under the Python of the
RQ version being tested (RQ 1.x, 2.x and 3.x cannot share one environment), so producers,
workers and the truth (RQ's own Queue and registries) all come from that version.
"""
