"""Test tools: hypothesis strategies, the checked mode, the pytest plugin, and processes of their own
(scenario.py)."""
