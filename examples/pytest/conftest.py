# conftest.py - enables the attnfuzz fixture (python/attnfuzz/pytest_plugin.py) for these tests.
pytest_plugins = ["attnfuzz.pytest_plugin"]
