"""Throughput benchmark of the receive path against two floors (`make bench`).

Run it with ``python -m tests.bench.run``; nothing here is collected by pytest.
"""
