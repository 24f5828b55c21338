"""Job lifecycle events: the v1 wire format, a producer library, the consumer-group reader.

wire (parse/validate/encode, the one implementation), producer (sync and asyncio emitters),
consumer (XREADGROUP/XACK/XAUTOCLAIM), metrics (event -> metric updates), runnerq (Runner-Q's
native stream), config (the `sources.events` section).
"""
