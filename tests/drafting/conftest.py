import pytest

from .implementations import NAMES, require


@pytest.fixture(params=NAMES)
def implementation(request) -> str:
    """Each drafter implementation: pure Python (the specification) and the C modules."""
    return require(request.param)
