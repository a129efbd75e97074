"""Non-Python real clients for the integration tests (see runner.py)."""
