"""The job lifecycle every reader and the stream consumer share: the v1 wire format (wire.py:
parse, validate, encode), events turned into metric updates (metrics.py), refused entries
(refusals.py), and the producer library queue apps emit with (producer.py).
"""
