"""Hypothesis profiles: "tensat" (the regular, deterministic run) and "long" (nightly: more, fresh examples).

`pytest` loads "tensat"; `pytest --hypothesis-profile=long` loads the nightly one (hypothesis' own pytest plugin
handles that option). Tests without their own `max_examples` get the profile's (100, nightly 1000); the property
tests of tests/pipeline/test_properties.py scale theirs from it (60 random graphs, nightly 600). The regular
profile is derandomized and keeps no example database, so CI runs the same examples every time.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

_COMMON = dict(
    deadline=None,  # one example runs egglog, an extractor and onnxruntime: timings on a shared machine vary a lot
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

settings.register_profile("tensat", max_examples=100, derandomize=True, database=None, **_COMMON)
settings.register_profile("long", max_examples=1000, derandomize=False, **_COMMON)


def pytest_configure(config: pytest.Config) -> None:
    """Load the regular profile unless `--hypothesis-profile` chose one."""
    if not config.getoption("hypothesis_profile", default=None):
        settings.load_profile("tensat")
