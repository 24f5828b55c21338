"""The job lifecycle every reader and the stream consumer share: the v1 wire format (wire.py:
parse, validate, encode), events turned into metric updates (metrics.py), refused entries
(refusals.py), the producer library queue apps emit with (producer.py), and RQ's failures
read as error types (rq_failures.py).
"""
