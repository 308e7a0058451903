"""Fake jax package level (tests/python/fake_jax)."""
