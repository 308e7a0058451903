# conftest.py - the attnfuzz fixture for the planted-bug pytest example (run by tests/adapters).
pytest_plugins = ["attnfuzz.pytest_plugin"]
