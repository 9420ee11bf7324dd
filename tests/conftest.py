import pytest
from jobs import Job


@pytest.fixture
def job(tmp_path):
    """Start real training jobs; every one is killed when the test ends, pass or fail."""
    started = []

    def start(*args, **kw):
        j = Job(*args, tmp=tmp_path, **kw)
        started.append(j)
        return j

    yield start
    for j in started:
        j.kill()
