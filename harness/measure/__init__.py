"""Measurement: timing, memory readings, profiles, the host-overhead breakdown, start-up runs and
provenance."""
