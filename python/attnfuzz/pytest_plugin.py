"""pytest plug-in: the `attnfuzz` fixture (pytest_plugins = ["attnfuzz.pytest_plugin"]).

    def test_my_attention(attnfuzz):
        attnfuzz.check(my_attention, masks=["none", "causal-br"], fuzz_seconds=20)

Options: --attnfuzz-fuzz-seconds N overrides fuzz_seconds for every check (0 = sweep only).
"""

import pytest

from attnfuzz.testing import check_attention


def pytest_addoption(parser):
    parser.addoption("--attnfuzz-fuzz-seconds", type=float, default=None,
                     help="attn-fuzz seconds per attnfuzz.check (default: what each test asks)")


class _AttnFuzz:
    def __init__(self, tmp_path, config):
        self._tmp, self._config, self._n = tmp_path, config, 0

    def check(self, fn=None, **kw):
        override = self._config.getoption("--attnfuzz-fuzz-seconds")
        if override is not None:
            kw["fuzz_seconds"] = override
        self._n += 1
        kw.setdefault("out_dir", self._tmp / f"attnfuzz-{self._n}")
        failure = None
        try:
            return check_attention(fn, **kw)
        except AssertionError as e:
            failure = str(e)
        pytest.fail(failure, pytrace=False)  # outside the except: no chained traceback


@pytest.fixture
def attnfuzz(tmp_path, request):
    """Checks attention callables with attn-check --sweep and a short attn-fuzz campaign."""
    return _AttnFuzz(tmp_path, request.config)
